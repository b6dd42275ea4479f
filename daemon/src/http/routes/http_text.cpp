#include <cctype>

#include <fmt/format.h>

#include "http/routes/call.hpp"
#include "joule/common/text.hpp"

// HTTP and JSON details every route shares, and the one mapping from errors to problem+json.

namespace joule::daemon {

namespace http = boost::beast::http;
using nlohmann::json;

namespace {

struct ProblemKind {
  http::status status;
  const char* slug;
};

ProblemKind kind_of(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument:
      return {http::status::bad_request, "invalid-argument"};
    case ErrorCode::not_found:
      return {http::status::not_found, "not-found"};
    case ErrorCode::conflict:
      return {http::status::conflict, "conflict"};
    case ErrorCode::too_many:
      return {http::status::too_many_requests, "too-many-jobs"};
    case ErrorCode::payload_too_large:
      return {http::status::payload_too_large, "payload-too-large"};
    case ErrorCode::unauthorized:
      return {http::status::unauthorized, "unauthorized"};
    case ErrorCode::unavailable:
      return {http::status::service_unavailable, "unavailable"};
    case ErrorCode::permission_denied:
      return {http::status::forbidden, "permission-denied"};
    case ErrorCode::io:
      return {http::status::internal_server_error, "io-error"};
    case ErrorCode::internal:
      return {http::status::internal_server_error, "internal"};
  }
  return {http::status::internal_server_error, "internal"};
}

// The request target as the routes may use it: RFC 9112 allows only visible ASCII there, and
// a percent-encoded segment or query value must decode to UTF-8 without control characters.
// Nothing past this point sees bytes it could choke on or forge log lines with.
std::optional<Error> check_target(std::string_view target) {
  if (target.empty() || target.front() != '/')
    return make_error(ErrorCode::invalid_argument, "the request target must be an absolute path such as /v1/jobs");
  for (const char c : target) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte <= 0x20 || byte >= 0x7F) {
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("the request target holds the byte 0x{:02x}; percent-encode it", byte));
    }
  }
  return std::nullopt;
}

std::optional<Error> check_decoded(const std::string& text, std::string_view what) {
  if (!is_valid_utf8(text) || has_control_character(text)) {
    return make_error(
        ErrorCode::invalid_argument,
        fmt::format("the {} \"{}\" is not UTF-8 text without control characters", what, printable(text, 200)));
  }
  return std::nullopt;
}

std::string percent_decode(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(text[i] == '+' ? ' ' : text[i]);
    }
  }
  return out;
}

// Splits "/v1/jobs/abc/log?x=1" into path segments and query parameters, decoded.
routes::Target split_target(std::string_view target) {
  routes::Target out;
  const auto question = target.find('?');
  const std::string_view path = target.substr(0, question);
  std::size_t start = 0;
  while (start < path.size()) {
    const auto slash = path.find('/', start);
    const auto piece = path.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (!piece.empty()) out.segments.push_back(percent_decode(piece));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  if (question != std::string_view::npos) {
    std::string_view query = target.substr(question + 1);
    while (!query.empty()) {
      const auto amp = query.find('&');
      const auto pair = query.substr(0, amp);
      const auto eq = pair.find('=');
      out.query[percent_decode(pair.substr(0, eq))] =
          eq == std::string_view::npos ? "" : percent_decode(pair.substr(eq + 1));
      if (amp == std::string_view::npos) break;
      query = query.substr(amp + 1);
    }
  }
  return out;
}

}  // namespace

