#include "joule/daemon/meter_shares.hpp"

#include <gtest/gtest.h>

namespace joule::daemon {
namespace {

TEST(MeterSharesTest, jobs_share_a_sample_by_the_cpu_time_each_used_and_the_shares_add_up_to_one) {
  const std::vector<double> used{3.0, 1.0};
  const auto shares = shares_by_cpu_time(used);
  ASSERT_EQ(shares.size(), 2u);
  EXPECT_DOUBLE_EQ(shares[0], 0.75);
  EXPECT_DOUBLE_EQ(shares[1], 0.25);
}

TEST(MeterSharesTest, jobs_that_used_no_cpu_share_evenly_and_a_reading_gone_back_counts_as_none) {
  const std::vector<double> idle{0.0, 0.0, 0.0};
  for (const double share : shares_by_cpu_time(idle)) EXPECT_DOUBLE_EQ(share, 1.0 / 3.0);
  const std::vector<double> one_back{-0.5, 2.0};
  const auto shares = shares_by_cpu_time(one_back);
  EXPECT_DOUBLE_EQ(shares[0], 0.0);
  EXPECT_DOUBLE_EQ(shares[1], 1.0);
  EXPECT_TRUE(shares_by_cpu_time({}).empty());
}

}  // namespace
}  // namespace joule::daemon
