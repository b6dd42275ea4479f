#include "joule/schedulers/step_projection.hpp"

#include <cmath>

namespace joule::schedulers {

Projection project_energy(const std::vector<EpochReport>& reports, std::optional<EnergyDistribution> prior,
                          const StepOptions& options) {
  Projection out;
  if (prior) out.total = *prior;

  // Per-epoch energy and time of each stable stretch between reports, weighted by its epochs.
  double epochs_seen = 0.0;
  double sum = 0.0;
  double sum_sq = 0.0;
  double seconds = 0.0;
  int stretches = 0;
  const EpochReport* last = nullptr;
  const EpochReport* previous = nullptr;
  for (const auto& report : reports) {
    if (report.epochs <= 0 || report.epoch <= 0 || report.epoch > report.epochs) continue;
    if (previous && report.epoch <= previous->epoch) continue;
    if (previous && previous->epoch >= options.warmup_epochs) {
      const double epochs = report.epoch - previous->epoch;
      const double per_epoch = (report.joules - previous->joules) / epochs;
      epochs_seen += epochs;
      sum += per_epoch * epochs;
      sum_sq += per_epoch * per_epoch * epochs;
      seconds += static_cast<double>(report.at - previous->at) / 1000.0;
      ++stretches;
    }
    previous = &report;
    last = &report;
  }
  if (!last || stretches == 0 || epochs_seen <= 0.0) return out;

  const double mean = sum / epochs_seen;
  double variance = stretches >= 2 ? std::max(0.0, sum_sq / epochs_seen - mean * mean)
                                   : std::pow(options.single_epoch_cv * mean, 2);
  variance = std::max(variance, std::pow(0.01 * mean, 2));  // identical epochs are luck, not certainty
  const double left = last->epochs - last->epoch;
  EnergyDistribution step{last->joules + left * mean, left * left * variance / epochs_seen + left * variance};
  out.step = step;
  out.stable_epochs = static_cast<int>(epochs_seen);
  out.seconds_remaining = left * seconds / epochs_seen;

  // No epochs left: the metered total is the answer. A prior without variance (a bare
  // max_energy_joules) carries no weight to combine with.
  if (!prior || left <= 0.0 || prior->variance <= 0.0) {
    out.total = step;
    out.method = "step";
    return out;
  }
  const double w_prior = 1.0 / prior->variance;
  const double w_step = 1.0 / step.variance;
  out.total = {(prior->mean_joules * w_prior + step.mean_joules * w_step) / (w_prior + w_step), 1.0 / (w_prior + w_step)};
  // Energy already metered is not uncertain: the total cannot fall below it.
  out.total.mean_joules = std::max(out.total.mean_joules, last->joules);
  out.method = "combined";
  return out;
}

}  // namespace joule::schedulers
