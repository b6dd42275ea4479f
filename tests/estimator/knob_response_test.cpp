#include "joule/estimator/knob_response.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using joule::estimator::KnobResponse;
using joule::estimator::KnobSample;
using joule::estimator::NetworkFeatures;

namespace {

// A made-up device: compute-bound networks (high intensity) slow by 1.4x and save 20 %,
// memory-bound ones barely change, with log-normal noise.
KnobSample sample(double flops, double intensity, std::mt19937& rng, double noise = 0.02) {
  std::normal_distribution<double> jitter(0.0, noise);
  const double bound = std::clamp(std::log10(intensity) / 2.0, 0.0, 1.0);  // 1 at 100 FLOPs/byte
  return {{flops, intensity}, (1.0 + 0.4 * bound) * std::exp(jitter(rng)), (1.0 - 0.2 * bound) * std::exp(jitter(rng))};
}

}  // namespace

TEST(KnobResponseTest, a_fit_on_some_networks_predicts_others_from_their_intensity) {
  std::mt19937 rng(3);
  std::vector<KnobSample> samples;
  for (double flops : {1e6, 1e7, 1e8, 1e9})
    for (double intensity : {1.0, 3.0, 10.0, 30.0, 100.0}) samples.push_back(sample(flops, intensity, rng));
  auto response = KnobResponse::fit(samples);
  ASSERT_TRUE(response) << response.error().message;
  EXPECT_EQ(response->samples(), 20u);
  const auto compute_bound = response->predict({5e8, 60.0});
  const auto memory_bound = response->predict({5e8, 1.5});
  EXPECT_GT(compute_bound.time_ratio, 1.25);
  EXPECT_LT(compute_bound.energy_ratio, 0.9);
  EXPECT_LT(memory_bound.time_ratio, 1.12);
  EXPECT_GT(memory_bound.energy_ratio, 0.93);
  // The spread is the residuals': the noise plus what a straight line misses of the clamp.
  EXPECT_GT(compute_bound.time_log_std, 0.01);
  EXPECT_LT(compute_bound.time_log_std, 0.1);
}

TEST(KnobResponseTest, too_few_or_broken_samples_are_refused_and_identical_features_still_give_the_mean) {
  std::vector<KnobSample> samples = {{{1e6, 10}, 1.2, 0.9}, {{1e6, 10}, 1.3, 0.8}, {{1e6, 10}, -1.0, 0.9}};
  auto refused = KnobResponse::fit(samples);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("4 measured networks, 2 usable"), std::string::npos);
  samples.push_back({{1e6, 10}, 1.25, 0.85});
  samples.push_back({{1e6, 10}, std::nan(""), 0.85});
  samples.push_back({{1e6, 10}, 1.25, 0.85});
  auto same = KnobResponse::fit(samples);
  ASSERT_TRUE(same) << same.error().message;
  const auto predicted = same->predict({1e6, 10});
  EXPECT_NEAR(predicted.time_ratio, std::exp((std::log(1.2) + std::log(1.3) + 2 * std::log(1.25)) / 4), 0.01);
  EXPECT_NEAR(predicted.energy_ratio, 0.85, 0.02);
}

TEST(KnobResponseTest, network_features_are_flops_per_step_and_per_byte) {
  joule::estimator::AnalyzedLayer a, b;
  a.cost.forward_flops = 600;
  a.cost.backward_flops = 1200;
  a.cost.activation_bytes = 100;
  b.cost.forward_flops = 200;
  b.cost.parameter_bytes = 100;
  const NetworkFeatures features = joule::estimator::network_features({a, b});
  EXPECT_DOUBLE_EQ(features.flops, 2000.0);
  EXPECT_DOUBLE_EQ(features.intensity, 10.0);
}

TEST(KnobResponseTest, a_network_unlike_every_probe_is_predicted_less_surely) {
  std::mt19937 rng(5);
  std::vector<KnobSample> samples;
  for (double flops : {1e6, 1e7, 1e8})
    for (double intensity : {1.0, 3.0, 10.0}) samples.push_back(sample(flops, intensity, rng));
  auto response = KnobResponse::fit(samples);
  ASSERT_TRUE(response) << response.error().message;
  const auto inside = response->predict({1e7, 3.0});
  const auto far = response->predict({1e12, 3000.0});
  EXPECT_GT(far.time_log_std, 3.0 * inside.time_log_std);
  EXPECT_GT(far.energy_log_std, 3.0 * inside.energy_log_std);
}

TEST(KnobResponseTest, under_a_power_limit_nothing_changes_and_over_it_nothing_speeds_up) {
  // Networks drawing more than 90 W slow the more the further over it they draw.
  std::mt19937 rng(9);
  std::normal_distribution<double> jitter(0.0, 0.01);
  std::vector<KnobSample> samples;
  for (double watts : {40.0, 60.0, 80.0, 100.0, 120.0, 140.0}) {
    const double over = std::max(0.0, std::log(watts / 90.0));
    samples.push_back({{1e8, 20.0, watts}, std::exp(0.9 * over + jitter(rng)), std::exp(-0.5 * over + jitter(rng))});
  }
  auto response = KnobResponse::fit(samples, 90.0);
  ASSERT_TRUE(response) << response.error().message;
  const auto under = response->predict({5e9, 50.0, 70.0});
  EXPECT_DOUBLE_EQ(under.time_ratio, 1.0);
  EXPECT_DOUBLE_EQ(under.energy_ratio, 1.0);
  const auto over = response->predict({1e8, 20.0, 130.0});
  EXPECT_NEAR(over.time_ratio, std::exp(0.9 * std::log(130.0 / 90.0)), 0.03);
  EXPECT_LT(over.energy_ratio, 0.9);
  EXPECT_GE(response->predict({1e8, 20.0, 95.0}).time_ratio, 1.0);
}
