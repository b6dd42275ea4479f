#include "joule/daemon/job_estimate.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>

#include <fmt/format.h>
#include <gtest/gtest.h>

using joule::daemon::find_estimate;
using joule::daemon::read_estimates;
using nlohmann::json;
namespace estimator = joule::estimator;

TEST(JobEstimateTest, rows_are_read_once_into_the_figures_the_daemon_decides_with) {
  const json rows = json::array({{{"device", "cpu"},
                                  {"status", "ok"},
                                  {"source", "modelled"},
                                  {"steps", 400},
                                  {"joules", {{"mean", 600.0}, {"std", 30.0}}},
                                  {"raw_joules", {{"mean", 300.0}, {"std", 15.0}}},
                                  {"seconds", {{"mean", 42.0}, {"std", 2.0}}},
                                  {"baseline", {{"method", "flops"}, {"joules", 900.0}}},
                                  {"layers", json::array({{{"flops_per_step", 1.5e9}}, {{"flops_per_step", 0.5e9}}})}},
                                 {{"device", "cuda:0"}, {"status", "no-model"}, {"detail", "no energy model yet"}},
                                 {{"status", "ok"}}});  // no device: not a row
  const auto estimates = read_estimates(rows);
  ASSERT_EQ(estimates.size(), 2u);
  const auto* cpu = find_estimate(estimates, "cpu");
  ASSERT_NE(cpu, nullptr);
  EXPECT_TRUE(cpu->ok);
  EXPECT_EQ(cpu->source, joule::EnergySource::modelled);
  EXPECT_EQ(cpu->joules_mean, 600.0);
  EXPECT_EQ(cpu->joules_std, 30.0);
  EXPECT_EQ(cpu->model_joules_mean, 300.0);  // the model's own figure, before the correction
  EXPECT_EQ(cpu->model_joules_std, 15.0);
  EXPECT_EQ(cpu->seconds_mean, 42.0);
  EXPECT_EQ(cpu->baseline_joules, 900.0);
  EXPECT_EQ(cpu->flops_per_step, 2.0e9);
  EXPECT_EQ(cpu->steps, 400);
  EXPECT_EQ(cpu->placement().joules_mean, 600.0);
  const auto* gpu = find_estimate(estimates, "cuda:0");
  ASSERT_NE(gpu, nullptr);
  EXPECT_FALSE(gpu->ok);
  EXPECT_EQ(find_estimate(estimates, "cuda:1"), nullptr);
}

TEST(JobEstimateTest, an_uncorrected_row_is_its_own_model_figure_and_bad_text_reads_as_none) {
  const auto estimates = read_estimates(std::string(
      R"([{"device": "cpu", "status": "ok", "source": "simulated", "joules": {"mean": 10.0, "std": 1.0}}])"));
  ASSERT_EQ(estimates.size(), 1u);
  EXPECT_EQ(estimates[0].model_joules_mean, 10.0);
  EXPECT_FALSE(estimates[0].baseline_joules);
  EXPECT_TRUE(read_estimates(std::string()).empty());
  EXPECT_TRUE(read_estimates(std::string("{not json")).empty());
  EXPECT_TRUE(read_estimates(json::object()).empty());
}

// A row as the estimate service answers it, for a 3-layer network, with figures of full precision.
joule::daemon::EstimateRow estimator_row(const std::string& device, double joules) {
  estimator::Estimate estimate;
  estimate.device = device;
  estimate.method = "thor-gp";
  estimate.source = "simulated";
  estimate.steps = 3000;
  estimate.epochs = 1;
  estimate.joules = {joules, joules / 7.0};
  estimate.seconds = {1.4276266847022362, 0.014807768842960523};
  estimate.joules_per_step = {joules / 3000.0, joules / 21000.0};
  estimate.flops_baseline_joules = joules * 0.6461;
  estimate.joules_per_flop = 1.5203067920204272e-10;
  for (int i = 0; i < 3; ++i) {
    estimator::LayerEstimate layer;
    layer.index = i;
    layer.type = i == 1 ? "relu" : "linear";
    layer.key = i == 1 ? "relu@hidden" : "linear@hidden";
    layer.joules_per_step = {joules / 3000.0 / 3.0, joules / 90000.0 / 7.0};
    layer.seconds_per_step = {0.000475875561567412, 4.935922947653508e-06};
    layer.flops_per_step = 51380224.0 + i;
    estimate.layers.push_back(layer);
  }
  return {device, std::move(estimate), {}, std::nullopt};
}

