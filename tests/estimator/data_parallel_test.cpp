// A job on several GPUs from one GPU's estimate (issue 36): the same work split N ways, plus the
// stated overhead of communication, the spreads widened by the overhead's own.
#include <gtest/gtest.h>

#include "joule/estimator/data_parallel.hpp"

namespace joule::estimator {
namespace {

Estimate one_gpu() {
  Estimate one;
  one.device = "cuda:0";
  one.joules = {1000.0, 100.0};
  one.seconds = {400.0, 40.0};
  one.settings.push_back(SettingLine{});
  return one;
}

TEST(DataParallelTest, n_gpus_take_the_same_joules_and_a_nth_of_the_time_plus_the_overhead_stated) {
  const Estimate four = across_gpus(one_gpu(), 4, 32, DataParallelOverhead{0.2, 0.1, "a test's"});
  EXPECT_DOUBLE_EQ(four.joules.mean, 1200.0);
  EXPECT_DOUBLE_EQ(four.seconds.mean, 120.0);  // 400 s × 1.2 / 4
  // 10 % of the joules' own and 0.1 / 1.2 of the overhead's, in quadrature.
  EXPECT_NEAR(four.joules.std / four.joules.mean, std::hypot(0.1, 0.1 / 1.2), 1e-12);
  EXPECT_NEAR(four.seconds.std / four.seconds.mean, std::hypot(0.1, 0.1 / 1.2), 1e-12);
  EXPECT_TRUE(four.settings.empty()) << "a setting is one device's";
  ASSERT_EQ(four.warnings.size(), 1u);
  EXPECT_NE(four.warnings[0].find("on 4 GPUs"), std::string::npos) << four.warnings[0];
  EXPECT_NE(four.warnings[0].find("batch size 32"), std::string::npos) << four.warnings[0];
  EXPECT_NE(four.warnings[0].find("20% ± 10%"), std::string::npos) << four.warnings[0];
  EXPECT_NE(four.warnings[0].find("a test's"), std::string::npos) << four.warnings[0];
}

TEST(DataParallelTest, one_gpu_is_left_as_it_is_and_the_default_overhead_says_it_is_a_prior) {
  const Estimate one = across_gpus(one_gpu(), 1, 32);
  EXPECT_DOUBLE_EQ(one.joules.mean, 1000.0);
  EXPECT_TRUE(one.warnings.empty());
  const Estimate two = across_gpus(one_gpu(), 2, 32);
  EXPECT_NE(two.warnings[0].find("a prior, not yet learnt"), std::string::npos) << two.warnings[0];
  EXPECT_GT(two.joules.mean, 1000.0);
}

}  // namespace
}  // namespace joule::estimator

#include "joule/estimator/thread_count.hpp"

namespace joule::estimator {
namespace {

Estimate with_thread_lines() {
  Estimate estimate;
  estimate.joules = {100.0, 10.0};
  estimate.seconds = {60.0, 6.0};
  for (const auto& [threads, joules, seconds] : {std::tuple{2, 90.0, 35.0}, {4, 110.0, 20.0}, {16, 200.0, 10.0}}) {
    SettingLine line;
    line.setting = threads_setting(threads);
    line.basis = "measured";
    line.joules = {joules, 0.1 * joules};
    line.seconds = {seconds, 0.1 * seconds};
    estimate.settings.push_back(line);
  }
  SettingLine knob;
  knob.setting = KnobSetting{"cpu_max_frequency_mhz", 2000.0, "2000 MHz"};
  estimate.settings.push_back(knob);
  return estimate;
}

TEST(ThreadCountTest, a_range_keeps_the_counts_measured_in_it_and_names_them) {
  Estimate estimate = with_thread_lines();
  EXPECT_EQ(over_core_range(estimate, 1, 8, 1), (std::vector<int>{1, 2, 4}));
  ASSERT_EQ(estimate.settings.size(), 2u) << "16 threads and the knob's line are dropped";
  EXPECT_NE(estimate.warnings.back().find("among the counts measured in the range (1, 2, 4)"), std::string::npos)
      << estimate.warnings.back();
  Estimate none = with_thread_lines();
  EXPECT_TRUE(over_core_range(none, 5, 8, 1).empty());
  EXPECT_NE(none.warnings.back().find("it runs at 5"), std::string::npos) << none.warnings.back();
}

TEST(ThreadCountTest, a_fixed_count_takes_its_lines_figures) {
  Estimate estimate = with_thread_lines();
  EXPECT_TRUE(at_thread_count(estimate, 4, 1));
  EXPECT_DOUBLE_EQ(estimate.joules.mean, 110.0);
  EXPECT_DOUBLE_EQ(estimate.seconds.mean, 20.0);
  ASSERT_EQ(estimate.settings.size(), 1u) << "the knob's line stays, the thread counts' go";
  EXPECT_EQ(estimate.settings[0].setting.knob, "cpu_max_frequency_mhz");
  Estimate same = with_thread_lines();
  EXPECT_FALSE(at_thread_count(same, 1, 1)) << "the device's own count: its figures as they are";
  EXPECT_DOUBLE_EQ(same.joules.mean, 100.0);
}

}  // namespace
}  // namespace joule::estimator
