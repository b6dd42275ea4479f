#pragma once
// What the adapters that start processes (job_process.cpp, command_runner.cpp) share around
// posix_spawn: RAII for its attribute objects, and argv/envp as C strings. Private to them.

#include <spawn.h>

#include <string>
#include <vector>

namespace joule::adapters::detail {

struct SpawnSetup {
  posix_spawn_file_actions_t actions{};
  posix_spawnattr_t attr{};
  SpawnSetup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attr);
  }
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
};

/// Pointers into `strings` plus the terminating null; valid while `strings` lives unchanged.
inline std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace joule::adapters::detail
