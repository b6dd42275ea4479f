#pragma once
// Gives the kernel back the memory the allocator holds free. glibc returns freed memory only from
// the top of a heap; what freed objects leave between live ones stays in the process. A jouled
// that once held 10,000 queued jobs kept 48 MiB of them after the queue had drained (72 MiB
// resident, 25 MiB after malloc_trim): bench/README.md, `drained_queue_memory.py`.

#include <algorithm>
#include <cstddef>
#include <limits>

namespace joule::adapters {

/// The allocator's own account, over all its arenas (glibc's mallinfo2).
struct HeapUsage {
  std::size_t in_use_bytes = 0;  ///< allocated and not yet freed
  std::size_t free_bytes = 0;    ///< freed, held by the allocator (released pages still count)
};

/// Reads the allocator's account; zeros where it keeps none (another libc, a sanitizer's allocator).
HeapUsage heap_usage();

/// Releases the free pages of every arena to the kernel (glibc's malloc_trim(0)); true when
/// some memory was released.
bool release_free_heap();

/// When to release: once the free memory has grown `slack_bytes` beyond what it was after the
/// last release or at its lowest since. Released pages still count as free in the account, so
/// a fixed threshold would release the same pages again on every check; this waits for memory
/// that was in use again (a queue filling) to be freed again (the queue draining).
class HeapReleasePolicy {
 public:
  explicit HeapReleasePolicy(std::size_t slack_bytes) : slack_(slack_bytes) {}

  /// Whether a check that found `free_bytes` should release; lowers the baseline as free memory is reused.
  bool due(std::size_t free_bytes) {
    baseline_ = std::min(baseline_, free_bytes);
    return free_bytes > baseline_ + slack_;
  }
  /// After a release: what is free now is the new baseline.
  void released(std::size_t free_bytes) { baseline_ = free_bytes; }

 private:
  std::size_t slack_;
  std::size_t baseline_ = std::numeric_limits<std::size_t>::max();  // the first check sets it
};

}  // namespace joule::adapters
