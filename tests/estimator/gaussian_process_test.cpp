#include "joule/estimator/gaussian_process.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace joule::estimator {
namespace {

using Eigen::MatrixXd;
using Eigen::VectorXd;

// y = sin(x1) + 0.5 x2² (+ more smooth terms when d > 2), x uniform in [-2, 2]^d, plus noise.
struct Sample {
  MatrixXd x;
  VectorXd y;
};

double smooth(const Eigen::Ref<const VectorXd>& x) {
  double v = std::sin(x(0)) + 0.5 * x(1) * x(1);
  for (Eigen::Index j = 2; j < x.size(); ++j) v += 0.3 * std::cos(x(j));
  return v;
}

Sample make_sample(int n, int d, double noise, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  std::normal_distribution<double> eps(0.0, 1.0);
  Sample s{MatrixXd(n, d), VectorXd(n)};
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < d; ++j) s.x(i, j) = u(rng);
    s.y(i) = smooth(s.x.row(i).transpose()) + noise * eps(rng);
  }
  return s;
}

GaussianProcess fitted_with(const Sample& s, const VectorXd& theta) {
  GaussianProcess gp;
  const Status st = gp.fit_with(s.x, s.y, GpHyperparameters::from_theta(theta));
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
  return gp;
}

void expect_close(double actual, double expected, double relative, const char* what) {
  EXPECT_NEAR(actual, expected, relative * std::max(1.0, std::abs(expected))) << what;
}

TEST(GaussianProcessTest, analytic_gradient_matches_finite_differences) {
  // n = 120 > 2 × the unblocked size, so the recursive inverse and K⁻¹ products run too.
  for (const int n : {25, 120}) {
    const Sample s = make_sample(n, 3, 0.1, 1);
    const GaussianProcess gp = fitted_with(s, VectorXd::Zero(5));
    std::mt19937_64 rng(42);
    std::uniform_real_distribution<double> u(-1.5, 1.5);
    for (int trial = 0; trial < 4; ++trial) {
      VectorXd theta(5);
      theta << u(rng), u(rng), u(rng), u(rng), -3.0 + u(rng);
      VectorXd gradient;
      const double lml = gp.log_marginal_likelihood(theta, &gradient);
      ASSERT_TRUE(std::isfinite(lml));
      ASSERT_EQ(gradient.size(), 5);
      for (int j = 0; j < 5; ++j) {
        const double h = 1e-5;
        VectorXd up = theta, down = theta;
        up(j) += h;
        down(j) -= h;
        const double fd = (gp.log_marginal_likelihood(up, nullptr) - gp.log_marginal_likelihood(down, nullptr)) / (2 * h);
        EXPECT_LT(std::abs(gradient(j) - fd), 1e-5 * std::max(1.0, std::abs(fd)))
            << "n=" << n << " trial " << trial << " component " << j << ": analytic " << gradient(j) << ", fd " << fd;
      }
    }
  }
}

TEST(GaussianProcessTest, incremental_update_matches_full_fit) {
  const Sample s = make_sample(70, 2, 0.05, 2);
  VectorXd theta(4);
  theta << 0.3, -0.2, 0.5, -4.0;
  const GpHyperparameters h = GpHyperparameters::from_theta(theta);
  GaussianProcess incremental;
  ASSERT_TRUE(incremental.fit_with(s.x.topRows(20), s.y.head(20), h).ok());
  const GpScaling scaling = incremental.scaling();
  for (int i = 20; i < 70; ++i) ASSERT_TRUE(incremental.add_sample(s.x.row(i).transpose(), s.y(i)).ok());
  ASSERT_EQ(incremental.size(), 70);

  GaussianProcess full;
  ASSERT_TRUE(full.fit_with(s.x, s.y, h, &scaling).ok());
  const Sample queries = make_sample(50, 2, 0.0, 3);
  const GpPredictions a = incremental.predict(queries.x);
  const GpPredictions b = full.predict(queries.x);
  for (int i = 0; i < 50; ++i) {
    expect_close(a.mean(i), b.mean(i), 1e-9, "mean");
    expect_close(a.variance(i), b.variance(i), 1e-9, "variance");
    expect_close(a.variance_with_noise(i), b.variance_with_noise(i), 1e-9, "variance with noise");
  }
  EXPECT_NEAR(incremental.log_marginal_likelihood(theta, nullptr), full.log_marginal_likelihood(theta, nullptr), 1e-8);
}

