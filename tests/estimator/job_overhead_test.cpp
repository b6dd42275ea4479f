#include "joule/estimator/job_overhead.hpp"

#include <cmath>
#include <random>

#include <gtest/gtest.h>

using joule::estimator::fit_job_overhead;
using joule::estimator::OverheadSample;

namespace {

// Jobs whose steps were estimated at `estimated` and really cost scale × that, plus a start-up
// cost and a cost per epoch, with log-normal noise of `noise`.
std::vector<OverheadSample> jobs(int count, double scale, double per_job, double per_epoch, double noise,
                                 bool vary_size = true, bool vary_epochs = true) {
  std::mt19937 random{11};
  std::uniform_real_distribution<double> size(std::log(40.0), std::log(4000.0));
  std::uniform_int_distribution<int> epochs(1, 8);
  std::normal_distribution<double> error(0.0, noise);
  std::vector<OverheadSample> out;
  for (int i = 0; i < count; ++i) {
    OverheadSample sample;
    sample.estimated = vary_size ? std::exp(size(random)) : 500.0;
    sample.epochs = vary_epochs ? epochs(random) : 3;
    sample.metered =
        (scale * sample.estimated + per_job + per_epoch * static_cast<double>(sample.epochs)) * std::exp(error(random));
    out.push_back(sample);
  }
  return out;
}

}  // namespace

TEST(JobOverheadTest, recovers_a_start_up_cost_a_cost_per_epoch_and_the_steps_scale) {
  // Exact data; the prior worth one job pulls the scale towards 1 by a few thousandths.
  const auto line = fit_job_overhead(jobs(40, 0.9, 60.0, 15.0, 0.0));
  ASSERT_TRUE(line);
  EXPECT_NEAR(line->scale, 0.9, 0.01);
  EXPECT_NEAR(line->per_job, 60.0, 1.5);
  EXPECT_NEAR(line->per_epoch, 15.0, 0.1);
  EXPECT_NEAR(line->at(4), 120.0, 1.5);
}

TEST(JobOverheadTest, noisy_jobs_give_the_overhead_within_the_noise) {
  const auto line = fit_job_overhead(jobs(60, 1.1, 80.0, 0.0, 0.05));
  ASSERT_TRUE(line);
  EXPECT_NEAR(line->scale, 1.1, 0.06);
  EXPECT_NEAR(line->at(1), 80.0, 25.0);
}

TEST(JobOverheadTest, jobs_of_one_size_fit_a_scale_and_no_overhead_since_the_two_cannot_be_told_apart) {
  const auto line = fit_job_overhead(jobs(10, 1.0, 100.0, 0.0, 0.0, /*vary_size=*/false, /*vary_epochs=*/false));
  ASSERT_TRUE(line);
  EXPECT_FALSE(line->separable);
  EXPECT_DOUBLE_EQ(line->at(3), 0.0);
  EXPECT_NEAR(line->scale, 1.2, 0.05);  // (500 + 100) / 500, pulled a little towards 1 by the prior
}

TEST(JobOverheadTest, sizes_that_vary_no_more_than_the_estimates_err_give_no_overhead) {
  // Real jobs sized to ~30 s each: sizes within ±20 %, estimates off by ±20 %. A line through
  // them would have a large intercept and a flat slope that no start-up cost explains.
  std::vector<OverheadSample> samples;
  std::mt19937 random{3};
  std::uniform_real_distribution<double> size(500.0, 800.0);
  std::normal_distribution<double> error(0.0, 0.2);
  for (int i = 0; i < 18; ++i) {
    const double truth = size(random);
    samples.push_back({truth * std::exp(error(random)), 1, truth + 25.0});
  }
  const auto line = fit_job_overhead(samples);
  ASSERT_TRUE(line);
  EXPECT_FALSE(line->separable);
  EXPECT_DOUBLE_EQ(line->per_job, 0.0);
}

TEST(JobOverheadTest, jobs_that_use_less_than_estimated_get_no_negative_overhead) {
  const auto line = fit_job_overhead(jobs(30, 0.7, 0.0, 0.0, 0.02));
  ASSERT_TRUE(line);
  EXPECT_GE(line->per_job, 0.0);
  EXPECT_GE(line->per_epoch, 0.0);
  EXPECT_NEAR(line->scale, 0.7, 0.05);
}

TEST(JobOverheadTest, too_few_usable_samples_fit_nothing) {
  EXPECT_FALSE(fit_job_overhead({}));
  EXPECT_FALSE(fit_job_overhead({{100.0, 1, 120.0}, {200.0, 1, 230.0}}));
  // Unusable samples do not count towards the three.
  EXPECT_FALSE(fit_job_overhead({{100.0, 1, 120.0}, {200.0, 1, 230.0}, {std::nan(""), 1, 5.0}, {100.0, 1, 0.0}}));
  EXPECT_TRUE(fit_job_overhead({{100.0, 1, 120.0}, {200.0, 1, 230.0}, {400.0, 1, 430.0}}));
}
