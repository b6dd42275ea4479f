#include "joule/adapters/sysfs.hpp"

#include "joule/common/text.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include <fmt/format.h>

namespace joule::adapters {

namespace {

Error os_error(int err, const std::filesystem::path& path) {
  ErrorCode code = ErrorCode::io;
  if (err == EACCES || err == EPERM) code = ErrorCode::permission_denied;
  if (err == ENOENT || err == ENODEV || err == ENXIO || err == ENOTDIR) code = ErrorCode::unavailable;
  return make_error(code, fmt::format("{}: {}", path.string(), std::strerror(err)));
}

template <class T>
Result<T> parse_integer(std::string_view text, const std::filesystem::path& path) {
  const std::string_view digits = trim(text);
  if (digits.empty()) return make_error(ErrorCode::io, fmt::format("{}: empty", path.string()));
  T value{};
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc{} || end != digits.data() + digits.size())
    return make_error(ErrorCode::io, fmt::format("{}: not an integer: \"{}\"", path.string(), digits));
  return value;
}

}  // namespace

Result<std::string> read_sysfs_file(const std::filesystem::path& path) {
  // open/read rather than ifstream: errno is reliable, and sysfs files are read in one call.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return os_error(errno, path);
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return os_error(err, path);
    }
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

std::string_view trim(std::string_view text) { return joule::trim(text); }

Result<std::uint64_t> parse_unsigned(std::string_view text, const std::filesystem::path& path) {
  return parse_integer<std::uint64_t>(text, path);
}

Result<std::int64_t> parse_signed(std::string_view text, const std::filesystem::path& path) {
  return parse_integer<std::int64_t>(text, path);
}

Result<std::uint64_t> read_unsigned(const FileReader& reader, const std::filesystem::path& path) {
  auto text = reader(path);
  if (!text) return text.error();
  return parse_unsigned(*text, path);
}

Result<std::int64_t> read_signed(const FileReader& reader, const std::filesystem::path& path) {
  auto text = reader(path);
  if (!text) return text.error();
  return parse_signed(*text, path);
}

Result<std::string> read_trimmed(const FileReader& reader, const std::filesystem::path& path) {
  auto text = reader(path);
  if (!text) return text.error();
  return std::string(trim(*text));
}

std::vector<std::filesystem::path> sorted_entries(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> entries;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    entries.push_back(it->path());
  std::sort(entries.begin(), entries.end());
  return entries;
}

}  // namespace joule::adapters