TEST(GaussianProcessTest, refit_due_after_growth_factor) {
  const Sample s = make_sample(40, 2, 0.05, 4);
  GpFitOptions options;
  options.restarts = 0;
  options.refit_growth = 1.5;
  GaussianProcess gp;
  ASSERT_TRUE(gp.fit(s.x.topRows(20), s.y.head(20), options).ok());
  EXPECT_FALSE(gp.refit_due());
  for (int i = 20; i < 29; ++i) ASSERT_TRUE(gp.add_sample(s.x.row(i).transpose(), s.y(i)).ok());
  EXPECT_FALSE(gp.refit_due());
  ASSERT_TRUE(gp.add_sample(s.x.row(29).transpose(), s.y(29)).ok());
  EXPECT_TRUE(gp.refit_due());
  ASSERT_TRUE(gp.fit(s.x.topRows(30), s.y.head(30), options).ok());
  EXPECT_FALSE(gp.refit_due());
}

TEST(GaussianProcessTest, save_then_load_reproduces_predictions) {
  const Sample s = make_sample(40, 3, 0.05, 5);
  GpFitOptions options;
  options.restarts = 1;
  GaussianProcess gp;
  ASSERT_TRUE(gp.fit(s.x, s.y, options).ok());
  ASSERT_TRUE(gp.add_sample(VectorXd::Constant(3, 0.25), 1.0).ok());
  // Through text, as it would be stored. load replays one factorisation plus the appended row,
  // so on one build the predictions are in fact identical; 1e-12 is the promise.
  const auto loaded = GaussianProcess::load(nlohmann::json::parse(gp.save().dump()));
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  EXPECT_EQ(loaded->size(), gp.size());
  EXPECT_EQ(loaded->dimensions(), 3);
  EXPECT_EQ(loaded->hyperparameters().theta(), gp.hyperparameters().theta());
  EXPECT_EQ(loaded->refit_due(), gp.refit_due());
  const Sample queries = make_sample(30, 3, 0.0, 6);
  const GpPredictions a = gp.predict(queries.x);
  const GpPredictions b = loaded->predict(queries.x);
  for (int i = 0; i < 30; ++i) {
    EXPECT_NEAR(b.mean(i), a.mean(i), 1e-12 * std::abs(a.mean(i)));
    EXPECT_NEAR(b.variance(i), a.variance(i), 1e-12 * std::abs(a.variance(i)));
  }
}

TEST(GaussianProcessTest, load_rejects_malformed_documents) {
  EXPECT_FALSE(GaussianProcess::load(nlohmann::json::object()).ok());
  EXPECT_FALSE(GaussianProcess::load(nlohmann::json{{"format", "joule.gp"}, {"version", 1}}).ok());
  const Sample s = make_sample(10, 2, 0.05, 7);
  GaussianProcess gp = fitted_with(s, VectorXd::Zero(4));
  nlohmann::json doc = gp.save();
  doc["x"][3] = {1.0};  // a row of the wrong size
  EXPECT_FALSE(GaussianProcess::load(doc).ok());
  doc = gp.save();
  doc["hyperparameters"]["log_lengthscales"] = {0.0};
  EXPECT_FALSE(GaussianProcess::load(doc).ok());
}

TEST(GaussianProcessTest, predicts_prior_far_from_data) {
  const Sample s = make_sample(30, 2, 0.05, 8);
  VectorXd theta(4);
  theta << 0.0, 0.0, std::log(2.0), std::log(1e-3);
  const GaussianProcess gp = fitted_with(s, theta);
  const double y_var = gp.scaling().y_scale * gp.scaling().y_scale;
  const GpPrediction p = gp.predict(VectorXd::Constant(2, 1e4));
  EXPECT_NEAR(p.mean, s.y.mean(), 1e-9);
  EXPECT_NEAR(p.variance, 2.0 * y_var, 1e-9);
  EXPECT_NEAR(p.variance_with_noise, (2.0 + 1e-3) * y_var, 1e-9);
  // Near the data the variance is far below the prior.
  EXPECT_LT(gp.predict(VectorXd(s.x.row(0).transpose())).variance, 0.05 * p.variance);
}

TEST(GaussianProcessTest, predict_many_matches_predict_one) {
  const Sample s = make_sample(60, 2, 0.05, 9);
  VectorXd theta(4);
  theta << 0.2, 0.1, 0.0, -3.0;
  const GaussianProcess gp = fitted_with(s, theta);
  const Sample queries = make_sample(20, 2, 0.0, 10);
  // The batch solves with BLAS, one query with Eigen: the same numbers to rounding. After
  // add_sample the factor has spare rows (its leading dimension exceeds n): still the same.
  GaussianProcess grown = gp;
  const Sample more = make_sample(30, 2, 0.05, 11);
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(grown.add_sample(more.x.row(i).transpose(), more.y(i)).ok());
  for (const GaussianProcess* model : {&gp, static_cast<const GaussianProcess*>(&grown)}) {
    const GpPredictions many = model->predict(queries.x);
    for (int i = 0; i < 20; ++i) {
      const GpPrediction one = model->predict(VectorXd(queries.x.row(i).transpose()));
      EXPECT_NEAR(one.mean, many.mean(i), 1e-10);
      EXPECT_NEAR(one.variance, many.variance(i), 1e-10);
      EXPECT_NEAR(one.variance_with_noise, many.variance_with_noise(i), 1e-10);
    }
  }
}

