#pragma once
// Reading sysfs/procfs attributes: one small text file per value, a number and a newline.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "joule/common/result.hpp"

namespace joule::adapters {

/// Reads a whole small file. Meters take one so that tests can simulate EACCES (they run as
/// root, and file modes do not deny root) without patching open().
using FileReader = std::function<Result<std::string>(const std::filesystem::path&)>;

/// The real reader. Errors: EACCES/EPERM -> permission_denied, ENOENT/ENODEV/ENXIO ->
/// unavailable, anything else -> io; each message names the path and the OS reason.
Result<std::string> read_sysfs_file(const std::filesystem::path& path);

/// The text without trailing (and leading) whitespace: "package-0\n" -> "package-0".
std::string_view trim(std::string_view text);

/// A decimal integer attribute ("262143328850\n"). Empty or non-numeric text is an io error that
/// names `path`; a number is never invented from it.
Result<std::uint64_t> parse_unsigned(std::string_view text, const std::filesystem::path& path);
Result<std::int64_t> parse_signed(std::string_view text, const std::filesystem::path& path);

/// Reads and parses in one step.
Result<std::uint64_t> read_unsigned(const FileReader& reader, const std::filesystem::path& path);
Result<std::int64_t> read_signed(const FileReader& reader, const std::filesystem::path& path);
/// Reads a text attribute without its trailing newline.
Result<std::string> read_trimmed(const FileReader& reader, const std::filesystem::path& path);

/// The entries of `dir` (symlinks not followed, so class entries keep their names), sorted by
/// name; empty when `dir` is missing or unreadable.
std::vector<std::filesystem::path> sorted_entries(const std::filesystem::path& dir);

}  // namespace joule::adapters
