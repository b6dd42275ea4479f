#include "joule/schedulers/job_queue.hpp"

#include <gtest/gtest.h>

using joule::schedulers::JobQueue;

namespace {
bool any(const std::string&) { return true; }
}  // namespace

TEST(JobQueueTest, higher_priority_first_then_submission_order) {
  JobQueue queue;
  queue.push("a", 0, 1);
  queue.push("b", 5, 2);
  queue.push("c", 0, 3);
  queue.push("d", 5, 4);
  std::vector<std::string> order;
  while (auto next = queue.next(any)) {
    order.push_back(*next);
    queue.erase(*next);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"b", "d", "a", "c"}));
}

TEST(JobQueueTest, skips_jobs_the_device_cannot_take) {
  JobQueue queue;
  queue.push("gpu-only", 9, 1);
  queue.push("any", 0, 2);
  EXPECT_EQ(queue.next([](const std::string& id) { return id != "gpu-only"; }), "any");
  EXPECT_EQ(queue.size(), 2u);
}

TEST(JobQueueTest, erase_and_push_again_are_safe) {
  JobQueue queue;
  queue.erase("missing");
  queue.push("a", 0, 1);
  queue.push("a", 3, 1);  // re-queued with a new priority: still one entry
  EXPECT_EQ(queue.size(), 1u);
  EXPECT_TRUE(queue.contains("a"));
  queue.erase("a");
  EXPECT_FALSE(queue.next(any));
}

TEST(JobQueueTest, a_jobs_position_counts_the_jobs_ahead_of_it_in_order) {
  JobQueue queue;
  for (int i = 0; i < 1000; ++i) queue.push("job-" + std::to_string(i), i % 3 == 0 ? 1 : 0, i);
  // 334 jobs of priority 1 (i = 0, 3, ..., 999) come first, then the rest in submission order.
  EXPECT_EQ(queue.position("job-0"), 0u);
  EXPECT_EQ(queue.position("job-999"), 333u);
  EXPECT_EQ(queue.position("job-1"), 334u);
  EXPECT_EQ(queue.position("job-998"), 999u);
  queue.erase("job-0");
  EXPECT_EQ(queue.position("job-1"), 333u);
  EXPECT_FALSE(queue.position("job-0"));
}
