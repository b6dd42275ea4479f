#pragma once
// The glibc malloc settings probes are measured under, which jobs get too: a training step frees
// and allocates the same large tensors every step, and glibc's default (a dynamic mmap threshold,
// trimming freed memory back to the system) makes each of them fresh pages to fault in and zero.
// Measured on a 2-vCPU VM, one thread: a plain PyTorch CNN step 127 ms by default, 101 ms with
// these, as joule-worker measures it; the dynamic threshold also made probe timings depend on
// what ran before in the process (+22-40 %).

#include <array>
#include <cstddef>
#include <utility>

namespace joule {

/// Allocations below this come from the heap and are reused, not mapped and unmapped each step.
inline constexpr std::size_t kMallocMmapThresholdBytes = 32u * 1024 * 1024;
/// How many chunks malloc may map on its own: none. 32 MiB is the largest threshold glibc takes,
/// and every tensor of that size or more (64 × 128 × 32 × 32 floats is exactly 32 MiB) was
/// still mapped, faulted in and unmapped every step: a probe network at batch 64 took 178 ms a
/// step against 72 ms at batch 63, and 69 ms at batch 64 with no mapped chunks.
inline constexpr int kMallocMmapMax = 0;
/// Freed memory at the heap's top is given back to the system only beyond this.
inline constexpr std::size_t kMallocTrimThresholdBytes = 1024u * 1024 * 1024;

/// The environment variables glibc reads at a process's start for the same settings
/// (mallopt(3): M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, M_MMAP_MAX), as a job's environment carries them.
inline std::array<std::pair<const char*, std::size_t>, 3> malloc_environment() {
  return {{{"MALLOC_MMAP_THRESHOLD_", kMallocMmapThresholdBytes},
           {"MALLOC_TRIM_THRESHOLD_", kMallocTrimThresholdBytes},
           {"MALLOC_MMAP_MAX_", static_cast<std::size_t>(kMallocMmapMax)}}};
}

}  // namespace joule
