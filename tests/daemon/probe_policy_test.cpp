#include "joule/daemon/probe_policy.hpp"

#include <gtest/gtest.h>

namespace joule::daemon {

TEST(ProbePolicyTest, hours_may_wrap_midnight) {
  EXPECT_TRUE(within_probing_hours(0, 0, 24 * 60));
  EXPECT_TRUE(within_probing_hours(23 * 60 + 59, 0, 24 * 60));
  EXPECT_TRUE(within_probing_hours(23 * 60, 22 * 60, 6 * 60));
  EXPECT_TRUE(within_probing_hours(5 * 60 + 59, 22 * 60, 6 * 60));
  EXPECT_FALSE(within_probing_hours(6 * 60, 22 * 60, 6 * 60));
  EXPECT_FALSE(within_probing_hours(12 * 60, 22 * 60, 6 * 60));
  EXPECT_FALSE(within_probing_hours(21 * 60 + 59, 22 * 60, 6 * 60));
}

TEST(ProbePolicyTest, disabled_and_out_of_hours_stop_background_probing_but_not_a_request) {
  config::ProbingConfig probing;
  probing.enabled = false;
  EXPECT_NE(probing_refusal(probing, {false, 600, 0.0}).value_or("").find("disabled"), std::string::npos);
  EXPECT_FALSE(probing_refusal(probing, {true, 600, 0.0}));
  probing.enabled = true;
  probing.start_minute = 22 * 60;
  probing.end_minute = 6 * 60;
  EXPECT_NE(probing_refusal(probing, {false, 600, 0.0}).value_or("").find("22:00-06:00"), std::string::npos);
  EXPECT_FALSE(probing_refusal(probing, {false, 23 * 60, 0.0}));
  EXPECT_FALSE(probing_refusal(probing, {true, 600, 0.0}));
}

TEST(ProbePolicyTest, the_daily_joule_cap_holds_for_requests_too) {
  config::ProbingConfig probing;
  probing.max_joules_per_day = 5000.0;
  EXPECT_FALSE(probing_refusal(probing, {false, 0, 4999.0}));
  const auto refusal = probing_refusal(probing, {true, 0, 5000.0});
  ASSERT_TRUE(refusal);
  EXPECT_NE(refusal->find("5000 J is spent"), std::string::npos) << *refusal;
  probing.max_joules_per_day = 0.0;  // no cap
  EXPECT_FALSE(probing_refusal(probing, {false, 0, 1e12}));
}

}  // namespace joule::daemon
