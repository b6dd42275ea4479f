#pragma once
// The error and file helpers every control over kernel files shares (cgroups, cpufreq): private
// to the adapters' sources, defined in job_controls.cpp.

#include <filesystem>
#include <string>
#include <string_view>

#include "joule/adapters/job_controls.hpp"
#include "joule/common/result.hpp"

namespace joule::adapters::detail {

/// "cannot <action> <file>: <why> (<hint>)", with the error code the errno means (EACCES ->
/// permission_denied, ENOENT -> unavailable, EBUSY -> conflict, EINVAL -> invalid_argument).
/// An empty hint takes a default one where the errno has it (the cgroup delegation hint).
Error file_error(int err, std::string_view action, const std::filesystem::path& file, std::string_view hint = {});
/// `error` with "<prefix>: " in front of its message.
Error with_prefix(const Error& error, std::string_view prefix);
/// The whole file through `files`.
Result<std::string> read_file(const ControlFiles& files, const std::filesystem::path& file);
/// `files` with every member a caller left empty set to the real call.
ControlFiles complete(ControlFiles files);

}  // namespace joule::adapters::detail
