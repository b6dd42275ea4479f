#pragma once
// STEP: projecting a running job's total energy from its stable epochs (seed 003, "Stable
// Training Epoch Projection"), combined with the estimate it was placed with.
//
// A job reports "epoch k of N done"; the daemon notes the job's metered energy at each report.
// Epochs before power has settled are skipped (data loading, JIT, cache and clock warm-up make
// them unrepresentative; the seed finds over 90 % of runs settled by epoch 4). At least the
// first `warmup_epochs` are skipped; after them, settling is detected rather than assumed: the
// per-epoch energies of the latest stretches (the last half, at least two) give a plateau (their
// median) and a noise band (the larger of `settle_tolerance` of the plateau and 3 of their
// standard deviations), and the stable epochs start after the last earlier stretch outside
// that band. The projection says which epoch they start from. From the stable epochs'
// energies e_i (mean m, sample variance s², n of them) the total is projected as
//   E = J(k) + (N - k) m,   Var E = (N - k)² s² / n + (N - k) s²
// (uncertainty of the mean plus epoch-to-epoch spread). With one stable epoch, s is taken as
// `single_epoch_cv` × m. The projection and the prior estimate are combined weighting each by
// the inverse of its variance, so a few noisy epochs move a sure prior little and many steady
// epochs override a vague one. Pure.

#include <optional>
#include <vector>

#include "joule/schedulers/energy_risk.hpp"
#include "joule/schedulers/time_format.hpp"

namespace joule::schedulers {

/// One progress report: `epoch` epochs of `epochs` are done; `joules` metered since the start.
struct EpochReport {
  int epoch = 0;
  int epochs = 0;
  double joules = 0.0;
  UnixMillis at = 0;
};

struct StepOptions {
  int warmup_epochs = 1;           ///< skipped always; settling is detected after them
  bool detect_settling = true;     ///< false: exactly `warmup_epochs` are skipped
  double settle_tolerance = 0.05;  ///< per-epoch energies this close to the plateau are settled
  double single_epoch_cv = 0.1;
};

struct Projection {
  EnergyDistribution total;                ///< the combined projection of the whole job's energy
  std::optional<EnergyDistribution> step;  ///< STEP's own projection, once there are stable epochs
  double seconds_remaining = 0.0;          ///< from the stable epochs' pace; 0 if unknown
  int stable_epochs = 0;
  /// The epoch the stable stretch starts after (epochs after it count); 0 before there is one.
  int stable_from_epoch = 0;
  /// "prior" (no stable epoch yet), "step" (no prior), or "combined".
  const char* method = "prior";
};

/// Projects from the reports so far (in the order received; out-of-order or repeated epochs
/// are ignored). `prior` is the placement estimate, if the job had one.
Projection project_energy(const std::vector<EpochReport>& reports, std::optional<EnergyDistribution> prior,
                          const StepOptions& options = {});

}  // namespace joule::schedulers
