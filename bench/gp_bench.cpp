// GP fit and predict timings with held-out error, on the data bench/gp_peer.py writes; the
// peer (scikit-learn) runs the same files. bench/gp_compare.sh runs both and prints the table.
//
//   gp_bench --data=DIR [--restarts=3] [Google Benchmark flags, e.g. --benchmark_filter=/200$]
//
// Benchmarks per training size n (train_n.csv in DIR; test.csv is the held-out set):
//   fit/n          GaussianProcess::fit with default options but `restarts`; counters: held-out
//                  rmse (log E, vs measured), rmse_true (vs noise-free), mape (joules),
//                  within_3sd, LML and evaluation counts of the fit
//   predict1/n     mean + variance at one held-out point
//   predict1000/n  mean + variance at the 1,000 held-out points
// Each is repeated and reported as mean/median/stddev aggregates (the table uses the median).

#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "joule/estimator/gaussian_process.hpp"

namespace {

using joule::estimator::GaussianProcess;
using joule::estimator::GpFitOptions;

struct Table {
  Eigen::MatrixXd x;
  Eigen::VectorXd y, y_true;
};

// The CSVs of gp_peer.py: header, then x1..x4, y, y_true per row.
Table read_csv(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::string line;
  std::getline(in, line);
  std::vector<std::vector<double>> rows;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::vector<double> row;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) row.push_back(std::stod(cell));
    if (row.size() != 6) throw std::runtime_error("bad row in " + path.string());
    rows.push_back(std::move(row));
  }
  Table t{Eigen::MatrixXd(static_cast<Eigen::Index>(rows.size()), 4), Eigen::VectorXd(rows.size()),
          Eigen::VectorXd(rows.size())};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto r = static_cast<Eigen::Index>(i);
    for (int j = 0; j < 4; ++j) t.x(r, j) = rows[i][static_cast<std::size_t>(j)];
    t.y(r) = rows[i][4];
    t.y_true(r) = rows[i][5];
  }
  return t;
}

// Same rule as fit_repeats() in gp_peer.py.
int fit_repeats(Eigen::Index n) { return n <= 200 ? 5 : (n <= 1000 ? 2 : 1); }

GaussianProcess fitted(const Table& train, const GpFitOptions& options) {
  GaussianProcess gp;
  if (const auto s = gp.fit(train.x, train.y, options); !s) throw std::runtime_error(s.error().message);
  return gp;
}

void fit(benchmark::State& state, const Table* train, const Table* test, GpFitOptions options) {
  GaussianProcess gp;
  for (auto _ : state) {
    GaussianProcess fresh;
    const auto s = fresh.fit(train->x, train->y, options);
    if (!s) {
      state.SkipWithError(s.error().message.c_str());
      return;
    }
    benchmark::DoNotOptimize(fresh);
    gp = std::move(fresh);
  }
  const auto p = gp.predict(test->x);
  const Eigen::Index m = test->x.rows();
  const Eigen::ArrayXd err = p.mean - test->y;
  state.counters["rmse"] = std::sqrt(err.square().mean());
  state.counters["rmse_true"] = std::sqrt((p.mean - test->y_true).array().square().mean());
  state.counters["mape"] = ((p.mean.array().exp() - test->y.array().exp()).abs() / test->y.array().exp()).mean();
  state.counters["within_3sd"] =
      static_cast<double>((err.abs() <= 3.0 * p.variance_with_noise.array().sqrt()).count()) / static_cast<double>(m);
  state.counters["log_marginal_likelihood"] = gp.last_fit_report().log_marginal_likelihood;
  state.counters["evaluations"] = gp.last_fit_report().evaluations;
  state.counters["full_data_evaluations"] = gp.last_fit_report().full_data_evaluations;
}

void predict_one(benchmark::State& state, const GaussianProcess* gp, const Table* test) {
  const Eigen::VectorXd x = test->x.row(0).transpose();
  for (auto _ : state) {
    auto p = gp->predict(x);
    benchmark::DoNotOptimize(p);
  }
}

void predict_many(benchmark::State& state, const GaussianProcess* gp, const Table* test) {
  for (auto _ : state) {
    auto p = gp->predict(test->x);
    benchmark::DoNotOptimize(p);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path data;
  GpFitOptions options;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--data=", 0) == 0) {
      data = a.substr(7);
    } else if (a.rfind("--restarts=", 0) == 0) {
      options.restarts = std::stoi(a.substr(11));
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (data.empty()) {
    std::fprintf(stderr, "usage: gp_bench --data=DIR [--restarts=N] [benchmark flags]; DIR from gp_peer.py generate\n");
    return 2;
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_argc, rest.data())) return 2;
  benchmark::AddCustomContext("eigen_simd", Eigen::SimdInstructionSetsInUse());
  benchmark::AddCustomContext("restarts", std::to_string(options.restarts));

  const auto test = std::make_unique<Table>(read_csv(data / "test.csv"));
  std::vector<Eigen::Index> sizes;
  for (const auto& entry : std::filesystem::directory_iterator(data)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("train_", 0) == 0 && entry.path().extension() == ".csv") sizes.push_back(std::stol(name.substr(6)));
  }
  std::sort(sizes.begin(), sizes.end());
  std::vector<std::unique_ptr<Table>> trains;
  std::vector<std::unique_ptr<GaussianProcess>> models;
  models.reserve(sizes.size());  // the lambdas below keep pointers to these slots
  for (const Eigen::Index n : sizes) {
    const std::string suffix = "/" + std::to_string(n);
    trains.push_back(std::make_unique<Table>(read_csv(data / ("train_" + std::to_string(n) + ".csv"))));
    const Table* train = trains.back().get();
    benchmark::RegisterBenchmark(("fit" + suffix).c_str(), fit, train, test.get(), options)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1)
        ->Repetitions(fit_repeats(n))
        ->ReportAggregatesOnly(true)
        ->UseRealTime();
    // Fitted lazily on first use, so a --benchmark_filter that skips a size skips its fit too.
    models.push_back(nullptr);
    auto* slot = &models.back();
    const auto ensure = [slot, train, options] {
      if (!*slot) *slot = std::make_unique<GaussianProcess>(fitted(*train, options));
      return slot->get();
    };
    benchmark::RegisterBenchmark(("predict1" + suffix).c_str(), [ensure, t = test.get()](benchmark::State& s) {
      predict_one(s, ensure(), t);
    })->Unit(benchmark::kMicrosecond)->Repetitions(5)->ReportAggregatesOnly(true)->UseRealTime();
    benchmark::RegisterBenchmark(("predict1000" + suffix).c_str(), [ensure, t = test.get()](benchmark::State& s) {
      predict_many(s, ensure(), t);
    })->Unit(benchmark::kMillisecond)->Repetitions(5)->ReportAggregatesOnly(true)->UseRealTime();
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
