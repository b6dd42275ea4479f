#include "joule/schedulers/step_projection.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace joule::schedulers {

namespace {

// Per-epoch energy and time between two reports.
struct Stretch {
  int from_epoch = 0;
  double epochs = 0.0;
  double per_epoch = 0.0;
  double seconds = 0.0;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// The index of the first stretch after power has settled: the latest stretches (the last half,
// at least two) give the plateau and its noise band; the stable run starts after the last
// earlier stretch outside the band.
std::size_t settled_from(const std::vector<Stretch>& stretches, double tolerance) {
  if (stretches.size() < 3) {
    // Two stretches: the later one is the plateau; the earlier counts if it lies within tolerance.
    if (stretches.size() == 2 &&
        std::abs(stretches[0].per_epoch - stretches[1].per_epoch) > tolerance * std::abs(stretches[1].per_epoch))
      return 1;
    return 0;
  }
  const std::size_t tail = std::max<std::size_t>(2, (stretches.size() + 1) / 2);
  std::vector<double> latest;
  for (std::size_t i = stretches.size() - tail; i < stretches.size(); ++i) latest.push_back(stretches[i].per_epoch);
  const double plateau = median(latest);
  // The latest stretches' own spread is the noise (epochs that alternate, e.g. with an
  // evaluation every other epoch, are noise too; a median deviation would call them settled
  // at one of the two values).
  double mean = 0.0;
  for (const double e : latest) mean += e / static_cast<double>(latest.size());
  double squares = 0.0;
  for (const double e : latest) squares += (e - mean) * (e - mean);
  const double noise = std::sqrt(squares / static_cast<double>(latest.size() - 1));
  const double band = std::max(tolerance * std::abs(plateau), 3.0 * noise);
  for (std::size_t i = stretches.size() - tail; i-- > 0;)
    if (std::abs(stretches[i].per_epoch - plateau) > band) return i + 1;
  return 0;
}

}  // namespace

Projection project_energy(const std::vector<EpochReport>& reports, std::optional<EnergyDistribution> prior,
                          const StepOptions& options) {
  Projection out;
  if (prior) out.total = *prior;

  std::vector<Stretch> stretches;
  const EpochReport* last = nullptr;
  const EpochReport* previous = nullptr;
  for (const auto& report : reports) {
    if (report.epochs <= 0 || report.epoch <= 0 || report.epoch > report.epochs) continue;
    if (previous && report.epoch <= previous->epoch) continue;
    if (previous && previous->epoch >= options.warmup_epochs) {
      const double epochs = report.epoch - previous->epoch;
      stretches.push_back({previous->epoch, epochs, (report.joules - previous->joules) / epochs,
                           static_cast<double>(report.at - previous->at) / 1000.0});
    }
    previous = &report;
    last = &report;
  }
  if (options.detect_settling && !stretches.empty())
    stretches.erase(stretches.begin(),
                    stretches.begin() + static_cast<std::ptrdiff_t>(settled_from(stretches, options.settle_tolerance)));

  // Per-epoch energy and time of each stable stretch, weighted by its epochs.
  double epochs_seen = 0.0;
  double sum = 0.0;
  double sum_sq = 0.0;
  double seconds = 0.0;
  for (const auto& stretch : stretches) {
    epochs_seen += stretch.epochs;
    sum += stretch.per_epoch * stretch.epochs;
    sum_sq += stretch.per_epoch * stretch.per_epoch * stretch.epochs;
    seconds += stretch.seconds;
  }
  const std::size_t stretch_count = stretches.size();
  if (!last || stretch_count == 0 || epochs_seen <= 0.0) return out;
  out.stable_from_epoch = stretches.front().from_epoch;

  const double mean = sum / epochs_seen;
  double variance = stretch_count >= 2 ? std::max(0.0, sum_sq / epochs_seen - mean * mean)
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
  out.total = {(prior->mean_joules * w_prior + step.mean_joules * w_step) / (w_prior + w_step),
               1.0 / (w_prior + w_step)};
  // Energy already metered is not uncertain: the total cannot fall below it.
  out.total.mean_joules = std::max(out.total.mean_joules, last->joules);
  out.method = "combined";
  return out;
}

}  // namespace joule::schedulers
