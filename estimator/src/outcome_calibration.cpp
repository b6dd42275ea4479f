#include "joule/estimator/outcome_calibration.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <Eigen/Cholesky>
#include <Eigen/Core>

namespace joule::estimator {

namespace {

// The job's size and shape: log estimated joules and seconds, log FLOPs per step, log steps.
constexpr std::size_t kBaseFeatures = 4;
// Then its work mix (WorkMix::shares), used where it lowers the leave-one-out error.
constexpr std::size_t kAllFeatures = kBaseFeatures + WorkMix::kFamilies;
// The RBF length on standardised features, for the base features: about the distance between
// two jobs that differ by one standard deviation in every feature, so one network's rows do not
// decide another's. With more features the same closeness spans a longer distance (√ of their
// count), so the length grows with it.
constexpr double kLengthScale = 2.0;
double length_scale(std::size_t features) {
  return kLengthScale * std::sqrt(static_cast<double>(features) / static_cast<double>(kBaseFeatures));
}
// A constant added to the kernel: the intercept (the rows' common ratio) is part of the same
// regression, lightly penalised, so leave-one-out stays exact in closed form.
constexpr double kInterceptVariance = 4.0;
// A job further than this many length scales from every row (where the nearest row's kernel
// weight is e⁻² of a twin's) is outside what the rows say: its mean is left as the model has it.
constexpr double kFarLengths = 2.0;
// The work mix is used where its leave-one-out error is below this share of the size features'
// own (replayed on the 18 jobs of an e2e_accuracy run, where no family was misjudged, the mix
// gained 0.02 points of 5.85 %: nothing to take more features for).
constexpr double kMixMargin = 0.95;
// Ridge penalties tried; the one with the lowest leave-one-out error is kept.
constexpr double kLambdas[] = {0.03, 0.1, 0.3, 1.0, 3.0};
// The log-space σ of an estimate is at least this (a model that claims 1 % is not trusted to).
constexpr double kMinLogSigma = 0.01;
// What a row's steps used is its metered joules less the overhead line, but at least this share
// of them: a small job the line over-explains still teaches a finite factor.
constexpr double kMinStepsShare = 0.05;

bool positive(double value) { return std::isfinite(value) && value > 0.0; }

std::vector<double> features_of(double joules, double seconds, double flops_per_step, std::int64_t steps,
                                const std::vector<double>& mix_shares) {
  std::vector<double> out{std::log(joules), std::log(seconds), std::log1p(std::max(flops_per_step, 0.0)),
                          std::log(static_cast<double>(std::max<std::int64_t>(steps, 1)))};
  out.insert(out.end(), mix_shares.begin(), mix_shares.end());
  return out;
}

// The σ of ln(X) for a log-normal X with this mean and standard deviation.
double log_sigma(double mean, double std) {
  const double ratio = std / mean;
  return std::max(std::sqrt(std::log1p(ratio * ratio)), kMinLogSigma);
}

// Over the leading `features` of each.
double distance(const std::vector<double>& a, const std::vector<double>& b, std::size_t features) {
  double squared = 0.0;
  for (std::size_t i = 0; i < features; ++i) squared += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(squared);
}

double kernel(const std::vector<double>& a, const std::vector<double>& b, std::size_t features) {
  const double d = distance(a, b, features) / length_scale(features);
  return std::exp(-d * d / 2.0) + kInterceptVariance;
}

// The conformal quantile: the ⌈(n + 1)·coverage⌉-th smallest score (the largest when there are
// too few scores for the guarantee).
double conformal_quantile(std::vector<double> scores, double coverage) {
  if (scores.empty()) return 1.0;
  std::sort(scores.begin(), scores.end());
  const auto rank = static_cast<std::size_t>(std::ceil((static_cast<double>(scores.size()) + 1.0) * coverage));
  return scores[std::min(rank, scores.size()) - 1];
}

}  // namespace

std::optional<WorkMix> work_mix(const std::vector<std::pair<std::string, double>>& joules_by_key) {
  WorkMix mix;
  double total = 0.0;
  for (const auto& [key, joules] : joules_by_key) {
    if (!positive(joules)) continue;
    total += joules;
    const std::string kind = key.substr(0, key.find('@'));
    if (kind.rfind("optimizer:", 0) == 0)
      mix.optimizer += joules;
    else if (kind.rfind("conv", 0) == 0)  // conv1d, conv2d, conv2d_grouped
      mix.convolution += joules;
    else if (kind == "linear")
      mix.linear += joules;
    else if (kind.rfind("lstm", 0) == 0 || kind.rfind("gru", 0) == 0)  // and their _bidirectional kinds
      mix.recurrent += joules;
    else if (kind == "multihead_attention" || kind == "transformer_encoder_layer")
      mix.attention += joules;
  }
  if (total <= 0.0) return std::nullopt;
  for (double* share : {&mix.convolution, &mix.linear, &mix.recurrent, &mix.attention, &mix.optimizer}) *share /= total;
  return mix;
}

bool OutcomeRow::usable() const {
  return positive(estimated_joules) && positive(estimated_seconds) && positive(metered_joules) &&
         std::isfinite(estimated_std) && estimated_std >= 0.0 && std::isfinite(flops_per_step) && steps > 0 &&
         epochs >= 1 && (!metered_seconds || std::isfinite(*metered_seconds));
}

bool OutcomeCalibration::add(OutcomeRow row) {
  if (!row.usable()) return false;
  rows_.push_back(std::move(row));
  if (rows_.size() > kMaxRows) rows_.erase(rows_.begin(), rows_.begin() + (rows_.size() - kMaxRows));
  refit();
  return true;
}

std::size_t OutcomeCalibration::add_all(std::vector<OutcomeRow> rows) {
  std::size_t kept = 0;
  for (auto& row : rows) {
    if (!row.usable()) continue;
    rows_.push_back(std::move(row));
    ++kept;
  }
  if (rows_.size() > kMaxRows) rows_.erase(rows_.begin(), rows_.begin() + (rows_.size() - kMaxRows));
  if (kept > 0) refit();
  return kept;
}

void OutcomeCalibration::refit() {
  summary_ = CalibrationSummary{};
  summary_.rows = rows_.size();
  inputs_.clear();
  weights_.clear();
  const std::size_t n = rows_.size();
  if (n < kMinRows) return;
  refit_seconds();

  // The overhead line, from every row and from every row but one (to score that row honestly).
  std::vector<OverheadSample> samples(n);
  for (std::size_t i = 0; i < n; ++i)
    samples[i] = {rows_[i].estimated_joules, rows_[i].epochs, rows_[i].metered_joules};
  summary_.overhead_joules = fit_job_overhead(samples);
  std::vector<double> overhead_left_out(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<OverheadSample> others = samples;
    others.erase(others.begin() + static_cast<std::ptrdiff_t>(i));
    if (const auto line = fit_job_overhead(others)) overhead_left_out[i] = line->at(rows_[i].epochs);
  }

  // The rows' mean work mix stands in for the rows (and jobs) whose estimates lost their layers.
  mean_mix_.assign(WorkMix::kFamilies, 0.0);
  std::size_t with_mix = 0;
  for (const auto& row : rows_) {
    if (!row.mix) continue;
    ++with_mix;
    const auto shares = row.mix->shares();
    for (std::size_t f = 0; f < shares.size(); ++f) mean_mix_[f] += shares[f];
  }
  for (auto& share : mean_mix_) share /= static_cast<double>(std::max<std::size_t>(with_mix, 1));

  // Standardised features, targets (what the steps used over what they were estimated to) and
  // the estimates' own log-space σ.
  std::vector<std::vector<double>> raw(n);
  Eigen::VectorXd y(static_cast<Eigen::Index>(n));
  std::vector<double> sigma(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& row = rows_[i];
    raw[i] = features_of(row.estimated_joules, row.estimated_seconds, row.flops_per_step, row.steps,
                         row.mix ? row.mix->shares() : mean_mix_);
    const double overhead = summary_.overhead_joules ? summary_.overhead_joules->at(row.epochs) : 0.0;
    const double steps_joules = std::max(row.metered_joules - overhead, kMinStepsShare * row.metered_joules);
    y(static_cast<Eigen::Index>(i)) = std::log(steps_joules / row.estimated_joules);
    sigma[i] = log_sigma(row.estimated_joules, row.estimated_std);
  }
  feature_mean_.assign(kAllFeatures, 0.0);
  feature_scale_.assign(kAllFeatures, 0.0);
  for (const auto& x : raw)
    for (std::size_t f = 0; f < kAllFeatures; ++f) feature_mean_[f] += x[f] / static_cast<double>(n);
  for (const auto& x : raw)
    for (std::size_t f = 0; f < kAllFeatures; ++f)
      feature_scale_[f] += (x[f] - feature_mean_[f]) * (x[f] - feature_mean_[f]) / static_cast<double>(n);
  for (auto& scale : feature_scale_) scale = scale > 1e-12 ? std::sqrt(scale) : 1.0;
  inputs_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    inputs_[i].resize(kAllFeatures);
    for (std::size_t f = 0; f < kAllFeatures; ++f) inputs_[i][f] = (raw[i][f] - feature_mean_[f]) / feature_scale_[f];
  }

