#include "joule/schedulers/step_projection.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

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
  EXPECT_EQ(projection.stable_epochs, 4);                   // 1→3 and 3→5
  EXPECT_NEAR(projection.total.mean_joules, 1400.0, 1e-9);  // 900 + 5 x 100
}

TEST(StepProjectionTest, a_finished_job_projects_its_metered_total) {
  const auto reports = steady(10, 10, 500.0, 100.0);
  const auto projection = project_energy(reports, EnergyDistribution::from_std(5000.0, 100.0));
  EXPECT_NEAR(projection.total.mean_joules, 1400.0, 1e-9);
  EXPECT_NEAR(projection.total.variance, 0.0, 1e-9);
}

// Cumulative reports of a run whose epoch k (1-based) used `per_epoch[k-1]` joules, one a minute.
std::vector<EpochReport> reports_of(const std::vector<double>& per_epoch, int done, int epochs) {
  std::vector<EpochReport> out;
  double joules = 0.0;
  for (int k = 1; k <= done; ++k) {
    joules += per_epoch[static_cast<std::size_t>(k - 1)];
    out.push_back({k, epochs, joules, k * 60'000});
  }
  return out;
}

// A synthetic run: `warmup` epochs that cost more (falling towards the plateau, the last still
// more than 15 % above it), then 100 J per epoch with ±1.5 % of noise.
std::vector<double> run_with_warmup(int warmup, int epochs, unsigned seed) {
  std::vector<double> out;
  unsigned state = seed;
  for (int k = 1; k <= epochs; ++k) {
    state = state * 1103515245u + 12345u;
    const double noise = (static_cast<double>((state >> 16) % 1000) / 999.0 - 0.5) * 3.0;  // ±1.5 %
    out.push_back(k <= warmup ? 100.0 * (1.0 + 0.8 * (warmup - k + 1) / warmup) : 100.0 + noise);
  }
  return out;
}

TEST(StepProjectionTest, settling_is_detected_at_each_synthetic_runs_warm_up_length) {
  for (int warmup = 0; warmup <= 5; ++warmup) {
    for (unsigned seed = 1; seed <= 5; ++seed) {
      const auto run = run_with_warmup(warmup, 20, seed);
      const double truth = std::accumulate(run.begin(), run.end(), 0.0);
      const auto detected = project_energy(reports_of(run, 12, 20), std::nullopt);
      // Epoch 1 is always skipped (warmup_epochs = 1): stable from the later of 1 and the warm-up.
      EXPECT_EQ(detected.stable_from_epoch, std::max(warmup, 1)) << "warm-up " << warmup << ", seed " << seed;
      EXPECT_EQ(detected.stable_epochs, 12 - std::max(warmup, 1));
      EXPECT_NEAR(detected.total.mean_joules, truth, 0.02 * truth) << "warm-up " << warmup;
      if (warmup >= 3) {
        // A fixed single warm-up epoch counts the rest of the warm-up as if it would go on.
        StepOptions fixed;
        fixed.detect_settling = false;
        const auto assumed = project_energy(reports_of(run, 12, 20), std::nullopt, fixed);
        EXPECT_EQ(assumed.stable_from_epoch, 1);
        EXPECT_GT(std::abs(assumed.total.mean_joules - truth), 2.0 * std::abs(detected.total.mean_joules - truth));
      }
    }
  }
}

TEST(StepProjectionTest, early_on_settling_is_judged_from_what_has_been_reported) {
  const auto run = run_with_warmup(3, 20, 7);
  // Epochs 2 and 3 reported: one stretch (1→2, still warm-up) and then 2→3: the later one is
  // the plateau as far as anyone knows, and the earlier lies outside 5 % of it.
  const auto two = project_energy(reports_of(run, 3, 20), std::nullopt);
  EXPECT_EQ(two.stable_from_epoch, 2);
  EXPECT_EQ(two.stable_epochs, 1);
  // Once the plateau has shown itself, the warm-up's epochs are left out.
  const auto later = project_energy(reports_of(run, 7, 20), std::nullopt);
  EXPECT_EQ(later.stable_from_epoch, 3);
}

TEST(StepProjectionTest, epochs_that_alternate_are_noise_not_a_warm_up) {
  // An evaluation every other epoch: 100 J and 140 J in turn from the start.
  std::vector<double> run;
  for (int k = 1; k <= 20; ++k) run.push_back(k % 2 ? 100.0 : 140.0);
  const auto projection = project_energy(reports_of(run, 11, 20), std::nullopt);
  EXPECT_EQ(projection.stable_from_epoch, 1);
  EXPECT_EQ(projection.stable_epochs, 10);
  EXPECT_NEAR(projection.total.mean_joules, 2400.0, 0.03 * 2400.0);
}

TEST(StepProjectionTest, warmup_epochs_is_a_floor_under_the_detection) {
  StepOptions options;
  options.warmup_epochs = 4;
  const auto projection = project_energy(reports_of(run_with_warmup(0, 20, 3), 10, 20), std::nullopt, options);
  EXPECT_EQ(projection.stable_from_epoch, 4);
  EXPECT_EQ(projection.stable_epochs, 6);
}

}  // namespace
}  // namespace joule::schedulers
