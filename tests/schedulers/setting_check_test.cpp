#include <gtest/gtest.h>

#include "joule/schedulers/setting_check.hpp"

using namespace joule::schedulers;

namespace {

KnobPolicy goal(KnobGoal g) {
  KnobPolicy knobs;
  knobs.goal = g;
  return knobs;
}

// Reports of a job whose epochs cost `setting` J and s at the setting and `defaults` at the
// defaults, switching as the check says; returns the steps it was told.
struct Job {
  SettingCheck check;
  double setting_joules, setting_seconds, default_joules, default_seconds;
  int epochs;
  EpochReport last{0, 0, 0.0, 1'000'000};
  bool at_setting = true;
  std::vector<SettingCheck::Step> steps;
  void run(int until) {
    for (int epoch = last.epoch + 1; epoch <= until; ++epoch) {
      last.epoch = epoch;
      last.epochs = epochs;
      last.joules += at_setting ? setting_joules : default_joules;
      last.at += static_cast<UnixMillis>(1000.0 * (at_setting ? setting_seconds : default_seconds));
      const auto step = check.on_report(last);
      steps.push_back(step);
      if (step == SettingCheck::Step::to_defaults) at_setting = false;
      if (step == SettingCheck::Step::to_setting) at_setting = true;
    }
  }
};

}  // namespace

TEST(SettingCheckTest, a_setting_that_saves_within_the_slowdown_is_kept_after_one_epoch_at_each) {
  Job job{SettingCheck(goal(KnobGoal::min_energy), 0.25, 1), 80.0, 12.0, 100.0, 10.0, 10};
  job.run(10);
  using Step = SettingCheck::Step;
  // Epoch 1 warms up; 2 is metered at the setting; 3 at the defaults; then the setting again.
  EXPECT_EQ(job.steps, (std::vector<Step>{Step::none, Step::to_defaults, Step::to_setting, Step::none, Step::none,
                                          Step::none, Step::none, Step::none, Step::none, Step::none}));
  ASSERT_TRUE(job.check.result());
  const auto& result = *job.check.result();
  EXPECT_TRUE(result.kept);
  EXPECT_EQ(result.setting_epoch, 2);
  EXPECT_EQ(result.default_epoch, 3);
  EXPECT_NEAR(result.energy_ratio, 0.8, 1e-9);
  EXPECT_NEAR(result.time_ratio, 1.2, 1e-9);
  EXPECT_EQ(result.why, "0.80× the joules and 1.20× the time of the defaults: the setting kept");
}

TEST(SettingCheckTest, a_setting_slower_than_allowed_or_no_cheaper_gives_way_to_the_defaults) {
  Job slow{SettingCheck(goal(KnobGoal::min_energy), 0.1, 2), 80.0, 12.0, 100.0, 10.0, 10};
  slow.run(10);
  ASSERT_TRUE(slow.check.result());
  EXPECT_FALSE(slow.check.result()->kept);
  EXPECT_EQ(slow.check.result()->setting_epoch, 3);  // two warm-up epochs
  EXPECT_NE(slow.check.result()->why.find("slower than the 10 % allowed"), std::string::npos);
  EXPECT_FALSE(slow.at_setting);  // the rest runs at the defaults

  // Zeus's cost with η 0.5: 0.95 × energy is not worth 1.2 × the time.
  Job zeus{SettingCheck(goal(KnobGoal::zeus), std::nullopt, 1), 95.0, 12.0, 100.0, 10.0, 10};
  zeus.run(10);
  EXPECT_FALSE(zeus.check.result()->kept);
  EXPECT_NE(zeus.check.result()->why.find("no better for the goal"), std::string::npos);
}

TEST(SettingCheckTest, a_job_with_too_few_epochs_left_is_not_checked_and_keeps_its_setting) {
  Job short_job{SettingCheck(goal(KnobGoal::min_energy), 0.25, 1), 80.0, 12.0, 100.0, 10.0, 3};
  short_job.run(3);
  ASSERT_TRUE(short_job.check.result());
  EXPECT_TRUE(short_job.check.result()->kept);
  EXPECT_EQ(short_job.check.result()->why, "not checked: 2 of its 3 epochs were left after its warm-up");
  EXPECT_TRUE(short_job.at_setting);
}
