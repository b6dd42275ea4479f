#pragma once
// Reading a job's output log for the API: a bounded window of a file that a job may have
// tampered with, opened without following links and read without taking it whole into memory.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "joule/common/result.hpp"

namespace joule::adapters {

/// One window of a log: the bytes, where they start, and the file's size when it was read.
struct LogChunk {
  std::string bytes;
  std::uint64_t offset = 0;  ///< of bytes[0] in the file
  std::uint64_t size = 0;    ///< of the file when read (it may still grow)
  std::uint64_t next_offset() const { return offset + bytes.size(); }
};

/// Which window: from `offset` when it is given, else the last `tail_bytes` of the file; never
/// more than `max_bytes` either way.
struct LogWindow {
  std::optional<std::uint64_t> offset;
  std::uint64_t tail_bytes = 1 << 20;
  std::size_t max_bytes = 1 << 20;
};

/// Reads a window of the log at `path`. A missing file is an empty log (the job has not
/// started). A symbolic link, a FIFO, a device or a directory in its place is refused with
/// `permission_denied` and never opened for I/O (O_NOFOLLOW | O_NONBLOCK, then fstat).
Result<LogChunk> read_log_window(const std::filesystem::path& path, const LogWindow& window);

}  // namespace joule::adapters