  // Kernel ridge regression with exact leave-one-out: with M = K + λI and α = M⁻¹y, the
  // residual of row i predicted from the others is α_i / (M⁻¹)_ii. A row's prediction is its
  // steps' estimate times the learnt factor plus the overhead fitted without it. Tried on the
  // size and shape alone, then with the work mix (only where some row knows its mix).
  double raw_error = 0.0;
  for (const auto& row : rows_) raw_error += std::abs(row.estimated_joules - row.metered_joules) / row.metered_joules;
  raw_error /= static_cast<double>(n);
  double best_error = std::numeric_limits<double>::infinity();
  Eigen::VectorXd best_alpha;
  std::vector<double> best_predicted(n, 0.0);
  features_used_ = kBaseFeatures;
  std::vector<std::size_t> feature_sets{kBaseFeatures};
  if (with_mix > 0) feature_sets.push_back(kAllFeatures);
  for (const std::size_t features : feature_sets) {
    Eigen::MatrixXd gram(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(n));
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j <= i; ++j)
        gram(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)) =
            gram(static_cast<Eigen::Index>(j), static_cast<Eigen::Index>(i)) = kernel(inputs_[i], inputs_[j], features);
    for (const double lambda : kLambdas) {
      Eigen::MatrixXd m = gram;
      m.diagonal().array() += lambda;
      const Eigen::LLT<Eigen::MatrixXd> llt(m);
      if (llt.info() != Eigen::Success) continue;
      const Eigen::VectorXd alpha = llt.solve(y);
      const Eigen::MatrixXd inverse = llt.solve(Eigen::MatrixXd::Identity(m.rows(), m.cols()));
      double error = 0.0;
      std::vector<double> predicted(n);
      for (std::size_t i = 0; i < n; ++i) {
        const auto k = static_cast<Eigen::Index>(i);
        const double left_out = y(k) - alpha(k) / inverse(k, k);  // the factor's log without row i
        predicted[i] = rows_[i].estimated_joules * std::exp(left_out) + overhead_left_out[i];
        error += std::abs(predicted[i] - rows_[i].metered_joules) / rows_[i].metered_joules;
      }
      error /= static_cast<double>(n);
      // Five more features must earn their place: the mix is taken only where it lowers the
      // error by kMixMargin, not by the noise of choosing among ten fits on a few rows.
      const bool better = features == kBaseFeatures ? error < best_error : error < kMixMargin * best_error;
      if (better) {
        best_error = error;
        best_alpha = alpha;
        best_predicted = std::move(predicted);
        lambda_ = lambda;
        features_used_ = features;
      }
    }
  }
  summary_.raw_error = raw_error;
  if (std::isfinite(best_error)) {
    summary_.corrected_error = best_error;
    summary_.correction_active = best_error < raw_error;
  }
  if (summary_.correction_active) {
    weights_.assign(best_alpha.data(), best_alpha.data() + best_alpha.size());
    summary_.uses_work_mix = features_used_ > kBaseFeatures;
  }

  // Conformal scores: the residual the new estimates will have (corrected or raw), over σ.
  std::vector<double> scores(n);
  std::size_t raw_covered = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double raw_residual = std::log(rows_[i].metered_joules / rows_[i].estimated_joules);
    const double residual =
        summary_.correction_active ? std::log(rows_[i].metered_joules / best_predicted[i]) : raw_residual;
    scores[i] = std::abs(residual) / sigma[i];
    if (std::abs(raw_residual) <= 2.0 * sigma[i]) ++raw_covered;
  }
  // Leave-one-out coverage of the calibrated band: row i against the scale of the others.
  std::size_t calibrated_covered = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<double> others;
    others.reserve(n - 1);
    for (std::size_t j = 0; j < n; ++j)
      if (j != i) others.push_back(scores[j]);
    if (scores[i] <= conformal_quantile(std::move(others), kCoverage)) ++calibrated_covered;
  }
  summary_.raw_coverage = static_cast<double>(raw_covered) / static_cast<double>(n);
  summary_.calibrated_coverage = static_cast<double>(calibrated_covered) / static_cast<double>(n);
  // ±2σ·scale is to hold the quantile score: scale = q / 2.
  summary_.sigma_scale = std::max(conformal_quantile(scores, kCoverage) / 2.0, 0.05);
}