TEST(GaussianProcessTest, duplicates_and_degenerate_inputs_give_finite_predictions) {
  Sample s = make_sample(30, 3, 0.05, 11);
  s.x.col(2).setConstant(4.0);                  // a constant feature
  s.x.bottomRows(10) = s.x.topRows(10);         // duplicated inputs, different noisy targets
  s.y.tail(10) = s.y.head(10).array() + 0.01;
  GpFitOptions options;
  options.restarts = 1;
  GaussianProcess gp;
  ASSERT_TRUE(gp.fit(s.x, s.y, options).ok());
  EXPECT_EQ(gp.scaling().x_scale(2), 1.0);
  const GpPredictions p = gp.predict(make_sample(10, 3, 0.0, 12).x);
  EXPECT_TRUE(p.mean.allFinite());
  EXPECT_TRUE(p.variance.allFinite());
  EXPECT_GE(p.variance.minCoeff(), 0.0);

  // Every input identical: only the mean and the noise can be learnt.
  const MatrixXd same = MatrixXd::Constant(12, 2, 3.0);
  VectorXd y = VectorXd::LinSpaced(12, 1.0, 2.0);
  ASSERT_TRUE(gp.fit(same, y, options).ok());
  const GpPrediction q = gp.predict(VectorXd::Constant(2, 3.0));
  EXPECT_NEAR(q.mean, 1.5, 1e-3);
  EXPECT_TRUE(std::isfinite(q.variance_with_noise));
  ASSERT_TRUE(gp.add_sample(VectorXd::Constant(2, 3.0), 1.5).ok());

  // Exact duplicates with no noise at all: the jitter ladder keeps K factorisable.
  VectorXd theta(4);
  theta << 0.0, 0.0, 0.0, -700.0;
  ASSERT_TRUE(gp.fit_with(same, y, GpHyperparameters::from_theta(theta)).ok());
  EXPECT_GT(gp.jitter(), 0.0);
  EXPECT_TRUE(std::isfinite(gp.predict(VectorXd::Constant(2, 3.0)).mean));
  ASSERT_TRUE(gp.add_sample(VectorXd::Constant(2, 3.0), 1.5).ok());
  EXPECT_TRUE(std::isfinite(gp.predict(VectorXd::Constant(2, 3.0)).mean));
}

TEST(GaussianProcessTest, learns_smooth_function_with_calibrated_variance) {
  const double noise = 0.05;
  const Sample train = make_sample(60, 2, noise, 13);
  const Sample test = make_sample(400, 2, noise, 14);
  GaussianProcess gp;
  ASSERT_TRUE(gp.fit(train.x, train.y).ok());
  const GpPredictions p = gp.predict(test.x);
  const double rmse = std::sqrt((p.mean - test.y).squaredNorm() / 400.0);
  int within = 0;
  for (int i = 0; i < 400; ++i) within += std::abs(p.mean(i) - test.y(i)) <= 3.0 * std::sqrt(p.variance_with_noise(i));
  // The noisy targets cannot be predicted better than the noise; a good fit stays close to it.
  EXPECT_LT(rmse, 1.6 * noise);
  EXPECT_GT(rmse, 0.7 * noise);
  EXPECT_GE(within, 0.95 * 400) << "rmse " << rmse;
  EXPECT_NEAR(std::exp(0.5 * gp.hyperparameters().log_noise_variance) * gp.scaling().y_scale, noise, 0.5 * noise);
}

TEST(GaussianProcessTest, subset_search_ends_at_full_data_optimum) {
  const Sample s = make_sample(90, 2, 0.05, 15);
  GpFitOptions options;
  options.restarts = 2;
  options.subset_size = 20;  // 20 → 40 → 80 → 90
  GaussianProcess gp;
  ASSERT_TRUE(gp.fit(s.x, s.y, options).ok());
  EXPECT_GT(gp.last_fit_report().full_data_evaluations, 0);
  EXPECT_LT(gp.last_fit_report().full_data_evaluations, gp.last_fit_report().evaluations);
  VectorXd gradient;
  const double lml = gp.log_marginal_likelihood(gp.hyperparameters().theta(), &gradient);
  EXPECT_NEAR(lml, gp.last_fit_report().log_marginal_likelihood, 1e-9);
  EXPECT_LT(gradient.cwiseAbs().maxCoeff() / 90.0, 1e-3) << gradient.transpose();

  options.subset_size = 0;
  GaussianProcess all;
  ASSERT_TRUE(all.fit(s.x, s.y, options).ok());
  EXPECT_NEAR(lml, all.last_fit_report().log_marginal_likelihood, 0.05);
}

