#include "joule/adapters/heap_release.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

namespace joule::adapters {
namespace {

constexpr std::size_t kMiB = 1u << 20;

TEST(HeapReleasePolicyTest, releases_once_the_free_memory_grows_beyond_the_slack) {
  HeapReleasePolicy policy(8 * kMiB);
  EXPECT_FALSE(policy.due(3 * kMiB));  // a fresh heap's slack
  EXPECT_FALSE(policy.due(11 * kMiB));
  EXPECT_TRUE(policy.due(12 * kMiB));  // 9 MiB over the lowest seen
}

TEST(HeapReleasePolicyTest, released_pages_still_count_as_free_so_they_are_not_released_again) {
  HeapReleasePolicy policy(8 * kMiB);
  ASSERT_FALSE(policy.due(2 * kMiB));  // the first check: a fresh heap
  ASSERT_TRUE(policy.due(50 * kMiB));
  policy.released(48 * kMiB);
  EXPECT_FALSE(policy.due(48 * kMiB));
  EXPECT_FALSE(policy.due(55 * kMiB));
}

TEST(HeapReleasePolicyTest, memory_in_use_again_then_freed_again_is_released_again) {
  HeapReleasePolicy policy(8 * kMiB);
  ASSERT_FALSE(policy.due(2 * kMiB));  // the first check: a fresh heap
  ASSERT_TRUE(policy.due(50 * kMiB));
  policy.released(50 * kMiB);
  EXPECT_FALSE(policy.due(5 * kMiB));  // a queue filled up again: the free memory was reused
  EXPECT_TRUE(policy.due(40 * kMiB));  // and it drained
}

std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

// glibc for real: 40 MiB of objects freed between ones that live on stay resident until
// released, as a drained queue's jobs did in jouled.
TEST(HeapReleaseTest, freed_memory_between_live_objects_goes_back_to_the_kernel_when_released) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's allocator keeps its own quarantine and account";
#else
  if (heap_usage().in_use_bytes == 0) GTEST_SKIP() << "this C library keeps no account of its heap (not glibc)";
  constexpr int kBlocks = 2'500;
  constexpr std::size_t kBlockBytes = 16 * 1024;  // several whole pages each, under the mmap threshold
  std::vector<std::unique_ptr<char[]> > blocks, pins;
  blocks.reserve(kBlocks);
  pins.reserve(kBlocks);
  for (int i = 0; i < kBlocks; ++i) {
    blocks.emplace_back(new char[kBlockBytes]);
    std::memset(blocks.back().get(), 1, kBlockBytes);  // resident
    pins.emplace_back(new char[64]);                   // lives on after it: the block cannot merge away
    std::memset(pins.back().get(), 1, 64);
  }
  const auto with_blocks = resident_bytes();
  blocks.clear();
  const auto freed = resident_bytes();
  EXPECT_GT(heap_usage().free_bytes, 35 * kMiB);
  EXPECT_GT(freed + 5 * kMiB, with_blocks) << "glibc gave the freed memory back by itself";

  EXPECT_TRUE(release_free_heap());
  EXPECT_LT(resident_bytes() + 20 * kMiB, freed)
      << "resident before the release " << freed / kMiB << " MiB, after " << resident_bytes() / kMiB << " MiB";
  EXPECT_GT(heap_usage().free_bytes, 35 * kMiB) << "released pages still count as free";
#endif
}

}  // namespace
}  // namespace joule::adapters