TEST(JobEstimateTest, a_job_keeps_its_rows_compact_the_cheapest_devices_whole_and_the_figures_it_decides_with) {
  std::vector<joule::daemon::EstimateRow> rows;
  for (int d = 0; d < 1500; ++d) rows.push_back(estimator_row("agent-" + std::to_string(d) + "/sim:x", 1.0 + d * 0.37));
  rows.push_back({"cuda:0", std::nullopt, "no energy model yet", std::nullopt});
  json whole = json::array();  // as POST /v1/estimate shows them
  for (const auto& row : rows) whole.push_back(joule::daemon::estimate_row_json(row));
  const std::string stored = joule::daemon::stored_estimates(rows);
  const json kept = json::parse(stored);
  const std::size_t before = whole.dump().size(), after = stored.size();
  EXPECT_LT(after * 5, before * 2) << before << " bytes → " << after;  // measured: 1.81 MB → 0.60 MB
  ASSERT_EQ(kept.size(), rows.size());
  // The 8 cheapest devices keep their layers; the rest keep the layers' summed FLOPs.
  std::size_t detailed = 0;
  for (const auto& row : kept)
    if (row.contains("layers") && !row["layers"].empty()) ++detailed;
  EXPECT_EQ(detailed, 8u);
  EXPECT_EQ(kept[0]["layers"].size(), 3u);
  EXPECT_TRUE(kept[100]["layers_left_out"].get<bool>());
  EXPECT_TRUE(kept[100]["layers"].empty());
  // What placement, budgets and the outcome rows read is the same to 6 significant digits.
  const auto full = read_estimates(whole), compact = read_estimates(kept);
  ASSERT_EQ(full.size(), compact.size());
  for (std::size_t i = 0; i < full.size(); ++i) {
    EXPECT_EQ(compact[i].device, full[i].device);
    EXPECT_EQ(compact[i].ok, full[i].ok);
    EXPECT_NEAR(compact[i].joules_mean, full[i].joules_mean, 1e-5 * full[i].joules_mean);
    EXPECT_NEAR(compact[i].joules_std, full[i].joules_std, 1e-5 * full[i].joules_std);
    EXPECT_NEAR(compact[i].seconds_mean, full[i].seconds_mean, 1e-5 * full[i].seconds_mean);
    EXPECT_NEAR(compact[i].flops_per_step, full[i].flops_per_step, 1e-5 * full[i].flops_per_step);
    EXPECT_EQ(compact[i].steps, full[i].steps);
  }
}

