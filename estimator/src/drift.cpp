#include "joule/estimator/drift.hpp"

#include <algorithm>
#include <cmath>

namespace joule::estimator {

DriftDetector::Verdict DriftDetector::observe(double measured_joules, double mean, double std) {
  Verdict verdict;
  if (!(measured_joules > 0.0) || !(mean > 0.0) || !(std >= 0.0)) return verdict;
  verdict.relative_error = (measured_joules - mean) / mean;
  const double sigma_log = std::max(0.05, std::log1p(std / mean));
  verdict.miss = std::abs(std::log(measured_joules / mean)) > 2.0 * sigma_log;
  window_.push_back(verdict.miss);
  if (window_.size() > kWindow) window_.pop_front();
  verdict.drift = misses() >= kMissesForDrift;
  return verdict;
}

std::size_t DriftDetector::misses() const {
  return static_cast<std::size_t>(std::count(window_.begin(), window_.end(), true));
}

}  // namespace joule::estimator
