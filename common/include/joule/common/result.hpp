#pragma once
// Result<T>: the value of an operation on a running path, or the reason it failed.
// GCC 12 has no std::expected; exceptions never cross an Asio handler, so running paths
// (meter reads, storage writes, request handling) return one of these instead.

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace joule {

/// What kind of failure, chosen so that one function maps it to HTTP (`kind_of` in
/// daemon/src/http/routes/http_text.cpp).
enum class ErrorCode {
  invalid_argument,   ///< the caller sent something wrong (400)
  not_found,          ///< no such thing (404)
  conflict,           ///< the thing is in a state that forbids this (409)
  too_many,           ///< a limit on queued work was reached (429)
  payload_too_large,  ///< a body over the configured limit (413)
  unauthorized,       ///< missing or wrong credentials (401)
  unavailable,        ///< a resource is missing or not ready: a meter file, the store (503)
  permission_denied,  ///< the OS refused access (EACCES on a meter file, ...)
  io,                 ///< a read or write failed
  internal,           ///< a bug or broken invariant (500)
};

/// A failure: a code, a one-line human message and, where it applies, where the problem is
/// (a JSON pointer such as "/run/command/0", or "file:line" for config files).
struct Error {
  ErrorCode code = ErrorCode::internal;
  std::string message;
  std::string where;
  /// Facts a program needs beyond the message, as the text of a JSON object whose members an
  /// HTTP problem adds (RFC 9457 extension members: a quota's name, limit and use); empty: none.
  std::string extensions;
};

inline Error make_error(ErrorCode code, std::string message, std::string where = {}) {
  return Error{code, std::move(message), std::move(where), {}};
}

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : state_(std::move(error)) {}  // NOLINT: implicit by design

  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(state_); }
  const T& value() const& { return std::get<0>(state_); }
  T&& value() && { return std::get<0>(std::move(state_)); }
  const Error& error() const { return std::get<1>(state_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Error> state_;
};

/// Success without a value, or the reason for failure.
template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)) {}  // NOLINT: implicit by design

  bool ok() const { return !error_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Error& error() const { return *error_; }

 private:
  std::optional<Error> error_;
};

using Status = Result<void>;

}  // namespace joule
