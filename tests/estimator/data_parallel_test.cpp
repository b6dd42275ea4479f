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
