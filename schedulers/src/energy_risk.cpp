#include "joule/schedulers/energy_risk.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace joule::schedulers {
namespace {

struct LogNormal {
  double mu = 0.0;
  double sigma = 0.0;
};

LogNormal matched(const EnergyDistribution& energy) {
  const double cv2 = energy.variance / (energy.mean_joules * energy.mean_joules);
  const double sigma2 = std::log1p(cv2);
  return {std::log(energy.mean_joules) - sigma2 / 2.0, std::sqrt(sigma2)};
}

// Acklam's rational approximation of the standard normal quantile, refined by one Newton step.
double normal_quantile(double p) {
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                                 1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                                 6.680131188771972e+01,  -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                                 -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                                 3.754408661907416e+00};
  double x = 0.0;
  if (p < 0.02425) {
    const double q = std::sqrt(-2.0 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0);
  } else if (p > 1.0 - 0.02425) {
    const double q = std::sqrt(-2.0 * std::log1p(-p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0);
  } else {
    const double q = p - 0.5;
    const double r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0);
  }
  const double e = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;
  const double u = e * std::sqrt(2.0 * M_PI) * std::exp(x * x / 2.0);
  return x - u / (1.0 + x * u / 2.0);
}

}  // namespace

double overrun_probability(const EnergyDistribution& energy, double limit_joules) {
  if (energy.mean_joules <= 0.0) return limit_joules < 0.0 ? 1.0 : 0.0;
  if (limit_joules <= 0.0) return 1.0;
  if (energy.variance <= 0.0) return energy.mean_joules > limit_joules ? 1.0 : 0.0;
  const LogNormal ln = matched(energy);
  const double z = (std::log(limit_joules) - ln.mu) / ln.sigma;
  return 0.5 * std::erfc(z / std::sqrt(2.0));
}

double quantile_above(const EnergyDistribution& energy, double probability) {
  if (energy.mean_joules <= 0.0) return 0.0;
  if (energy.variance <= 0.0) return energy.mean_joules;
  probability = std::clamp(probability, 1e-12, 1.0 - 1e-12);
  const LogNormal ln = matched(energy);
  return std::exp(ln.mu + ln.sigma * normal_quantile(1.0 - probability));
}

}  // namespace joule::schedulers
