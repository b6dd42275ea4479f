#pragma once
// When a device's energy model no longer describes the device (docs/design.md, "Probing real
// devices"): finished jobs' metered energy is compared with their estimates. A job whose energy
// falls outside its estimate's own 2σ band counts as a miss; two misses among the last three
// jobs mean drift (one outlier is not enough: a job may do more than its spec says).
// The band is taken in log space, σ_log = ln(1 + std/mean), and is at least ±10 % wide so a
// very sure model is not re-probed for meter noise.

#include <cstddef>
#include <deque>

namespace joule::estimator {

class DriftDetector {
 public:
  struct Verdict {
    double relative_error = 0.0;  ///< (measured − mean) / mean
    bool miss = false;            ///< outside the 2σ band
    bool drift = false;           ///< enough recent misses to re-probe
  };

  /// One finished job; `mean` and `std` are its estimate's joules. Non-positive inputs are
  /// ignored (nothing is recorded and no drift is reported).
  Verdict observe(double measured_joules, double mean, double std);
  /// Forgets the window (after a re-probe the old misses say nothing about the new model).
  void reset() { window_.clear(); }
  std::size_t misses() const;

 private:
  static constexpr std::size_t kWindow = 3;
  static constexpr std::size_t kMissesForDrift = 2;
  std::deque<bool> window_;
};

}  // namespace joule::estimator