void OutcomeCalibration::refit_seconds() {
  std::vector<OverheadSample> samples;
  for (const auto& row : rows_)
    if (row.metered_seconds && positive(*row.metered_seconds))
      samples.push_back({row.estimated_seconds, row.epochs, *row.metered_seconds});
  if (samples.size() < kMinRows) return;
  summary_.overhead_seconds = fit_job_overhead(samples);
  double raw_error = 0.0;
  double corrected_error = 0.0;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    std::vector<OverheadSample> others = samples;
    others.erase(others.begin() + static_cast<std::ptrdiff_t>(i));
    const auto line = fit_job_overhead(others);
    const double corrected =
        line ? line->scale * samples[i].estimated + line->at(samples[i].epochs) : samples[i].estimated;
    raw_error += std::abs(samples[i].estimated - samples[i].metered) / samples[i].metered;
    corrected_error += std::abs(corrected - samples[i].metered) / samples[i].metered;
  }
  summary_.seconds_raw_error = raw_error / static_cast<double>(samples.size());
  summary_.seconds_corrected_error = corrected_error / static_cast<double>(samples.size());
  summary_.seconds_correction_active =
      summary_.overhead_seconds && *summary_.seconds_corrected_error < *summary_.seconds_raw_error;
}

Calibrated OutcomeCalibration::apply(double estimated_joules, double estimated_std, double estimated_seconds,
                                     double flops_per_step, std::int64_t steps, std::int64_t epochs,
                                     const std::optional<WorkMix>& mix) const {
  Calibrated out{{estimated_joules, estimated_std}, 1.0, 1.0};
  out.seconds = estimated_seconds;
  if (rows_.size() < kMinRows || !positive(estimated_joules) || !positive(estimated_seconds)) return out;
  double log_shift = 0.0;
  if (summary_.correction_active) {
    const auto raw =
        features_of(estimated_joules, estimated_seconds, flops_per_step, steps, mix ? mix->shares() : mean_mix_);
    std::vector<double> x(kAllFeatures);
    for (std::size_t f = 0; f < kAllFeatures; ++f) x[f] = (raw[f] - feature_mean_[f]) / feature_scale_[f];
    double nearest = std::numeric_limits<double>::infinity();
    for (const auto& input : inputs_) nearest = std::min(nearest, distance(x, input, features_used_));
    out.far_from_rows = nearest > kFarLengths * length_scale(features_used_);
    if (!out.far_from_rows) {
      for (std::size_t i = 0; i < inputs_.size(); ++i) log_shift += weights_[i] * kernel(x, inputs_[i], features_used_);
      if (summary_.overhead_joules) out.overhead_joules = summary_.overhead_joules->at(epochs);
    }
  }
  out.joules.mean = estimated_joules * std::exp(log_shift) + out.overhead_joules;
  out.mean_factor = out.joules.mean / estimated_joules;
  out.sigma_scale = summary_.sigma_scale;
  const double sigma = log_sigma(estimated_joules, std::max(estimated_std, 0.0)) * out.sigma_scale;
  out.joules.std = out.joules.mean * std::sqrt(std::expm1(sigma * sigma));
  if (summary_.seconds_correction_active) {
    const auto& line = *summary_.overhead_seconds;
    out.overhead_seconds = line.at(epochs);
    out.seconds = line.scale * estimated_seconds + out.overhead_seconds;
  }
  return out;
}

}  // namespace joule::estimator
