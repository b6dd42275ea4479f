#pragma once
// RAII for posix_spawn's attribute objects, so every early return cleans up (private to the
// adapters that start processes: job_process.cpp, command_runner.cpp).

#include <spawn.h>

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

}  // namespace joule::adapters::detail
