#pragma once
// The chance that uncertain energy overruns what is left of a budget.
//
// An estimate is a mean and a standard deviation of joules. Energy is positive and its error
// multiplicative (the estimator works on log joules), so an estimate is read as a log-normal
// with the same mean and variance. A sum of independent estimates (the jobs a budget has
// reserved plus the one being admitted) is again matched to a log-normal by its mean and
// variance (Fenton-Wilkinson, 1960), which is accurate in the upper tail that admission reads.

namespace joule::schedulers {

/// Mean and variance of an amount of energy in joules (or, scaled, of the grams or money it
/// stands for in a budget's unit); variance 0 means a known amount.
struct EnergyDistribution {
  double mean_joules = 0.0;
  double variance = 0.0;

  static EnergyDistribution from_std(double mean_joules, double std_joules) {
    return {mean_joules, std_joules * std_joules};
  }
  /// The same amount counted at `rate` per joule (grams, money).
  EnergyDistribution scaled(double rate) const { return {mean_joules * rate, variance * rate * rate}; }
  /// The sum with an independent amount.
  EnergyDistribution operator+(const EnergyDistribution& other) const {
    return {mean_joules + other.mean_joules, variance + other.variance};
  }
};

/// P(X > limit_joules) for X log-normal with the distribution's mean and variance.
/// A known amount gives 0 or 1; any amount overruns a limit <= 0 (unless it is 0).
double overrun_probability(const EnergyDistribution& energy, double limit_joules);

/// The amount x with P(X > x) = probability (0 < probability < 1): what is needed to hold at
/// that risk.
double quantile_above(const EnergyDistribution& energy, double probability);

}  // namespace joule::schedulers
