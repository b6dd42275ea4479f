#pragma once
// Exact Gaussian-Process regression: ARD Matérn-5/2 kernel plus white noise, hyperparameters by
// maximising the log marginal likelihood. The estimator's energy models are built from these
// (docs/design.md, "Estimation": one GP per layer kind and position, on log-scaled features
// and log energy); the GP itself is generic and knows nothing about layers or joules.
//
// Kernel (Rasmussen & Williams, "Gaussian Processes for Machine Learning", MIT Press 2006,
// eq. 4.17 with automatic relevance determination, one lengthscale per input):
//
//     k(x, x') = s² (1 + √5 r + 5 r² / 3) exp(−√5 r),   r² = Σ_d (x_d − x'_d)² / ℓ_d²
//     K        = [k(x_i, x_j)] + (σ_n² + jitter) I
//
// Hyperparameters live in log space, θ = [log ℓ_1 .. log ℓ_D, log s², log σ_n²], and are
// expressed in STANDARDISED units: inputs are centred and divided by their per-column standard
// deviation over the fit data (a column with no spread is only centred), targets likewise. So
// ℓ_d = 1 means "one standard deviation of feature d" and s² = 1 means "the variance of y".
//
// Log marginal likelihood of the standardised targets ỹ (R&W eq. 2.30, gradient eq. 5.9):
//
//     log p(ỹ | X, θ) = −½ ỹᵀ K⁻¹ ỹ − ½ log|K| − (n/2) log 2π
//     ∂/∂θ_j          = ½ tr((α αᵀ − K⁻¹) ∂K/∂θ_j),   α = K⁻¹ ỹ
//
// Prediction (R&W Algorithm 2.1) uses the Cholesky factor L of K: mean k*ᵀ α, latent variance
// k(x*, x*) − |L⁻¹ k*|². Both are returned in the caller's y units.
//
// Units: the caller's. x and y are taken as given (the estimator passes log features and log
// joules); means come back in y units, variances in y units squared. Far from all data the
// prediction falls back to the prior: mean = mean of y, latent variance = s² × y_scale².
//
// Costs: an LML evaluation with gradient is O(n³) (Cholesky, inverse; about n³ flops), a fit
// runs tens to hundreds of them; add_sample and a one-point predict are O(n²) and O(n² + nD).
// Memory: an n×n matrix is kept (32 MB at n = 2,000), and a fit uses two more.
//
// Thread safety: none inside. The const members (predict, log_marginal_likelihood, save, the
// accessors) touch no shared mutable state, so any number of threads may call them at once on
// an object that no thread is modifying. fit, fit_with and add_sample need exclusive access.
// No clocks, no I/O, no global state: the same inputs and seed give the same result.

#include <cstdint>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"

namespace joule::estimator {

/// Kernel hyperparameters, natural logs, in standardised units (see the file comment).
struct GpHyperparameters {
  Eigen::VectorXd log_lengthscales;  ///< log ℓ_d, one per input dimension
  double log_signal_variance = 0.0;  ///< log s²
  double log_noise_variance = -4.605170185988091;  ///< log σ_n² (default: σ_n² = 0.01)

  /// θ = [log ℓ_1 .. log ℓ_D, log s², log σ_n²], the vector the optimiser works on.
  Eigen::VectorXd theta() const;
  /// The inverse of theta(); `theta` must have at least 3 entries.
  static GpHyperparameters from_theta(const Eigen::VectorXd& theta);
};

/// How raw inputs and targets map to the standardised units the kernel works in:
/// x̃_d = (x_d − x_mean_d) / x_scale_d, ỹ = (y − y_mean) / y_scale.
struct GpScaling {
  Eigen::VectorXd x_mean;
  Eigen::VectorXd x_scale;  ///< per-column standard deviation; 1 where a column has no spread
  double y_mean = 0.0;
  double y_scale = 1.0;  ///< standard deviation of y; 1 if y is constant

