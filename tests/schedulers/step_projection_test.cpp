#include "joule/schedulers/step_projection.hpp"

#include <cmath>

#include <gtest/gtest.h>

namespace joule::schedulers {
namespace {

std::vector<EpochReport> steady(int done, int epochs, double warmup_joules, double per_epoch, double jitter = 0.0) {
  std::vector<EpochReport> out;
  double joules = 0.0;
  for (int k = 1; k <= done; ++k) {
    joules += k == 1 ? warmup_joules : per_epoch + (k % 2 ? jitter : -jitter);
    out.push_back({k, epochs, joules, k * 60'000});
  }
  return out;
}

TEST(StepProjectionTest, warm_up_epochs_are_skipped_and_the_stable_pace_projects_the_rest) {
  // Epoch 1 costs 500 J (warm-up), then 100 J per epoch: 10 epochs total = 500 + 9 x 100.
  const auto projection = project_energy(steady(4, 10, 500.0, 100.0), std::nullopt);
  ASSERT_TRUE(projection.step);
  EXPECT_STREQ(projection.method, "step");
  EXPECT_EQ(projection.stable_epochs, 3);
  EXPECT_NEAR(projection.total.mean_joules, 1400.0, 1e-9);
  EXPECT_NEAR(projection.seconds_remaining, 6 * 60.0, 1e-9);
}

TEST(StepProjectionTest, before_any_stable_epoch_the_prior_stands) {
  const auto prior = EnergyDistribution::from_std(2000.0, 400.0);
  const auto projection = project_energy(steady(1, 10, 500.0, 100.0), prior);
  EXPECT_STREQ(projection.method, "prior");
  EXPECT_EQ(projection.total.mean_joules, 2000.0);
  EXPECT_FALSE(projection.step);
}

TEST(StepProjectionTest, the_combination_weights_each_side_by_its_certainty) {
  const auto reports = steady(6, 10, 500.0, 100.0, 5.0);  // steady: a sure projection near 1400 J
  const auto vague = project_energy(reports, EnergyDistribution::from_std(3000.0, 1500.0));
  const auto sure = project_energy(reports, EnergyDistribution::from_std(3000.0, 1.0));
  EXPECT_STREQ(vague.method, "combined");
  EXPECT_NEAR(vague.total.mean_joules, vague.step->mean_joules, 5.0);
  EXPECT_GT(sure.total.mean_joules, 2950.0);
  EXPECT_LT(vague.total.variance, vague.step->variance);  // two sources know more than one
}

TEST(StepProjectionTest, spread_between_epochs_widens_the_projection) {
  const auto calm = project_energy(steady(6, 20, 500.0, 100.0, 1.0), std::nullopt);
  const auto noisy = project_energy(steady(6, 20, 500.0, 100.0, 40.0), std::nullopt);
  EXPECT_GT(noisy.total.variance, 10 * calm.total.variance);
}

TEST(StepProjectionTest, gaps_repeats_and_nonsense_reports_are_handled) {
  std::vector<EpochReport> reports = {{1, 10, 500.0, 60'000},  {3, 10, 700.0, 180'000}, {3, 10, 999.0, 190'000},
                                      {2, 10, 600.0, 200'000}, {0, 10, 0.0, 0},         {11, 10, 0.0, 0},
                                      {5, 10, 900.0, 300'000}};
  const auto projection = project_energy(reports, std::nullopt);
  EXPECT_EQ(projection.stable_epochs, 4);                  // 1→3 and 3→5
  EXPECT_NEAR(projection.total.mean_joules, 1400.0, 1e-9);  // 900 + 5 x 100
}

TEST(StepProjectionTest, a_finished_job_projects_its_metered_total) {
  const auto reports = steady(10, 10, 500.0, 100.0);
  const auto projection = project_energy(reports, EnergyDistribution::from_std(5000.0, 100.0));
  EXPECT_NEAR(projection.total.mean_joules, 1400.0, 1e-9);
  EXPECT_NEAR(projection.total.variance, 0.0, 1e-9);
}

}  // namespace
}  // namespace joule::schedulers