namespace routes {

// Every JSON answer goes out through here. Text from the request (a target, an id, a parser's
// message quoting the bad bytes) can hold bytes that are not UTF-8, on which a plain dump()
// throws; they are replaced with U+FFFD instead.
std::string json_text(const json& body) { return body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

HttpResponse json_response(http::status status, const json& body) { return json_response(status, json_text(body)); }

HttpResponse json_response(http::status status, std::string text) {
  HttpResponse response{status, 11};
  response.set(http::field::content_type,
               static_cast<unsigned>(status) >= 400 ? "application/problem+json" : "application/json");
  if (text.empty() || text.back() != '\n') text.push_back('\n');
  response.body() = std::move(text);
  return response;
}

// A request body as JSON. nlohmann throws parse_error for bad syntax and ill-formed UTF-8 and
// out_of_range for numbers beyond a double (1e400); both are the client's mistake. The
// message quotes the offending bytes only in escaped form.
Result<json> parse_json_body(const std::string& body) {
  // nlohmann stops at a NUL byte and would accept what precedes it, ignoring the rest.
  if (const auto nul = body.find('\0'); nul != std::string::npos)
    return make_error(ErrorCode::invalid_argument, fmt::format("the body holds a NUL byte at offset {}", nul));
  try {
    return json::parse(body);
  } catch (const json::parse_error& error) {
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("malformed JSON at byte {}: {}", error.byte, printable(error.what(), 300)));
  } catch (const json::exception& error) {
    return make_error(ErrorCode::invalid_argument, fmt::format("unusable JSON: {}", printable(error.what(), 300)));
  }
}

// RFC 3986 percent-encoding of everything but the unreserved characters, for query values.
std::string percent_encode(std::string_view text) {
  std::string out;
  for (const unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~')
      out += static_cast<char>(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

std::optional<std::size_t> parse_count(const std::string& text) {
  if (text.empty() || text.size() > 12 || text.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return static_cast<std::size_t>(std::stoull(text));
}

Result<std::size_t> page_limit(const std::optional<std::string>& text, std::size_t most) {
  if (!text) return most;
  const auto count = parse_count(*text);
  if (!count || *count == 0 || *count > most)
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("limit must be an integer from 1 to {}; list further pages with "
                                  "after=<the previous page's \"next\">",
                                  most),
                      "limit");
  return *count;
}

// The token of "Authorization: Bearer TOKEN", or "" when there is none.
std::string bearer_token(const HttpRequest& request) {
  const auto header = request[http::field::authorization];
  constexpr std::string_view kBearer = "Bearer ";
  if (header.size() <= kBearer.size() || header.substr(0, kBearer.size()) != kBearer) return {};
  return std::string(header.substr(kBearer.size()));
}

Result<Target> parse_target(std::string_view target) {
  if (auto error = check_target(target)) return *error;
  Target parsed = split_target(target);
  for (const auto& segment : parsed.segments) {
    if (auto error = check_decoded(segment, "path segment")) return *error;
  }
  for (const auto& [name, value] : parsed.query) {
    if (auto error = check_decoded(name, "query parameter name")) return *error;
    if (auto error = check_decoded(value, "query value")) return *error;
  }
  return parsed;
}

}  // namespace routes

HttpResponse problem_response(const Error& error, const std::string& instance) {
  const auto kind = kind_of(error.code);
  json body = {{"type", fmt::format("urn:joule:problem:{}", kind.slug)},
               {"title", std::string(http::obsolete_reason(kind.status))},
               {"status", static_cast<unsigned>(kind.status)},
               {"detail", error.message},
               {"instance", instance}};
  if (!error.where.empty()) {
    // RFC 9457 §3.2 style extension: which member of the request is wrong, as a JSON pointer.
    const bool pointer = error.where.front() == '/';
    body["errors"] = json::array({{{"detail", error.message}, {pointer ? "pointer" : "parameter", error.where}}});
  }
  if (!error.extensions.empty()) {
    const json extensions = json::parse(error.extensions, nullptr, false);
    if (extensions.is_object())
      for (const auto& [key, value] : extensions.items())
        if (!body.contains(key)) body[key] = value;  // never replaces the problem's own members
  }
  HttpResponse response{kind.status, 11};
  response.set(http::field::content_type, "application/problem+json");
  if (error.code == ErrorCode::too_many) response.set(http::field::retry_after, "10");
  if (error.code == ErrorCode::unauthorized) response.set(http::field::www_authenticate, "Bearer realm=\"jouled\"");
  response.body() = routes::json_text(body);
  return response;
}

}  // namespace joule::daemon
