#include "joule/estimator/job_overhead.hpp"

#include <cmath>
#include <limits>

#include <Eigen/QR>

namespace joule::estimator {

namespace {

// The prior on the scale, in jobs: (scale − 1)² weighs as much as one job's squared relative
// error. Enough to settle jobs of one size; nothing against a few jobs of different sizes.
constexpr double kScalePriorWeight = 1.0;
constexpr std::size_t kMinSamples = 3;
// Jobs whose sizes spread less than this (SD of ln estimated) are of one size: no intercept.
constexpr double kMinSizeSpread = 0.05;

bool usable(const OverheadSample& sample) {
  return std::isfinite(sample.estimated) && sample.estimated > 0.0 && std::isfinite(sample.metered) &&
         sample.metered > 0.0 && sample.epochs >= 1;
}

struct Fit {
  JobOverhead line;
  double objective = std::numeric_limits<double>::infinity();
};

// Weighted least squares with the scale and the chosen overhead terms free, the others at 0.
std::optional<Fit> solve(const std::vector<OverheadSample>& samples, bool with_per_job, bool with_per_epoch) {
  const auto columns = static_cast<Eigen::Index>(1 + (with_per_job ? 1 : 0) + (with_per_epoch ? 1 : 0));
  const auto rows = static_cast<Eigen::Index>(samples.size() + 1);
  Eigen::MatrixXd design = Eigen::MatrixXd::Zero(rows, columns);
  Eigen::VectorXd target = Eigen::VectorXd::Ones(rows);
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const auto row = static_cast<Eigen::Index>(i);
    const double weight = 1.0 / samples[i].metered;  // relative error: metered / metered = 1
    Eigen::Index column = 0;
    design(row, column++) = samples[i].estimated * weight;
    if (with_per_job) design(row, column++) = weight;
    if (with_per_epoch) design(row, column++) = static_cast<double>(samples[i].epochs) * weight;
  }
  const double prior = std::sqrt(kScalePriorWeight);
  design(rows - 1, 0) = prior;
  target(rows - 1) = prior;
  const Eigen::ColPivHouseholderQR<Eigen::MatrixXd> qr(design);
  if (qr.rank() < columns) return std::nullopt;
  const Eigen::VectorXd solution = qr.solve(target);
  Fit fit;
  Eigen::Index column = 0;
  fit.line.scale = solution(column++);
  if (with_per_job) fit.line.per_job = solution(column++);
  if (with_per_epoch) fit.line.per_epoch = solution(column++);
  if (!(fit.line.scale > 0.0) || fit.line.per_job < 0.0 || fit.line.per_epoch < 0.0 || !solution.allFinite())
    return std::nullopt;
  fit.objective = (design * solution - target).squaredNorm();
  return fit;
}

}  // namespace

std::optional<JobOverhead> fit_job_overhead(const std::vector<OverheadSample>& samples) {
  std::vector<OverheadSample> kept;
  for (const auto& sample : samples)
    if (usable(sample)) kept.push_back(sample);
  if (kept.size() < kMinSamples) return std::nullopt;
  bool epochs_vary = false;
  for (const auto& sample : kept) epochs_vary = epochs_vary || sample.epochs != kept.front().epochs;

  // Non-negative least squares over two terms: the best of the solutions whose free terms came
  // out non-negative, over every choice of free terms (the true optimum is one of them).
  const auto best_of = [&](bool with_overhead) {
    std::optional<Fit> best;
    const auto consider = [&](bool with_per_job, bool with_per_epoch) {
      if (auto fit = solve(kept, with_per_job, with_per_epoch); fit && (!best || fit->objective < best->objective))
        best = fit;
    };
    consider(false, false);
    if (with_overhead) {
      consider(true, false);
      if (epochs_vary) {
        consider(false, true);
        consider(true, true);
      }
    }
    return best;
  };
  auto best = best_of(true);
  if (!best) return std::nullopt;
  // Errors in the estimates are errors in the regressor: unless the jobs' sizes spread well
  // beyond the scatter the line leaves, the slope is flattened and the intercept takes up the
  // difference. Then only the scale is fitted.
  const auto spread = [&](auto value) {
    double mean = 0.0, squares = 0.0;
    for (const auto& sample : kept) mean += value(sample) / static_cast<double>(kept.size());
    for (const auto& sample : kept) squares += (value(sample) - mean) * (value(sample) - mean);
    return std::sqrt(squares / static_cast<double>(kept.size()));
  };
  const JobOverhead line = best->line;
  const double sizes = spread([](const OverheadSample& s) { return std::log(s.estimated); });
  const double scatter = spread(
      [&](const OverheadSample& s) { return std::log(s.metered / (line.scale * s.estimated + line.at(s.epochs))); });
  if (sizes < std::max(kMinSizeSpread, kSeparation * scatter)) {
    best = best_of(false);
    if (!best) return std::nullopt;
    best->line.separable = false;
  }
  return best->line;
}

}  // namespace joule::estimator
