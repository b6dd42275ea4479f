#pragma once
// What a job costs outside its training steps (process start, framework import, per-epoch data
// loading and evaluation), learnt from finished jobs as a line of its own: metered ≈ scale ×
// estimated steps + per_job + per_epoch × epochs, fitted on relative errors.
// Pure: samples in, the fitted line out.

#include <cstdint>
#include <optional>
#include <vector>

namespace joule::estimator {

/// One finished job: what its steps were estimated to cost, its epochs, and what it used in all
/// (joules or seconds, the same unit on both sides).
struct OverheadSample {
  double estimated = 0.0;
  std::int64_t epochs = 1;
  double metered = 0.0;
};

/// The fitted line.
struct JobOverhead {
  double per_job = 0.0;
  double per_epoch = 0.0;
  /// The steps' estimates were off by this factor on the samples: fitted beside the overhead so
  /// that a model that is a few per cent high or low is not taken for a start-up cost. Not
  /// applied with the overhead (the mean correction learns it).
  double scale = 1.0;
  /// False when the jobs' sizes vary too little against the estimates' own scatter to tell a
  /// start-up cost from a scale (errors in the estimates flatten the fitted slope and lift the
  /// intercept: 18 real jobs of ~30 s each gave "302 J per job, steps × 0.47" where the start
  /// was ~4 % of a job). The overhead is then 0 and the scale alone is fitted.
  bool separable = true;

  double at(std::int64_t epochs) const { return per_job + per_epoch * static_cast<double>(epochs < 1 ? 1 : epochs); }
};

/// Fits the line by least squares on relative errors (each job weighs alike, whatever its size),
/// with per_job and per_epoch at least 0 and the scale pulled lightly towards 1 (a prior worth
/// one job), so that jobs all of one size, where a start-up cost and a scale cannot be told
/// apart, give the scale 1 unless the data insist. When every sample has the same epochs, the
/// whole overhead is per_job. The overhead terms are kept only when the spread of ln(estimated)
/// is at least kSeparation times the scatter the fitted line leaves (SD of ln(metered / line))
/// and at least 5 % (JobOverhead::separable).
/// Nothing below 3 usable samples (every figure positive and finite).
inline constexpr double kSeparation = 3.0;
std::optional<JobOverhead> fit_job_overhead(const std::vector<OverheadSample>& samples);

}  // namespace joule::estimator
