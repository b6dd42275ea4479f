#pragma once
// The thread count a job runs with: the environment variables that set it, and what an estimate
// says when a job asks for another count than the one its device's model was learnt at; and the
// allocator settings probes run under, which jobs get too.

#include <array>
#include <map>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "joule/common/allocator_settings.hpp"

namespace joule::daemon {

/// What OpenMP, MKL, OpenBLAS (and so PyTorch's intra-op pool) and Joule's own scripts read.
inline constexpr std::array<const char*, 4> kThreadVariables = {"OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                                "OPENBLAS_NUM_THREADS", "JOULE_THREADS"};

/// Sets every thread variable to `threads` (nothing when it is not positive).
inline void set_thread_variables(std::map<std::string, std::string>& env, int threads) {
  if (threads <= 0) return;
  for (const char* name : kThreadVariables) env[name] = std::to_string(threads);
}

/// Sets glibc malloc's thresholds to those probes are measured under (allocator_settings.hpp):
/// without them a plain PyTorch job's steps ran up to 1.27× the probes' on the same network, and
/// every estimate of it was low by as much.
inline void set_allocator_variables(std::map<std::string, std::string>& env) {
  for (const auto& [name, bytes] : malloc_environment()) env[name] = std::to_string(bytes);
}

/// A note for the estimate when the job's own environment (run.env) sets a thread variable to
/// another count than `device_threads`, the count the device's model was learnt at.
inline std::optional<std::string> thread_count_warning(const std::map<std::string, std::string>& job_env,
                                                       int device_threads) {
  if (device_threads <= 0) return std::nullopt;
  for (const char* name : kThreadVariables) {
    const auto it = job_env.find(name);
    if (it != job_env.end() && it->second != std::to_string(device_threads)) {
      return fmt::format(
          "run.env sets {}={}, but this device's model is learnt at {} thread{}: the estimate is "
          "outside what was probed",
          name, it->second, device_threads, device_threads == 1 ? "" : "s");
    }
  }
  return std::nullopt;
}

}  // namespace joule::daemon