TEST(GaussianProcessTest, line_search_failures_keep_the_best_point) {
  // Nearly noiseless, very smooth data: the LML is steep near σ_n² → 0 and some L-BFGS-B line
  // searches throw. The fit must still succeed with the best point any search reached.
  std::mt19937_64 rng(2);
  std::normal_distribution<double> eps(0.0, 1.0);
  std::uniform_real_distribution<double> u(0.0, 3.0);
  const auto f = [](double a, double b) { return a + 0.5 * b * b; };
  MatrixXd x(30, 2);
  VectorXd y(30);
  for (int i = 0; i < 30; ++i) {
    x(i, 0) = u(rng);
    x(i, 1) = u(rng);
    y(i) = f(x(i, 0), x(i, 1)) + 1e-4 * eps(rng);
  }
  GaussianProcess gp;
  ASSERT_TRUE(gp.fit(x, y).ok());
  if (gp.last_fit_report().failed_searches == 0) GTEST_SKIP() << "no line search failed with this LBFGSpp";
  const GpHyperparameters start{VectorXd::Zero(2), 0.0, std::log(1e-2)};
  EXPECT_GT(gp.last_fit_report().log_marginal_likelihood, gp.log_marginal_likelihood(start.theta(), nullptr));
  double worst = 0.0;
  for (double a = 0.25; a < 3.0; a += 0.5) {
    for (double b = 0.25; b < 3.0; b += 0.5) worst = std::max(worst, std::abs(gp.predict(Eigen::Vector2d(a, b)).mean - f(a, b)));
  }
  EXPECT_LT(worst, 0.05);
}

TEST(GaussianProcessTest, same_seed_gives_same_hyperparameters) {
  const Sample s = make_sample(50, 3, 0.05, 16);
  GpFitOptions options;
  options.restarts = 3;
  options.seed = 1234;
  options.subset_size = 30;
  GaussianProcess a, b;
  ASSERT_TRUE(a.fit(s.x, s.y, options).ok());
  ASSERT_TRUE(b.fit(s.x, s.y, options).ok());
  EXPECT_EQ(a.hyperparameters().theta(), b.hyperparameters().theta());
  EXPECT_EQ(a.last_fit_report().evaluations, b.last_fit_report().evaluations);
}

TEST(GaussianProcessTest, rejects_bad_input) {
  const Sample s = make_sample(10, 2, 0.05, 17);
  GaussianProcess gp;
  EXPECT_FALSE(gp.fit(MatrixXd(0, 2), VectorXd(0)).ok());
  EXPECT_FALSE(gp.fit(s.x, s.y.head(9)).ok());
  MatrixXd with_nan = s.x;
  with_nan(3, 1) = std::numeric_limits<double>::quiet_NaN();
  const Status nan_status = gp.fit(with_nan, s.y);
  ASSERT_FALSE(nan_status.ok());
  EXPECT_EQ(nan_status.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(nan_status.error().message.find("NaN"), std::string::npos);
  VectorXd with_inf = s.y;
  with_inf(0) = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(gp.fit(s.x, with_inf).ok());
  GpFitOptions bad_options;
  bad_options.min_noise_variance = 0.0;
  EXPECT_FALSE(gp.fit(s.x, s.y, bad_options).ok());
  EXPECT_FALSE(gp.fit_with(s.x, s.y, GpHyperparameters::from_theta(VectorXd::Zero(5))).ok());
  EXPECT_EQ(gp.size(), 0);  // failures leave the GP as it was

  EXPECT_EQ(gp.add_sample(VectorXd::Zero(2), 1.0).error().code, ErrorCode::conflict);
  EXPECT_THROW(gp.predict(VectorXd::Zero(2)), std::invalid_argument);
  ASSERT_TRUE(gp.fit_with(s.x, s.y, GpHyperparameters::from_theta(VectorXd::Zero(4))).ok());
  EXPECT_FALSE(gp.add_sample(VectorXd::Zero(3), 1.0).ok());
  EXPECT_FALSE(gp.add_sample(VectorXd::Zero(2), std::numeric_limits<double>::quiet_NaN()).ok());
  EXPECT_EQ(gp.size(), 10);
  EXPECT_THROW(gp.predict(VectorXd::Zero(3)), std::invalid_argument);
}

}  // namespace
}  // namespace joule::estimator