  /// Means and population standard deviations of the columns of X and of y.
  static GpScaling from_data(const Eigen::MatrixXd& X, const Eigen::VectorXd& y);
};

/// How fit() searches for hyperparameters. Bounds and start ranges are in standardised units.
struct GpFitOptions {
  /// Random starts besides the deterministic default one (ℓ_d = 1, s² = 1, σ_n² = 0.01);
  /// restarts matter (measured: a fit without them fell into a noise-only optimum).
  /// Random starts draw log ℓ_d in [log 0.1, log 30], log s² in [log 0.1, log 10] and
  /// log σ_n² in [log 1e-4, log 0.3], uniformly, from std::mt19937_64 seeded with `seed`.
  int restarts = 3;
  std::uint64_t seed = 0;
  double min_lengthscale = 1e-2;
  double max_lengthscale = 1e3;
  double min_signal_variance = 1e-3;
  double max_signal_variance = 1e5;
  double min_noise_variance = 1e-6;
  double max_noise_variance = 10.0;
  /// L-BFGS-B iterations per start, and for each refinement step (below).
  int max_iterations = 100;
  /// A search stops when an iteration changes the mean per-sample LML by less than this
  /// fraction of it (L-BFGS-B's delta on −LML/n). 1e-6 is a few thousandths of a nat in total
  /// at n = 1,000-2,000: far below what moves predictions, and it spares the slow final crawl
  /// along the ridge where s² and the lengthscales grow together (half of all evaluations at
  /// large n with 1e-8).
  double relative_tolerance = 1e-6;
  /// Above this many samples the starts run on a random subset of `subset_size` samples, and
  /// the best point is then refined by L-BFGS-B on nested subsets of twice the size, up to all
  /// the data; the last step climbs the exact LML of all samples, so the subsets only decide
  /// where that climb starts (and restarts cost little at large n). 0: every start on all
  /// data, as scikit-learn does.
  Eigen::Index subset_size = 256;
  /// refit_due() turns true once size() reaches this factor times the sample count of the
  /// last optimisation.
  double refit_growth = 1.5;
};

/// What the last fit() did; for logs, metrics and benchmarks.
struct GpFitReport {
  double log_marginal_likelihood = 0.0;  ///< at the chosen θ, all data, standardised units
  int evaluations = 0;                   ///< LML + gradient evaluations, all sizes
  int full_data_evaluations = 0;         ///< of which on all n samples
  int failed_searches = 0;               ///< L-BFGS-B runs that stopped on an exception
};

/// One prediction in the caller's y units.
struct GpPrediction {
  double mean = 0.0;
  double variance = 0.0;             ///< of the latent function, ≥ 0
  double variance_with_noise = 0.0;  ///< of a new observation: variance + noise variance
};

/// Predictions at many points; entry i belongs to row i of the query matrix.
struct GpPredictions {
  Eigen::VectorXd mean;
  Eigen::VectorXd variance;
  Eigen::VectorXd variance_with_noise;
};

/// An exact GP regressor on n samples of D inputs. Copyable and movable.
///
/// Inputs X are n×D (one sample per row). Failures on bad data (empty, mismatched sizes,
/// NaN or infinity, a kernel matrix that stays indefinite after bounded jitter) come back as
/// an Error and leave the object unchanged. Calling predict on an empty GP, or with a query
/// of the wrong dimension, is a bug and throws std::invalid_argument.
class GaussianProcess {
 public:
  /// Standardises X and y, maximises the LML with analytic gradients (L-BFGS-B, box bounds,
  /// default start plus options.restarts seeded random starts, best kept; a start whose line
  /// search fails keeps the best point it reached; see subset_size for large n), then
  /// factorises K on all data.
  Status fit(const Eigen::MatrixXd& X, const Eigen::VectorXd& y, const GpFitOptions& options = {});

