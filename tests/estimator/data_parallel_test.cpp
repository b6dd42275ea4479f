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
  SettingLine limit;
  limit.setting = {"gpu_power_limit_watts", 200, "200 W"};
  limit.joules_ratio = 0.8;
  limit.seconds_ratio = 1.1;
  limit.joules = {800.0, 80.0};
  limit.seconds = {440.0, 44.0};
  one.settings.push_back(limit);
  return one;
}

TEST(DataParallelTest, n_gpus_take_the_same_joules_and_a_nth_of_the_time_plus_the_overhead_stated) {
  const Estimate four = across_gpus(one_gpu(), 4, 32, DataParallelOverhead{{0.2, 0.1}, {0.3, 0.1}, 0, "a test's"});
  EXPECT_DOUBLE_EQ(four.joules.mean, 1200.0);
  EXPECT_DOUBLE_EQ(four.seconds.mean, 130.0);  // 400 s × 1.3 / 4
  // 10 % of the figure's own and the overhead's spread over its factor, in quadrature.
  EXPECT_NEAR(four.joules.std / four.joules.mean, std::hypot(0.1, 0.1 / 1.2), 1e-12);
  EXPECT_NEAR(four.seconds.std / four.seconds.mean, std::hypot(0.1, 0.1 / 1.3), 1e-12);
  ASSERT_TRUE(four.data_parallel);
  EXPECT_EQ(four.data_parallel->gpus, 4);
  EXPECT_DOUBLE_EQ(four.data_parallel->one_gpu_joules.mean, 1000.0) << "kept, for the job to teach from";
  EXPECT_DOUBLE_EQ(four.data_parallel->one_gpu_seconds.mean, 400.0);
  // A setting holds on every GPU: its ratios stay one GPU's, its figures are split the same way.
  ASSERT_EQ(four.settings.size(), 1u);
  EXPECT_DOUBLE_EQ(four.settings[0].joules_ratio, 0.8);
  EXPECT_DOUBLE_EQ(four.settings[0].seconds_ratio, 1.1);
  EXPECT_DOUBLE_EQ(four.settings[0].joules.mean, 960.0);   // 800 J × 1.2
  EXPECT_DOUBLE_EQ(four.settings[0].seconds.mean, 143.0);  // 440 s × 1.3 / 4
  ASSERT_EQ(four.warnings.size(), 1u);
  EXPECT_NE(four.warnings[0].find("on 4 GPUs"), std::string::npos) << four.warnings[0];
  EXPECT_NE(four.warnings[0].find("batch size 32"), std::string::npos) << four.warnings[0];
  EXPECT_NE(four.warnings[0].find("20% ± 10% energy and 30% ± 10% time"), std::string::npos) << four.warnings[0];
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

DataParallelLine made_from(double joules, double seconds) {
  DataParallelLine line;
  line.one_gpu_joules = {joules, 0.1 * joules};
  line.one_gpu_seconds = {seconds, 0.1 * seconds};
  return line;
}

TEST(DataParallelCalibrationTest, jobs_move_the_overhead_from_the_prior_to_what_they_measured) {
  DataParallelCalibration calibration;
  EXPECT_EQ(calibration.overhead(2, "A100").jobs, 0u);
  EXPECT_DOUBLE_EQ(calibration.overhead(2, "A100").joules.mean, 0.15);
  // Two GPUs: 1,400 J against 1,000 J on one (40 % more), 280 s against 400 s on one (2 × 280 /
  // 400: 40 % more time).
  ASSERT_TRUE(calibration.add(2, 1400.0, 280.0, made_from(1000.0, 400.0)));
  auto once = calibration.overhead(2, "A100");
  EXPECT_EQ(once.jobs, 1u);
  EXPECT_NEAR(once.joules.mean, (0.15 + 0.40) / 2, 1e-12) << "the prior counts as one job";
  EXPECT_NEAR(once.seconds.mean, (0.15 + 0.40) / 2, 1e-12);
  EXPECT_NE(once.basis.find("learnt from 1 finished job on 2 A100 GPUs"), std::string::npos) << once.basis;
  for (int i = 0; i < 30; ++i) calibration.add(2, i % 2 ? 1380.0 : 1420.0, std::nullopt, made_from(1000.0, 400.0));
  auto many = calibration.overhead(2, "A100");
  EXPECT_NEAR(many.joules.mean, 0.40, 0.01);
  EXPECT_LT(many.joules.std, 0.04) << "the jobs' own scatter (±2 %), the prior's share shrunk";
  EXPECT_NEAR(many.seconds.mean, 0.275, 1e-12) << "untimed jobs teach the energy only";
}

TEST(DataParallelCalibrationTest, a_count_nobody_ran_borrows_the_nearest_with_the_priors_spread) {
  DataParallelCalibration calibration;
  for (int i = 0; i < 10; ++i) calibration.add(2, 1300.0, 260.0, made_from(1000.0, 400.0));
  const auto four = calibration.overhead(4, "A100");
  EXPECT_NEAR(four.joules.mean, (0.15 + 10 * 0.30) / 11, 1e-12);
  EXPECT_DOUBLE_EQ(four.joules.std, 0.15);
  EXPECT_NE(four.basis.find("on 2 A100 GPUs, none yet on 4"), std::string::npos) << four.basis;
  EXPECT_FALSE(calibration.add(1, 1000.0, 400.0, made_from(1000.0, 400.0))) << "one GPU teaches no overhead";
  EXPECT_FALSE(calibration.add(2, 0.0, 400.0, made_from(1000.0, 400.0)));
  EXPECT_EQ(calibration.learnt("A100").size(), 1u);
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
