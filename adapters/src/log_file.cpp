#include "joule/adapters/log_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace joule::adapters {

Result<LogChunk> read_log_window(const std::filesystem::path& path, const LogWindow& window) {
  // O_NONBLOCK: opening a FIFO planted in the log's place must not hang the event loop.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT) return LogChunk{};
    const bool link = errno == ELOOP;
    return make_error(
        ErrorCode::permission_denied,
        link ? fmt::format("{} is a symbolic link; jouled does not follow links in job logs", path.string())
             : fmt::format("cannot open {}: {}", path.string(), std::strerror(errno)));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return make_error(ErrorCode::permission_denied, fmt::format("{} is not a regular file", path.string()));
  }
  LogChunk chunk;
  chunk.size = static_cast<std::uint64_t>(info.st_size);
  if (window.offset)
    chunk.offset = std::min(*window.offset, chunk.size);
  else
    chunk.offset = chunk.size > window.tail_bytes ? chunk.size - window.tail_bytes : 0;
  const std::uint64_t wanted = std::min<std::uint64_t>(chunk.size - chunk.offset, window.max_bytes);
  chunk.bytes.resize(static_cast<std::size_t>(wanted));
  std::size_t done = 0;
  while (done < chunk.bytes.size()) {
    const ssize_t n =
        ::pread(fd, chunk.bytes.data() + done, chunk.bytes.size() - done, static_cast<off_t>(chunk.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return make_error(ErrorCode::io, fmt::format("cannot read {}: {}", path.string(), std::strerror(error)));
    }
    if (n == 0) break;  // truncated meanwhile
    done += static_cast<std::size_t>(n);
  }
  chunk.bytes.resize(done);
  ::close(fd);
  return chunk;
}

}  // namespace joule::adapters