  /// Factorises K for given hyperparameters without optimising. `scaling` defaults to
  /// GpScaling::from_data(X, y). Does not change the sample count refit_due() compares against,
  /// unless hyperparameters were never set before.
  Status fit_with(const Eigen::MatrixXd& X, const Eigen::VectorXd& y, const GpHyperparameters& h,
                  const GpScaling* scaling = nullptr);

  /// Appends one sample in O(n²) by extending the Cholesky factor, keeping the current
  /// hyperparameters and scaling. Equal (to rounding) to fit_with on all samples with those.
  /// Needs a fitted GP. Check refit_due() afterwards.
  Status add_sample(const Eigen::VectorXd& x, double y);

  /// True when samples have grown by the refit_growth factor since the last optimisation.
  bool refit_due() const;

  /// Mean and variances at one point (`x` has dimensions() entries, raw units).
  GpPrediction predict(const Eigen::VectorXd& x) const;
  /// Mean and variances at each row of X (m×D), with one triangular solve for all rows.
  GpPredictions predict(const Eigen::MatrixXd& X) const;
  /// Any Eigen expression: a compile-time column (x.row(i).transpose(), VectorXd::Zero(d))
  /// is one point, anything else a matrix of points, one per row.
  template <class Derived>
  auto predict(const Eigen::MatrixBase<Derived>& x) const {
    if constexpr (Derived::ColsAtCompileTime == 1) {
      return predict(Eigen::VectorXd(x));
    } else {
      return predict(Eigen::MatrixXd(x));
    }
  }

  /// LML of the stored standardised data at θ (any θ of size D + 2, not only the stored one),
  /// and its gradient with respect to θ when `gradient` is not null. −∞ if K cannot be
  /// factorised even with jitter. Needs a fitted GP.
  double log_marginal_likelihood(const Eigen::VectorXd& theta, Eigen::VectorXd* gradient) const;

  /// Data (raw), scaling, hyperparameters, jitter and refit state as JSON ("joule.gp", v1).
  nlohmann::json save() const;
  /// Rebuilds a GP from save()'s output, refactorising K the way the original was built (one
  /// factorisation, then the rows added since), so predictions match the original.
  static Result<GaussianProcess> load(const nlohmann::json& json);

  Eigen::Index size() const { return n_; }
  Eigen::Index dimensions() const { return d_; }
  const GpHyperparameters& hyperparameters() const { return hyper_; }
  const GpScaling& scaling() const { return scaling_; }
  /// Diagonal jitter K needed on top of σ_n² to factorise (0 in the normal case).
  double jitter() const { return jitter_; }
  const GpFitReport& last_fit_report() const { return report_; }

 private:
  Status set_data(const Eigen::MatrixXd& X, const Eigen::VectorXd& y, const GpHyperparameters& h,
                  const GpScaling& scaling, double min_jitter);
  Status factorise(double min_jitter);
  void reserve(Eigen::Index capacity);
  void solve_alpha();

  Eigen::Index n_ = 0;
  Eigen::Index d_ = 0;
  // Storage has spare rows (capacity) so add_sample does not copy n² numbers each time; only
  // the leading n rows (and n×n block of chol_) are live.
  Eigen::MatrixXd x_raw_;   ///< samples as given
  Eigen::MatrixXd x_std_;   ///< standardised
  Eigen::MatrixXd z_;       ///< standardised and divided by the lengthscales
  Eigen::VectorXd y_raw_;
  Eigen::VectorXd y_std_;
  Eigen::MatrixXd chol_;    ///< lower Cholesky factor of K
  Eigen::VectorXd alpha_;   ///< K⁻¹ ỹ
  GpScaling scaling_;
  GpHyperparameters hyper_;
  double jitter_ = 0.0;
  Eigen::Index factorised_size_ = 0;  ///< samples in the last full factorisation; later ones appended
  Eigen::Index optimised_size_ = 0;
  double refit_growth_ = 1.5;
  GpFitReport report_;
};

}  // namespace joule::estimator
