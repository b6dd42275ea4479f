#include "joule/schedulers/energy_risk.hpp"

#include <cmath>
#include <random>

#include <gtest/gtest.h>

namespace joule::schedulers {
namespace {

TEST(EnergyRiskTest, a_known_amount_overruns_only_a_smaller_limit) {
  const EnergyDistribution known{100.0, 0.0};
  EXPECT_EQ(overrun_probability(known, 100.0), 0.0);
  EXPECT_EQ(overrun_probability(known, 99.0), 1.0);
  EXPECT_EQ(overrun_probability(known, 0.0), 1.0);
  EXPECT_EQ(overrun_probability({0.0, 0.0}, 0.0), 0.0);
  EXPECT_EQ(quantile_above(known, 0.05), 100.0);
}

TEST(EnergyRiskTest, the_tail_is_that_of_a_log_normal_with_the_same_mean_and_variance) {
  // mean 100 J, std 20 J: sigma^2 = ln(1.04), mu = ln(100) - sigma^2/2.
  const EnergyDistribution energy = EnergyDistribution::from_std(100.0, 20.0);
  const double sigma = std::sqrt(std::log(1.04));
  const double mu = std::log(100.0) - sigma * sigma / 2.0;
  const double expected = 0.5 * std::erfc((std::log(140.0) - mu) / sigma / std::sqrt(2.0));
  EXPECT_NEAR(overrun_probability(energy, 140.0), expected, 1e-12);
  EXPECT_NEAR(overrun_probability(energy, 140.0), 0.036, 0.001);
  EXPECT_GT(overrun_probability(energy, 90.0), 0.5);
}

TEST(EnergyRiskTest, quantile_inverts_the_overrun_probability) {
  const EnergyDistribution energy = EnergyDistribution::from_std(5000.0, 2500.0);
  for (const double p : {0.001, 0.01, 0.05, 0.2, 0.5, 0.9}) {
    const double x = quantile_above(energy, p);
    EXPECT_NEAR(overrun_probability(energy, x), p, p * 1e-6) << "p=" << p;
  }
  EXPECT_GT(quantile_above(energy, 0.05), quantile_above(energy, 0.2));
}

TEST(EnergyRiskTest, a_sum_of_estimates_matches_monte_carlo_in_the_upper_tail) {
  // Three jobs a budget has reserved plus one being admitted, each log-normal.
  const double means[] = {400.0, 1200.0, 250.0, 900.0};
  const double stds[] = {80.0, 600.0, 25.0, 300.0};
  EnergyDistribution total;
  std::mt19937_64 rng(7);
  std::vector<std::lognormal_distribution<double>> parts;
  for (int i = 0; i < 4; ++i) {
    total = total + EnergyDistribution::from_std(means[i], stds[i]);
    const double s2 = std::log1p(stds[i] * stds[i] / (means[i] * means[i]));
    parts.emplace_back(std::log(means[i]) - s2 / 2.0, std::sqrt(s2));
  }
  const double limit = quantile_above(total, 0.05);
  const int samples = 200000;
  int over = 0;
  for (int n = 0; n < samples; ++n) {
    double sum = 0.0;
    for (auto& part : parts) sum += part(rng);
    over += sum > limit ? 1 : 0;
  }
  const double empirical = static_cast<double>(over) / samples;
  EXPECT_NEAR(empirical, 0.05, 0.01) << "Fenton-Wilkinson tail at the 5% quantile";
}

}  // namespace
}  // namespace joule::schedulers