// What a job decides with is the same live (from the estimate service's rows) and after a
// restart (read back from the text it stored): a job whose estimate did not move is not stored
// again, before or after a restart.
TEST(JobEstimateTest, the_figures_of_the_rows_and_of_their_stored_text_are_the_same) {
  std::vector<joule::daemon::EstimateRow> rows;
  for (int d = 0; d < 12; ++d) {
    joule::daemon::EstimateRow row;
    row.device = "agent-" + std::to_string(d) + "/cpu";
    estimator::Estimate estimate;
    estimate.source = "rapl";
    estimate.environment = "libtorch 1.13; openblas; 2 threads";
    estimate.steps = 3000;
    estimate.epochs = 2;
    estimate.joules = {1.0 / 3.0 + d * 0.37, 0.123456789};
    estimate.seconds = {1.4276266847022362, 0.0148};
    estimate.flops_baseline_joules = 0.6461 * (1.0 + d);
    for (int i = 0; i < 3; ++i) {
      estimator::LayerEstimate layer;
      layer.key = i == 1 ? "relu@hidden" : "linear@hidden";
      layer.flops_per_step = 51380224.0 / 3.0 + i;
      layer.joules_per_step = {1e-4 / 3.0, 1e-6};
      estimate.layers.push_back(layer);
    }
    estimate.warnings = {"OMP_NUM_THREADS differs from the model's"};
    if (d == 4) {  // a knob setting and a thread count, as placement and finished jobs read them
      estimator::SettingLine knob;
      knob.setting = estimator::KnobSetting{"gpu_power_limit_watts", 200.0, "200 W"};
      knob.basis = "measured";
      knob.joules_ratio = 0.8123456789;
      knob.seconds_ratio = 1.1;
      knob.joules = {0.9, 0.1};
      estimate.settings.push_back(knob);
      estimator::SettingLine threads = knob;
      threads.setting = estimator::KnobSetting{"threads", 4.0, "4 threads"};
      threads.basis = "response";
      estimate.settings.push_back(threads);
    }
    row.estimate = std::move(estimate);
    if (d == 3) {
      row.correction = joule::daemon::EstimateCorrection{};
      row.correction->model_joules = {0.2 / 3.0, 0.01};
      row.correction->model_seconds = estimator::Uncertain{1.0 / 7.0, 0.0};
    }
    rows.push_back(std::move(row));
  }
  rows.push_back({"cuda:0", std::nullopt, "no energy model yet", std::nullopt});
  const auto live = joule::daemon::figures_of(rows);
  const auto restarted = read_estimates(joule::daemon::stored_estimates(rows));
  ASSERT_EQ(live.size(), restarted.size());
  for (std::size_t i = 0; i < live.size(); ++i) EXPECT_TRUE(live[i].same_figures(restarted[i])) << live[i].device;
  EXPECT_EQ(live[3].model_joules_mean, restarted[3].model_joules_mean);
  EXPECT_EQ(restarted[3].model_seconds_mean, 0.142857);
  EXPECT_EQ(restarted[0].source, joule::EnergySource::rapl);
  EXPECT_NE(restarted[0].warnings_digest, 0u);
  ASSERT_EQ(restarted[4].settings.size(), 2u) << "a job at a setting finds its figures after a restart";
  EXPECT_TRUE(restarted[4].at(estimator::KnobSetting{"threads", 4.0, "4 threads"}));
  EXPECT_EQ(restarted[4].settings[0].joules_ratio, 0.812346);
  // A warning that changes, and nothing else, is a different estimate.
  auto warned = rows;
  warned[5].estimate->warnings.push_back("a runtime not measured yet");
  EXPECT_FALSE(joule::daemon::figures_of(warned)[5].same_figures(live[5]));
  EXPECT_FALSE(restarted.back().ok);
  // A figure that moves is a different estimate.
  auto moved = rows;
  moved[5].estimate->joules.mean *= 1.001;
  EXPECT_FALSE(joule::daemon::figures_of(moved)[5].same_figures(live[5]));
  EXPECT_TRUE(joule::daemon::stored_estimates({}).empty());
}

namespace {

// Whether `stored` is `shown` (a row as POST /v1/estimate shows it) with every floating-point
// figure to 6 significant digits (non-finite ones null), and the same keys, types and text.
void expect_rounded_equal(const json& stored, const json& shown, const std::string& where) {
  if (shown.is_number_float()) {
    const double value = shown.get<double>();
    if (!std::isfinite(value)) {
      EXPECT_TRUE(stored.is_null()) << where;
      return;
    }
    ASSERT_TRUE(stored.is_number_float()) << where << ": " << stored;
    EXPECT_EQ(stored.get<double>(), std::strtod(fmt::format("{:.6g}", value).c_str(), nullptr)) << where;
  } else if (shown.is_object()) {
    ASSERT_TRUE(stored.is_object()) << where;
    EXPECT_EQ(stored.size(), shown.size()) << where << ": " << stored;
    for (const auto& [key, value] : shown.items()) {
      ASSERT_TRUE(stored.contains(key)) << where << "/" << key;
      expect_rounded_equal(stored[key], value, where + "/" + key);
    }
  } else if (shown.is_array()) {
    ASSERT_TRUE(stored.is_array()) << where;
    ASSERT_EQ(stored.size(), shown.size()) << where;
    for (std::size_t i = 0; i < shown.size(); ++i)
      expect_rounded_equal(stored[i], shown[i], where + "/" + std::to_string(i));
  } else {
    EXPECT_EQ(stored, shown) << where;
  }
}

}  // namespace

