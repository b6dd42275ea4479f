#include "joule/estimator/gaussian_process.hpp"

#include <LBFGSB.h>
#if JOULE_GP_CBLAS
#include <cblas.h>
#endif

#include <Eigen/Cholesky>
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace joule::estimator {
namespace {

using Eigen::ArrayXd;
using Eigen::Index;
using Eigen::MatrixXd;
using Eigen::Ref;
using Eigen::VectorXd;

constexpr double kSqrt5 = 2.23606797749978969641;
constexpr double kLog2Pi = 1.83787706640934548356;
constexpr double kInf = std::numeric_limits<double>::infinity();
// Triangular blocks at most this big are inverted / multiplied by plain loops; above it the
// work is split in two and done with Eigen's blocked products, as LAPACK's recursive variants.
constexpr Index kBlock = 48;
// Jitter ladder when K is not numerically positive definite: 0, then 1e-10 s², ×100 per try.
constexpr int kJitterTries = 5;
constexpr double kFirstJitter = 1e-10;
constexpr double kJitterStep = 100.0;
// First step (log units) when refining an optimum found on a subset on a bigger one.
constexpr double kRefineStep = 0.1;
// Returned to L-BFGS-B where K cannot be factorised: far worse than any real −LML/n.
constexpr double kPenalty = 1e30;

// Scratch buffers of one LML evaluation, reused across evaluations of the same data size.
struct Workspace {
  MatrixXd k;   // K, then its Cholesky factor, then K⁻¹ (lower triangles only)
  MatrixXd g;   // (5/3) s² (1 + √5 r) e^{−√5 r}, the lengthscale-gradient factor (lower)
  MatrixXd z;   // inputs divided by the lengthscales
  ArrayXd r2, r, e, w;
  VectorXd alpha;

  void resize(Index n) {
    if (k.rows() != n) k.resize(n, n);
    if (r2.size() != n) {
      r2.resize(n);
      r.resize(n);
      e.resize(n);
      w.resize(n);
    }
  }
};

// r² from row b of z to rows b..n−1, in the first n−b slots of ws.r2.
void distances_below(const Ref<const MatrixXd>& z, Index b, Workspace& ws) {
  const Index m = z.rows() - b;
  auto r2 = ws.r2.head(m);
  r2.setZero();
  for (Index j = 0; j < z.cols(); ++j) r2 += (z.col(j).segment(b, m).array() - z(b, j)).square();
}

// Lower triangle of the noiseless kernel matrix plus `diagonal` on the diagonal; with `g`, also
// the lower triangle of the lengthscale-gradient factor (so the gradient needs no second exp).
void fill_kernel(const Ref<const MatrixXd>& z, double s2, double diagonal, Ref<MatrixXd> k, Workspace& ws,
                 MatrixXd* g) {
  const Index n = z.rows();
  for (Index b = 0; b < n; ++b) {
    const Index m = n - b;
    distances_below(z, b, ws);
    auto r2 = ws.r2.head(m);
    auto r = ws.r.head(m);
    auto e = ws.e.head(m);
    r = r2.sqrt();
    e = s2 * (-kSqrt5 * r).exp();
    k.col(b).segment(b, m).array() = (1.0 + kSqrt5 * r + (5.0 / 3.0) * r2) * e;
    k(b, b) += diagonal;
    if (g != nullptr) g->col(b).segment(b, m).array() = (5.0 / 3.0) * (1.0 + kSqrt5 * r) * e;
  }
}

// Kernel between every row of z and one point zq (already divided by the lengthscales).
void kernel_vector(const Ref<const MatrixXd>& z, const VectorXd& zq, double s2, Ref<VectorXd> out) {
  ArrayXd r2 = ArrayXd::Zero(z.rows());
  for (Index j = 0; j < z.cols(); ++j) r2 += (z.col(j).array() - zq(j)).square();
  const ArrayXd r = r2.sqrt();
  out.array() = s2 * (1.0 + kSqrt5 * r + (5.0 / 3.0) * r2) * (-kSqrt5 * r).exp();
}

// Fills K (lower) and factorises it in place; climbs the jitter ladder from `min_jitter` while
// the factorisation fails. Returns the jitter used, or a negative number if every try failed.
double factorise_kernel(const Ref<const MatrixXd>& z, double s2, double sn2, double min_jitter, Ref<MatrixXd> k,
                        Workspace& ws, MatrixXd* g = nullptr) {
  double jitter = min_jitter;
  for (int attempt = 0; attempt < kJitterTries; ++attempt) {
    fill_kernel(z, s2, sn2 + jitter, k, ws, g);
    Eigen::LLT<Ref<MatrixXd>, Eigen::Lower> llt(k);
    if (llt.info() == Eigen::Success && k.diagonal().allFinite()) return jitter;
    jitter = jitter > 0.0 ? jitter * kJitterStep : kFirstJitter * s2;
  }
  return -1.0;
}

// a ← a⁻¹ for lower-triangular a (LAPACK dtrtri, recursive; about n³/3 flops).
void invert_lower(Ref<MatrixXd> a) {
  const Index n = a.rows();
  if (n <= kBlock) {
    for (Index j = n - 1; j >= 0; --j) {
      a(j, j) = 1.0 / a(j, j);
      // Column j below the diagonal: −a⁻¹(j,j) × (already inverted trailing block) × column j,
      // bottom-up so that each entry still reads the old values above it.
      for (Index i = n - 1; i > j; --i) {
        double s = 0.0;
        for (Index q = j + 1; q <= i; ++q) s += a(i, q) * a(q, j);
        a(i, j) = -a(j, j) * s;
      }
    }
    return;
  }
  const Index n1 = n / 2;
  const Index n2 = n - n1;
  auto top = a.topLeftCorner(n1, n1);
  auto bottom = a.bottomLeftCorner(n2, n1);
  auto corner = a.bottomRightCorner(n2, n2);
  // [A 0; B C]⁻¹ = [A⁻¹ 0; −C⁻¹ B A⁻¹  C⁻¹]
  top.triangularView<Eigen::Lower>().solveInPlace<Eigen::OnTheRight>(bottom);
  corner.triangularView<Eigen::Lower>().solveInPlace(bottom);
  bottom = -bottom;
  invert_lower(top);
  invert_lower(corner);
}

// lower(a) ← lower(aᵀ a) for lower-triangular a (LAPACK dlauum, recursive; about n³/3 flops).
// With a = L⁻¹ this turns the inverse Cholesky factor into K⁻¹ = L⁻ᵀ L⁻¹.
void lower_gram(Ref<MatrixXd> a) {
  const Index n = a.rows();
  if (n <= kBlock) {
    // Row i of the result needs rows ≥ i of a only, so rows are overwritten top-down.
    for (Index i = 0; i < n; ++i) {
      const double aii = a(i, i);
      const Index below = n - i - 1;
      a(i, i) = a.col(i).tail(below + 1).squaredNorm();
      for (Index j = 0; j < i; ++j) {
        a(i, j) = aii * a(i, j) + a.col(i).tail(below).dot(a.col(j).tail(below));
      }
    }
    return;
  }
  const Index n1 = n / 2;
  const Index n2 = n - n1;
  auto top = a.topLeftCorner(n1, n1);
  auto bottom = a.bottomLeftCorner(n2, n1);
  auto corner = a.bottomRightCorner(n2, n2);
  // [A 0; B C]ᵀ [A 0; B C] = [AᵀA + BᵀB, ·; CᵀB, CᵀC]
  lower_gram(top);
  top.selfadjointView<Eigen::Lower>().rankUpdate(bottom.transpose());
  bottom = corner.triangularView<Eigen::Lower>().transpose() * bottom;
  lower_gram(corner);
}

// LML of standardised targets ys at θ, and optionally its gradient (R&W eqs. 2.30, 5.9).
// −∞ when K cannot be factorised or θ gives non-finite numbers.
double lml_with_gradient(const Ref<const MatrixXd>& xs, const Ref<const VectorXd>& ys, const VectorXd& theta,
                         VectorXd* gradient, Workspace& ws) {
  const Index n = xs.rows();
  const Index d = xs.cols();
  if (gradient != nullptr) gradient->setZero(d + 2);
  if (!theta.allFinite()) return -kInf;
  const double s2 = std::exp(theta(d));
  const double sn2 = std::exp(theta(d + 1));
  ws.resize(n);
  ws.z.noalias() = xs * (-theta.head(d).array()).exp().matrix().asDiagonal();
  if (!ws.z.allFinite() || !std::isfinite(s2) || !std::isfinite(sn2)) return -kInf;
  if (gradient != nullptr && ws.g.rows() != n) ws.g.resize(n, n);
  const double jitter = factorise_kernel(ws.z, s2, sn2, 0.0, ws.k, ws, gradient != nullptr ? &ws.g : nullptr);
  if (jitter < 0.0) return -kInf;

  ws.alpha = ys;
  ws.k.triangularView<Eigen::Lower>().solveInPlace(ws.alpha);
  const double fit_term = ws.alpha.squaredNorm();  // ỹᵀ K⁻¹ ỹ
  ws.k.triangularView<Eigen::Lower>().transpose().solveInPlace(ws.alpha);
  const double log_det_half = ws.k.diagonal().array().log().sum();
  const double lml = -0.5 * fit_term - log_det_half - 0.5 * static_cast<double>(n) * kLog2Pi;
  if (gradient == nullptr || !std::isfinite(lml)) return lml;

  invert_lower(ws.k);
  lower_gram(ws.k);  // lower(ws.k) = K⁻¹
  // ∂LML/∂θ_j = ½ tr(W ∂K/∂θ_j), W = ααᵀ − K⁻¹. With K = K̂ + c I (c = σ_n² + jitter, K̂ the
  // noiseless kernel) and Kα = ỹ, the two variance terms need only traces:
  //   ∂K/∂log s² = K̂:       ½ (ỹᵀα − c |α|² − n + c tr K⁻¹)
  //   ∂K/∂log σ_n² = σ_n² I: ½ σ_n² (|α|² − tr K⁻¹)
  // ∂k/∂log ℓ_j = g(r) Δ_j²/ℓ_j² (g as in fill_kernel) is summed over the lower triangle,
  // off-diagonal entries twice; on the diagonal Δ = 0.
  VectorXd& g = *gradient;
  const double c = sn2 + jitter;
  const double trace_inverse = ws.k.diagonal().sum();
  const double alpha2 = ws.alpha.squaredNorm();
  g(d) = 0.5 * (ys.dot(ws.alpha) - c * alpha2 - static_cast<double>(n) + c * trace_inverse);
  g(d + 1) = 0.5 * sn2 * (alpha2 - trace_inverse);
  for (Index b = 0; b + 1 < n; ++b) {
    const Index m = n - b - 1;  // rows strictly below the diagonal
    auto w = ws.w.head(m);
    w = (ws.alpha(b) * ws.alpha.tail(m).array() - ws.k.col(b).tail(m).array()) * ws.g.col(b).tail(m).array();
    for (Index j = 0; j < d; ++j) g(j) += (w * (ws.z.col(j).tail(m).array() - ws.z(b, j)).square()).sum();
  }
  return lml;
}

// −LML/n and its gradient for L-BFGS-B, remembering the best point it was ever asked about, so
// a search that throws (line-search failure) still leaves its best point behind.
class NegativeLml {
 public:
  NegativeLml(const MatrixXd& xs, const VectorXd& ys) : xs_(xs), ys_(ys) {}

  double operator()(const VectorXd& theta, VectorXd& grad) {
    ++evaluations_;
    const double lml = lml_with_gradient(xs_, ys_, theta, &gradient_, ws_);
    if (!std::isfinite(lml) || !gradient_.allFinite()) {
      grad.setZero(theta.size());
      return kPenalty;
    }
    const double scale = 1.0 / static_cast<double>(xs_.rows());
    grad = -scale * gradient_;
    const double value = -scale * lml;
    if (value < best_value_) {
      best_value_ = value;
      best_theta_ = theta;
    }
    return value;
  }

  bool found() const { return best_value_ < kPenalty; }
  const VectorXd& best_theta() const { return best_theta_; }
  int evaluations() const { return evaluations_; }

 private:
  const MatrixXd& xs_;
  const VectorXd& ys_;
  Workspace ws_;
  VectorXd gradient_;
  VectorXd best_theta_;
  double best_value_ = kPenalty;
  int evaluations_ = 0;
};

// One bounded search from `start`; false if L-BFGS-B threw (the objective keeps the best point
// anyway). L-BFGS-B's first step has unit length; the search runs on u = (θ − start) / first_step
// so that a refinement from a nearly optimal start does not first jump by e in every scale.
bool search(NegativeLml& objective, const VectorXd& start, double first_step, const VectorXd& lower,
            const VectorXd& upper, const GpFitOptions& options) {
  LBFGSpp::LBFGSBParam<double> param;
  param.m = 8;
  param.epsilon = 1e-6 * first_step;  // the same projected-gradient test in θ units
  param.epsilon_rel = 0.0;
  param.past = 1;
  param.delta = options.relative_tolerance;
  param.max_iterations = options.max_iterations;
  LBFGSpp::LBFGSBSolver<double> solver(param);
  const auto scaled = [&](const VectorXd& u, VectorXd& grad) {
    const double value = objective(start + first_step * u, grad);
    grad *= first_step;
    return value;
  };
  VectorXd u = VectorXd::Zero(start.size());
  const VectorXd lower_u = (lower - start) / first_step;
  const VectorXd upper_u = (upper - start) / first_step;
  double value = 0.0;
  try {
    solver.minimize(scaled, u, value, lower_u, upper_u);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

Status check_finite_data(const MatrixXd& X, const VectorXd& y) {
  if (X.rows() == 0 || X.cols() == 0) {
    return make_error(ErrorCode::invalid_argument, "GP needs at least one sample of at least one input");
  }
  if (X.rows() != y.size()) {
    return make_error(ErrorCode::invalid_argument, "GP inputs have " + std::to_string(X.rows()) +
                                                       " rows but there are " + std::to_string(y.size()) + " targets");
  }
  if (!X.allFinite()) return make_error(ErrorCode::invalid_argument, "GP inputs contain NaN or infinity");
  if (!y.allFinite()) return make_error(ErrorCode::invalid_argument, "GP targets contain NaN or infinity");
  return {};
}

Status check_options(const GpFitOptions& o) {
  const auto bad = [](const char* what) {
    return make_error(ErrorCode::invalid_argument, std::string("GP fit options: ") + what);
  };
  if (o.restarts < 0) return bad("restarts must be >= 0");
  if (o.max_iterations <= 0) return bad("max_iterations must be > 0");
  if (!(o.relative_tolerance >= 0.0)) return bad("relative_tolerance must be >= 0");
  if (o.subset_size < 0) return bad("subset_size must be >= 0");
  if (!(o.refit_growth >= 1.0) || !std::isfinite(o.refit_growth)) return bad("refit_growth must be >= 1");
  const auto range_ok = [](double lo, double hi) { return lo > 0.0 && hi > lo && std::isfinite(hi); };
  if (!range_ok(o.min_lengthscale, o.max_lengthscale)) return bad("lengthscale bounds must satisfy 0 < min < max");
  if (!range_ok(o.min_signal_variance, o.max_signal_variance)) {
    return bad("signal variance bounds must satisfy 0 < min < max");
  }
  if (!range_ok(o.min_noise_variance, o.max_noise_variance)) {
    return bad("noise variance bounds must satisfy 0 < min < max");
  }
  return {};
}

// A spread that is rounding noise counts as none: the column is only centred, never divided by ~0.
double spread_or_one(double stddev, double magnitude) {
  return stddev > 1e-12 * std::max(1.0, magnitude) ? stddev : 1.0;
}

MatrixXd standardise(const MatrixXd& X, const GpScaling& s) {
  return (X.rowwise() - s.x_mean.transpose()).array().rowwise() / s.x_scale.transpose().array();
}

}  // namespace

Eigen::VectorXd GpHyperparameters::theta() const {
  const Index d = log_lengthscales.size();
  VectorXd t(d + 2);
  t << log_lengthscales, log_signal_variance, log_noise_variance;
  return t;
}

GpHyperparameters GpHyperparameters::from_theta(const Eigen::VectorXd& theta) {
  if (theta.size() < 3) throw std::invalid_argument("GP theta needs at least 3 entries");
  const Index d = theta.size() - 2;
  GpHyperparameters h;
  h.log_lengthscales = theta.head(d);
  h.log_signal_variance = theta(d);
  h.log_noise_variance = theta(d + 1);
  return h;
}

GpScaling GpScaling::from_data(const Eigen::MatrixXd& X, const Eigen::VectorXd& y) {
  GpScaling s;
  const double n = static_cast<double>(std::max<Index>(X.rows(), 1));
  s.x_mean = X.rows() > 0 ? VectorXd(X.colwise().mean().transpose()) : VectorXd::Zero(X.cols());
  s.x_scale = VectorXd::Ones(X.cols());
  for (Index j = 0; j < X.cols() && X.rows() > 0; ++j) {
    const double sd = std::sqrt((X.col(j).array() - s.x_mean(j)).square().sum() / n);
    s.x_scale(j) = spread_or_one(sd, X.col(j).cwiseAbs().maxCoeff());
  }
  if (y.size() > 0) {
    s.y_mean = y.mean();
    const double sd = std::sqrt((y.array() - s.y_mean).square().sum() / static_cast<double>(y.size()));
    s.y_scale = spread_or_one(sd, y.cwiseAbs().maxCoeff());
  }
  return s;
}

Status GaussianProcess::fit(const Eigen::MatrixXd& X, const Eigen::VectorXd& y, const GpFitOptions& options) {
  if (auto s = check_finite_data(X, y); !s) return s;
  if (auto s = check_options(options); !s) return s;
  const Index n = X.rows();
  const Index d = X.cols();
  const GpScaling scaling = GpScaling::from_data(X, y);
  const MatrixXd xs = standardise(X, scaling);
  const VectorXd ys = (y.array() - scaling.y_mean) / scaling.y_scale;

  VectorXd lower(d + 2), upper(d + 2);
  lower << VectorXd::Constant(d, std::log(options.min_lengthscale)), std::log(options.min_signal_variance),
      std::log(options.min_noise_variance);
  upper << VectorXd::Constant(d, std::log(options.max_lengthscale)), std::log(options.max_signal_variance),
      std::log(options.max_noise_variance);

  // Every random number is drawn here, before any search, so the seed alone fixes them.
  std::mt19937_64 rng(options.seed);
  std::vector<VectorXd> starts;
  starts.push_back(GpHyperparameters{VectorXd::Zero(d), 0.0, std::log(1e-2)}.theta().cwiseMax(lower).cwiseMin(upper));
  std::uniform_real_distribution<double> log_l(std::log(0.1), std::log(30.0));
  std::uniform_real_distribution<double> log_s2(std::log(0.1), std::log(10.0));
  std::uniform_real_distribution<double> log_sn2(std::log(1e-4), std::log(0.3));
  for (int i = 0; i < options.restarts; ++i) {
    VectorXd t(d + 2);
    for (Index j = 0; j < d; ++j) t(j) = log_l(rng);
    t(d) = log_s2(rng);
    t(d + 1) = log_sn2(rng);
    starts.push_back(t.cwiseMax(lower).cwiseMin(upper));
  }
  const bool subsets = options.subset_size > 0 && n > options.subset_size;
  std::vector<Index> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), Index{0});
  if (subsets) std::shuffle(order.begin(), order.end(), rng);

  // Starts on the first subset, then refinement on nested subsets doubling up to all data.
  GpFitReport report;
  VectorXd best;
  for (Index m = subsets ? options.subset_size : n;; m = std::min(2 * m, n)) {
    MatrixXd xs_sub;
    VectorXd ys_sub;
    if (m < n) {
      xs_sub.resize(m, d);
      ys_sub.resize(m);
      for (Index i = 0; i < m; ++i) {
        xs_sub.row(i) = xs.row(order[static_cast<std::size_t>(i)]);
        ys_sub(i) = ys(order[static_cast<std::size_t>(i)]);
      }
    }
    NegativeLml objective(m < n ? xs_sub : xs, m < n ? ys_sub : ys);
    if (best.size() == 0) {
      for (const VectorXd& start : starts) {
        if (!search(objective, start, 1.0, lower, upper, options)) ++report.failed_searches;
      }
    } else if (!search(objective, best, kRefineStep, lower, upper, options)) {
      ++report.failed_searches;
    }
    report.evaluations += objective.evaluations();
    if (m == n) report.full_data_evaluations += objective.evaluations();
    if (objective.found()) best = objective.best_theta();
    if (m == n) break;
  }
  if (best.size() == 0) {
    return make_error(ErrorCode::invalid_argument,
                      "GP fit: the kernel matrix could not be factorised at any hyperparameters tried");
  }
  GaussianProcess next;
  if (auto s = next.set_data(X, y, GpHyperparameters::from_theta(best), scaling, 0.0); !s) return s;
  next.optimised_size_ = n;
  next.refit_growth_ = options.refit_growth;
  report.log_marginal_likelihood = -0.5 * next.y_std_.head(n).dot(next.alpha_) -
                                   next.chol_.topLeftCorner(n, n).diagonal().array().log().sum() -
                                   0.5 * static_cast<double>(n) * kLog2Pi;
  next.report_ = report;
  *this = std::move(next);
  return {};
}

Status GaussianProcess::fit_with(const Eigen::MatrixXd& X, const Eigen::VectorXd& y, const GpHyperparameters& h,
                                 const GpScaling* scaling) {
  if (auto s = check_finite_data(X, y); !s) return s;
  GaussianProcess next;
  if (auto s = next.set_data(X, y, h, scaling != nullptr ? *scaling : GpScaling::from_data(X, y), 0.0); !s) {
    return s;
  }
  next.optimised_size_ = optimised_size_ > 0 ? optimised_size_ : X.rows();
  next.refit_growth_ = refit_growth_;
  next.report_ = report_;
  *this = std::move(next);
  return {};
}

Status GaussianProcess::set_data(const Eigen::MatrixXd& X, const Eigen::VectorXd& y, const GpHyperparameters& h,
                                 const GpScaling& scaling, double min_jitter) {
  const Index n = X.rows();
  const Index d = X.cols();
  if (h.log_lengthscales.size() != d) {
    return make_error(ErrorCode::invalid_argument, "GP hyperparameters have " +
                                                       std::to_string(h.log_lengthscales.size()) +
                                                       " lengthscales for " + std::to_string(d) + " inputs");
  }
  if (!h.theta().allFinite() || h.theta().cwiseAbs().maxCoeff() > 700.0) {
    return make_error(ErrorCode::invalid_argument, "GP hyperparameters must be finite logs (|θ| <= 700)");
  }
  if (scaling.x_mean.size() != d || scaling.x_scale.size() != d || !scaling.x_mean.allFinite() ||
      !scaling.x_scale.allFinite() || (scaling.x_scale.array() <= 0.0).any() || !std::isfinite(scaling.y_mean) ||
      !std::isfinite(scaling.y_scale) || scaling.y_scale <= 0.0) {
    return make_error(ErrorCode::invalid_argument,
                      "GP scaling needs a finite mean and a positive finite scale for each input and for y");
  }
  if (!(min_jitter >= 0.0) || !std::isfinite(min_jitter)) {
    return make_error(ErrorCode::invalid_argument, "GP jitter must be finite and >= 0");
  }
  d_ = d;
  n_ = 0;
  hyper_ = h;
  scaling_ = scaling;
  reserve(n);
  n_ = n;
  x_raw_.topRows(n) = X;
  x_std_.topRows(n) = standardise(X, scaling);
  z_.topRows(n) = x_std_.topRows(n) * (-h.log_lengthscales.array()).exp().matrix().asDiagonal();
  y_raw_.head(n) = y;
  y_std_.head(n) = (y.array() - scaling.y_mean) / scaling.y_scale;
  if (auto s = factorise(min_jitter); !s) return s;
  factorised_size_ = n;
  return {};
}

Status GaussianProcess::factorise(double min_jitter) {
  Workspace ws;
  ws.resize(n_);
  const double s2 = std::exp(hyper_.log_signal_variance);
  const double sn2 = std::exp(hyper_.log_noise_variance);
  auto chol = chol_.topLeftCorner(n_, n_);
  const double jitter = factorise_kernel(z_.topRows(n_), s2, sn2, min_jitter, chol, ws);
  if (jitter < 0.0) {
    return make_error(ErrorCode::invalid_argument,
                      "GP kernel matrix is not positive definite even with jitter (hyperparameters out of range?)");
  }
  jitter_ = jitter;
  solve_alpha();
  return {};
}

void GaussianProcess::solve_alpha() {
  auto chol = chol_.topLeftCorner(n_, n_);
  alpha_ = y_std_.head(n_);
  chol.triangularView<Eigen::Lower>().solveInPlace(alpha_);
  chol.triangularView<Eigen::Lower>().transpose().solveInPlace(alpha_);
}

void GaussianProcess::reserve(Index capacity) {
  const Index old = x_raw_.rows();
  if (capacity <= old && x_raw_.cols() == d_) return;
  // fit/fit_with ask for exactly n; add_sample grows by a quarter, so copying the n×n factor
  // costs O(n) per added sample on average.
  const Index cap = n_ == 0 ? capacity : std::max(capacity, old + old / 4 + 16);
  const auto grow = [&](MatrixXd& m) {
    MatrixXd next(cap, d_);
    if (n_ > 0) next.topRows(n_) = m.topRows(n_);
    m.swap(next);
  };
  grow(x_raw_);
  grow(x_std_);
  grow(z_);
  MatrixXd chol(cap, cap);
  if (n_ > 0) chol.topLeftCorner(n_, n_) = chol_.topLeftCorner(n_, n_);
  chol_.swap(chol);
  VectorXd y_raw(cap), y_std(cap);
  y_raw.head(n_) = y_raw_.head(n_);
  y_std.head(n_) = y_std_.head(n_);
  y_raw_.swap(y_raw);
  y_std_.swap(y_std);
}

Status GaussianProcess::add_sample(const Eigen::VectorXd& x, double y) {
  if (n_ == 0) return make_error(ErrorCode::conflict, "GP add_sample needs a fitted GP");
  if (x.size() != d_) {
    return make_error(ErrorCode::invalid_argument, "GP sample has " + std::to_string(x.size()) +
                                                       " inputs, the GP has " + std::to_string(d_));
  }
  if (!x.allFinite() || !std::isfinite(y)) {
    return make_error(ErrorCode::invalid_argument, "GP sample contains NaN or infinity");
  }
  reserve(n_ + 1);
  const Index n = n_;
  x_raw_.row(n) = x.transpose();
  x_std_.row(n) = ((x - scaling_.x_mean).array() / scaling_.x_scale.array()).matrix().transpose();
  z_.row(n) = x_std_.row(n).array() * (-hyper_.log_lengthscales.array()).exp().transpose();
  y_raw_(n) = y;
  y_std_(n) = (y - scaling_.y_mean) / scaling_.y_scale;

  // New last row of L: l = L⁻¹ k(X, x); pivot √(k(x,x) + σ_n² + jitter − lᵀl).
  const double s2 = std::exp(hyper_.log_signal_variance);
  const double sn2 = std::exp(hyper_.log_noise_variance);
  VectorXd l(n);
  kernel_vector(z_.topRows(n), z_.row(n).transpose(), s2, l);
  chol_.topLeftCorner(n, n).triangularView<Eigen::Lower>().solveInPlace(l);
  const double pivot = s2 + sn2 + jitter_ - l.squaredNorm();
  if (pivot > 0.0 && std::isfinite(pivot)) {
    chol_.row(n).head(n) = l.transpose();
    chol_(n, n) = std::sqrt(pivot);
    n_ = n + 1;
    solve_alpha();
    return {};
  }
  // Numerically dependent on the samples so far: refactorise all of it with more jitter.
  const MatrixXd saved = chol_.topLeftCorner(n, n);
  const double saved_jitter = jitter_;
  n_ = n + 1;
  if (auto s = factorise(jitter_ > 0.0 ? jitter_ * kJitterStep : kFirstJitter * s2); !s) {
    n_ = n;
    chol_.topLeftCorner(n, n) = saved;
    jitter_ = saved_jitter;
    solve_alpha();
    return s;
  }
  factorised_size_ = n_;
  return {};
}

bool GaussianProcess::refit_due() const {
  return optimised_size_ > 0 && static_cast<double>(n_) >= refit_growth_ * static_cast<double>(optimised_size_);
}

GpPrediction GaussianProcess::predict(const Eigen::VectorXd& x) const {
  if (n_ == 0) throw std::invalid_argument("GP predict before fit");
  if (x.size() != d_) throw std::invalid_argument("GP predict: query has the wrong number of inputs");
  const double s2 = std::exp(hyper_.log_signal_variance);
  const VectorXd zq =
      ((x - scaling_.x_mean).array() / scaling_.x_scale.array() * (-hyper_.log_lengthscales.array()).exp()).matrix();
  VectorXd k(n_);
  kernel_vector(z_.topRows(n_), zq, s2, k);
  const double mean = k.dot(alpha_);
  chol_.topLeftCorner(n_, n_).triangularView<Eigen::Lower>().solveInPlace(k);
  const double variance = std::max(0.0, s2 - k.squaredNorm());
  const double y2 = scaling_.y_scale * scaling_.y_scale;
  GpPrediction p;
  p.mean = scaling_.y_mean + scaling_.y_scale * mean;
  p.variance = y2 * variance;
  p.variance_with_noise = y2 * (variance + std::exp(hyper_.log_noise_variance));
  return p;
}

GpPredictions GaussianProcess::predict(const Eigen::MatrixXd& X) const {
  if (n_ == 0) throw std::invalid_argument("GP predict before fit");
  if (X.cols() != d_) throw std::invalid_argument("GP predict: queries have the wrong number of inputs");
  const Index m = X.rows();
  const double s2 = std::exp(hyper_.log_signal_variance);
  // d×m, one query per column, standardised and divided by the lengthscales.
  const MatrixXd zq = (standardise(X, scaling_).array().rowwise() * (-hyper_.log_lengthscales.array()).exp().transpose())
                          .matrix()
                          .transpose();
  MatrixXd k(n_, m);
  for (Index c = 0; c < m; ++c) kernel_vector(z_.topRows(n_), zq.col(c), s2, k.col(c));
  GpPredictions p;
  p.mean = (k.transpose() * alpha_).array() * scaling_.y_scale + scaling_.y_mean;
  // k ← L⁻¹ k. BLAS's dtrsm (OpenBLAS) and not Eigen's triangular solve, which ran the whole
  // batch at 0.6× scikit-learn's speed at n = m = 1,000 (bench/gp_compare.sh): this solve is
  // n²m of the batch's work. chol_ may be larger than n: its leading dimension is its rows.
#if JOULE_GP_CBLAS
  cblas_dtrsm(CblasColMajor, CblasLeft, CblasLower, CblasNoTrans, CblasNonUnit, static_cast<int>(n_),
              static_cast<int>(m), 1.0, chol_.data(), static_cast<int>(chol_.outerStride()), k.data(),
              static_cast<int>(k.outerStride()));
#else  // a worker built alone, where the node may have no BLAS (estimator/CMakeLists.txt)
  chol_.topLeftCorner(n_, n_).triangularView<Eigen::Lower>().solveInPlace(k);
#endif
  const double y2 = scaling_.y_scale * scaling_.y_scale;
  p.variance = ((s2 - k.colwise().squaredNorm().array()).max(0.0) * y2).matrix().transpose();
  p.variance_with_noise = p.variance.array() + y2 * std::exp(hyper_.log_noise_variance);
  return p;
}

double GaussianProcess::log_marginal_likelihood(const Eigen::VectorXd& theta, Eigen::VectorXd* gradient) const {
  if (n_ == 0) throw std::invalid_argument("GP log_marginal_likelihood before fit");
  if (theta.size() != d_ + 2) throw std::invalid_argument("GP log_marginal_likelihood: theta needs D + 2 entries");
  Workspace ws;
  return lml_with_gradient(x_std_.topRows(n_), y_std_.head(n_), theta, gradient, ws);
}

nlohmann::json GaussianProcess::save() const {
  const auto vec = [](const VectorXd& v) { return std::vector<double>(v.data(), v.data() + v.size()); };
  nlohmann::json x = nlohmann::json::array();
  for (Index i = 0; i < n_; ++i) x.push_back(vec(x_raw_.row(i).transpose()));
  return {
      {"format", "joule.gp"},
      {"version", 1},
      {"kernel", "matern52_ard+white"},
      {"dimensions", d_},
      {"x", std::move(x)},
      {"y", vec(y_raw_.head(n_))},
      {"scaling",
       {{"x_mean", vec(scaling_.x_mean)},
        {"x_scale", vec(scaling_.x_scale)},
        {"y_mean", scaling_.y_mean},
        {"y_scale", scaling_.y_scale}}},
      {"hyperparameters",
       {{"log_lengthscales", vec(hyper_.log_lengthscales)},
        {"log_signal_variance", hyper_.log_signal_variance},
        {"log_noise_variance", hyper_.log_noise_variance}}},
      {"jitter", jitter_},
      {"factorised_size", factorised_size_},
      {"optimised_size", optimised_size_},
      {"refit_growth", refit_growth_},
  };
}

Result<GaussianProcess> GaussianProcess::load(const nlohmann::json& json) {
  const auto bad = [](const std::string& what) { return make_error(ErrorCode::invalid_argument, "GP load: " + what); };
  try {
    if (!json.is_object() || json.value("format", "") != "joule.gp" || json.value("version", 0) != 1) {
      return bad("not a joule.gp version 1 document");
    }
    const auto to_vec = [](const nlohmann::json& j) {
      const auto v = j.get<std::vector<double>>();
      return VectorXd(Eigen::Map<const VectorXd>(v.data(), static_cast<Index>(v.size())));
    };
    const Index d = json.at("dimensions").get<Index>();
    const auto& rows = json.at("x");
    const VectorXd y = to_vec(json.at("y"));
    if (d <= 0 || !rows.is_array() || static_cast<Index>(rows.size()) != y.size()) {
      return bad("x and y sizes do not match");
    }
    GaussianProcess gp;
    gp.d_ = d;
    if (rows.empty()) return gp;
    // Every row is read and checked before X is sized: X is n × d, and a forged "dimensions"
    // would otherwise ask for an allocation no data backs (std::bad_alloc, not an error).
    std::vector<VectorXd> read_rows;
    read_rows.reserve(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      read_rows.push_back(to_vec(rows.at(i)));
      if (read_rows.back().size() != d) return bad("row " + std::to_string(i) + " of x has the wrong size");
    }
    MatrixXd X(y.size(), d);
    for (Index i = 0; i < X.rows(); ++i) X.row(i) = read_rows[static_cast<std::size_t>(i)].transpose();
    if (auto s = check_finite_data(X, y); !s) return s.error();
    const auto& sj = json.at("scaling");
    const GpScaling scaling{to_vec(sj.at("x_mean")), to_vec(sj.at("x_scale")), sj.at("y_mean").get<double>(),
                            sj.at("y_scale").get<double>()};
    const auto& hj = json.at("hyperparameters");
    const GpHyperparameters h{to_vec(hj.at("log_lengthscales")), hj.at("log_signal_variance").get<double>(),
                              hj.at("log_noise_variance").get<double>()};
    // Replays how the factor was built (one factorisation, then row appends) so that the
    // loaded GP predicts exactly as the saved one, not just to rounding.
    const Index factorised = json.at("factorised_size").get<Index>();
    if (factorised < 1 || factorised > X.rows()) return bad("factorised_size out of range");
    if (auto s = gp.set_data(X.topRows(factorised), y.head(factorised), h, scaling, json.at("jitter").get<double>()); !s) {
      return s.error();
    }
    for (Index i = factorised; i < X.rows(); ++i) {
      if (auto s = gp.add_sample(X.row(i).transpose(), y(i)); !s) return s.error();
    }
    gp.optimised_size_ = json.at("optimised_size").get<Index>();
    gp.refit_growth_ = json.at("refit_growth").get<double>();
    if (gp.optimised_size_ < 0 || !(gp.refit_growth_ >= 1.0)) return bad("bad refit state");
    return gp;
  } catch (const nlohmann::json::exception& e) {
    return bad(e.what());
  }
}

}  // namespace joule::estimator
