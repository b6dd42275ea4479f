#include "jobs/chosen_setting.hpp"

#include <gtest/gtest.h>

using joule::adapters::StoredJob;
using joule::daemon::DeviceEstimate;
using joule::daemon::estimate_at_setting_ran;
using joule::daemon::JobRecord;
using joule::daemon::read_stored_setting;
using joule::daemon::StoredSetting;
using joule::daemon::write_stored_setting;

namespace {

StoredSetting power_limit_setting() {
  StoredSetting stored;
  stored.chosen.setting = {"gpu_power_limit_watts", 250.0, "250 W"};
  stored.chosen.goal = "min-energy";
  stored.chosen.at_setting = {800.0, 40.0, 75.0};
  stored.chosen.at_default = {1000.0, 50.0, 60.0};
  stored.in_force = true;
  return stored;
}

// 1000 J and 60 s at the defaults; 0.8× the joules and 1.25× the time at 250 W.
DeviceEstimate estimate_with_a_setting() {
  DeviceEstimate estimate;
  estimate.device = "cuda:0";
  estimate.ok = true;
  estimate.joules_mean = 1000.0;
  estimate.joules_std = 50.0;
  estimate.seconds_mean = 60.0;
  estimate.settings.push_back({{"gpu_power_limit_watts", 250.0, "250 W"}, "measured", 0.8, 0.02, 1.25, 0.02});
  return estimate;
}

TEST(ChosenSettingTest, a_setting_its_prediction_and_its_check_round_trip_through_the_row) {
  auto stored = power_limit_setting();
  stored.check = joule::schedulers::SettingCheckResult{2, 3, 0.7, 1.3, true, "0.70× the joules: kept"};
  stored.checked_key = "cuda:0|net";
  const auto back = read_stored_setting(write_stored_setting(stored));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->chosen.setting, stored.chosen.setting);
  EXPECT_EQ(back->chosen.goal, "min-energy");
  EXPECT_DOUBLE_EQ(back->chosen.at_setting.joules_mean, 800.0);
  EXPECT_DOUBLE_EQ(back->chosen.at_default.seconds_mean, 60.0);
  EXPECT_TRUE(back->in_force);
  EXPECT_EQ(back->checked_key, "cuda:0|net");
  ASSERT_TRUE(back->check);
  EXPECT_TRUE(back->check->kept);
  EXPECT_DOUBLE_EQ(back->check->energy_ratio, 0.7);
  EXPECT_EQ(back->check->default_epoch, 3);

  // What this code did not write is no setting.
  EXPECT_FALSE(read_stored_setting(""));
  EXPECT_FALSE(read_stored_setting("not json"));
  EXPECT_FALSE(read_stored_setting(R"({"knob": 3, "value": 1})"));
  EXPECT_FALSE(read_stored_setting(R"({"knob": "x", "value": 1, "in_force": "yes"})"));
}

TEST(ChosenSettingTest, a_job_read_back_runs_at_its_setting_unless_its_check_gave_it_up) {
  JobRecord job;
  job.row.chosen_setting = write_stored_setting(power_limit_setting());
  joule::daemon::restore_chosen_setting(job);
  ASSERT_TRUE(job.chosen_setting);
  EXPECT_EQ(job.setting_ran_at()->label, "250 W");
  EXPECT_TRUE(job.setting_was_in_force);

  auto given_up = power_limit_setting();
  given_up.check = joule::schedulers::SettingCheckResult{2, 3, 1.1, 1.3, false, "the defaults kept"};
  JobRecord other;
  other.row.chosen_setting = write_stored_setting(given_up);
  joule::daemon::restore_chosen_setting(other);
  EXPECT_FALSE(other.setting_ran_at());
  ASSERT_NE(other.check_result(), nullptr);
  EXPECT_FALSE(other.check_result()->kept);
}

TEST(ChosenSettingTest, a_finished_row_teaches_at_the_setting_it_ran_at) {
  StoredJob row;
  row.chosen_setting = write_stored_setting(power_limit_setting());
  auto at = estimate_at_setting_ran(estimate_with_a_setting(), row);
  ASSERT_TRUE(at);
  EXPECT_DOUBLE_EQ(at->joules_mean, 800.0);
  EXPECT_DOUBLE_EQ(at->seconds_mean, 75.0);

  // Not in force (refused), or given up by its check: the defaults' figures.
  auto refused = power_limit_setting();
  refused.in_force = false;
  row.chosen_setting = write_stored_setting(refused);
  EXPECT_DOUBLE_EQ(estimate_at_setting_ran(estimate_with_a_setting(), row)->joules_mean, 1000.0);

  // No chosen setting, no knobs of its own: the defaults.
  row.chosen_setting.clear();
  row.spec_json = R"({"run": {"command": ["train"]}})";
  EXPECT_DOUBLE_EQ(estimate_at_setting_ran(estimate_with_a_setting(), row)->joules_mean, 1000.0);
  // Its own knobs: whether they were in force is not in the row, so it teaches nothing.
  row.spec_json = R"({"run": {"command": ["train"]}, "knobs": {"gpu_power_limit_watts": 250}})";
  EXPECT_FALSE(estimate_at_setting_ran(estimate_with_a_setting(), row));
}

}  // namespace