// The stored text is written directly, not through nlohmann objects: it must say what
// estimate_row_json says, rounded, whatever a row holds (corrections with and without overhead,
// notes, runtimes, environments, text to escape, figures that are whole, tiny, huge or not finite).
TEST(JobEstimateTest, the_stored_text_is_each_rows_json_rounded_with_its_summed_flops) {
  std::vector<joule::daemon::EstimateRow> rows;
  for (int d = 0; d < 12; ++d) {
    auto row = estimator_row("node-" + std::to_string(d) + "/cpu", d == 0 ? 1e-300 : 1.0 + d * 0.37);
    auto& estimate = *row.estimate;
    estimate.source = d % 2 ? "rapl" : "simulated";
    if (d % 3 == 0) estimate.environment = "libtorch 1.13; \"openblas\"; 2 threads\n";
    if (d == 4) estimate.joules.std = std::numeric_limits<double>::quiet_NaN();
    if (d == 5) estimate.seconds.mean = 100.0;  // whole: still written as a floating-point number
    if (d == 6) estimate.joules_per_flop = 6.02214076e23;
    if (d == 7) estimate.warnings = {"a thread count the model was not learnt at", "ünïcode \\ and \t tabs"};
    if (d % 4 == 1) {
      joule::daemon::EstimateCorrection correction;
      correction.method = "kernel-ridge+conformal";
      correction.rows = 17;
      correction.mean_factor = 1.0 / 3.0;
      correction.sigma_scale = 2.5;
      correction.model_joules = {0.2 / 3.0, 0.01};
      if (d == 5) correction.note = "spread only: too few rows";
      if (d == 9) correction.model_seconds = estimator::Uncertain{1.0 / 7.0, 0.0};
      if (d == 9) correction.overhead = joule::daemon::EstimateCorrection::Overhead{3.5, 1.0 / 9.0, 0.25, 1e-7, 42};
      row.correction = correction;
    }
    if (d == 2) {
      estimate.runtime = estimator::RuntimeLines{
          "python", 11, {"batchnorm2d", "conv2d"}, {20.0, 2.0}, {1.0 / 3.0, 0.1}, {1e-3, 1e-4}, {2e-5, 0.0}};
    }
    rows.push_back(std::move(row));
  }
  rows.push_back({"cuda:0", std::nullopt, "no energy model yet", std::nullopt});
  const json stored = json::parse(joule::daemon::stored_estimates(rows));
  ASSERT_EQ(stored.size(), rows.size());
  std::size_t detailed = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const bool with_layers = stored[i].contains("layers") && !stored[i]["layers"].empty();
    detailed += with_layers ? 1 : 0;
    json shown = joule::daemon::estimate_row_json(rows[i], with_layers);
    if (rows[i].estimate) {
      shown["flops_per_step"] = joule::daemon::flops_per_step(*rows[i].estimate);
      if (!with_layers) shown["layers_left_out"] = true;
    }
    expect_rounded_equal(stored[i], shown, rows[i].device);
  }
  EXPECT_EQ(detailed, joule::daemon::kDetailedRows);
  EXPECT_EQ(stored[11]["layers_left_out"], true);  // the dearest
  EXPECT_EQ(stored[0]["layers"].size(), 3u);
}

// A job's stored row says what a network measured whole (or its family's gap) did to its layers'
// sum, as POST /v1/estimate shows it.
TEST(JobEstimateTest, a_stored_row_keeps_the_whole_network_basis_of_its_estimate) {
  auto row = estimator_row("cpu", 30.0);
  row.estimate->whole =
      estimator::WholeNetworkLine{"measured", "attention", 0.008, 4.2e-4, 1.25, 1.1, 1, 1'800'000'000'000};
  auto gap = estimator_row("cuda:0", 12.0);
  gap.estimate->whole = estimator::WholeNetworkLine{"family-gap", "recurrent", 0.004, 2e-4, 1.3, 1.2, 3, 0};
  const json kept = json::parse(joule::daemon::stored_estimates({row, gap}));
  ASSERT_EQ(kept.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    const json shown = joule::daemon::estimate_row_json(i == 0 ? row : gap)["whole"];
    ASSERT_TRUE(kept[i].contains("whole")) << kept[i].dump();
    ASSERT_EQ(kept[i]["whole"].size(), shown.size()) << kept[i]["whole"].dump() << shown.dump();
    for (const auto& [key, value] : shown.items()) {
      if (value.is_number_float())
        EXPECT_NEAR(kept[i]["whole"][key].get<double>(), value.get<double>(), 1e-5 * std::abs(value.get<double>()))
            << key;
      else
        EXPECT_EQ(kept[i]["whole"][key], value) << key;
    }
  }
  EXPECT_EQ(kept[0]["whole"]["measured_ms"], 1'800'000'000'000);
  EXPECT_FALSE(kept[1]["whole"].contains("measured_ms"));
}
