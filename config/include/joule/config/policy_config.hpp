#pragma once
// policies.d/*.toml: the placement objective and the budgets, power caps and battery floors
// that jouled enforces, read into a schedulers::Policy. Each reload reads and validates the
// whole directory; a set with any problem is refused whole, so the caller keeps its old policy.
//
// Unlike jouled.toml (where an unknown key is a warning), an unknown key or table here is an
// error: a misspelt key in a budget must not silently drop the limit. The format is documented
// in config/policies.d/50-budgets-example.toml; in short:
//
//   [placement]         objective, risk (0 < risk < 1), warmup_epochs (0..1000)
//   [[groups]]          name, nodes = [...]
//   [[budgets]]         name, scope, target, one of joules | wh | kwh, one of window | calendar
//   [[power_caps]]      name, scope, target, watts, average_seconds (default 60)
//   [[battery_floors]]  name, scope, target, percent (0 <= p < 100), margin_percent (default 5)
//
// Files accumulate in lexical order: any file may add groups, budgets, caps and floors (names
// are unique per kind across all files, and a group target may be defined in any file); each
// [placement] key may be set in one file only. Problems are "file:line: message", the rule
// named by its kind and index in its file ("budgets[1].window", 0-based as in TOML paths).

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "joule/common/result.hpp"
#include "joule/config/daemon_config.hpp"
#include "joule/schedulers/policy.hpp"

namespace joule::config {

/// A validated policy and where it came from.
struct LoadedPolicy {
  schedulers::Policy policy;                 ///< source is the file names joined by ", "
  std::vector<ConfigProblem> warnings;       ///< usable as is, but worth a log line (e.g. a baseline objective)
  std::vector<std::filesystem::path> files;  ///< the files read, in the order applied
};

/// Parses a set of policy files, given as (file name, TOML text) in the order they apply, on top
/// of the embedded defaults (schedulers::Policy{}), and validates the set as a whole. On any
/// problem nothing is returned: the Error (invalid_argument) lists every problem of every file
/// as "file:line: message", one per line, in file then line order; `where` locates the first.
/// The file names are used as given in messages, in `files` and in `policy.source`. An empty
/// set yields the embedded defaults. Pure: reads nothing but its arguments.
Result<LoadedPolicy> parse_policy_files(const std::vector<std::pair<std::string, std::string>>& files);

/// Reads every regular *.toml file of `dir` (not hidden ones) in lexical order of file name and
/// parses them as parse_policy_files does, naming each by its file name. A missing directory,
/// or one with no *.toml, yields the embedded defaults (source "embedded defaults"), not an
/// error. An unreadable directory or file is a problem like any other: nothing is returned.
/// `files` holds full paths. Blocking file I/O: call at start-up or on SIGHUP, not per request.
Result<LoadedPolicy> load_policy_directory(const std::filesystem::path& dir);

}  // namespace joule::config
