#include <gtest/gtest.h>

#include <cmath>

#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/runtime_cost.hpp"
#include "joule/estimator/thor_probes.hpp"
#include "layer_samples.hpp"

using namespace joule::estimator;
using joule::testing::linear_output_sample;

namespace {

// Readings of a runtime whose loop costs `base` + `per_module` × modules beyond LibTorch's, in
// joules and (a tenth of them) seconds, over a LibTorch step of 1 mJ.
std::vector<RuntimeStepReading> exact_readings(double base, double per_module) {
  std::vector<RuntimeStepReading> readings;
  for (std::int64_t modules : {3, 9, 33}) {
    const double extra = base + per_module * static_cast<double>(modules);
    readings.push_back({modules, 1e-3 + extra, (1e-3 + extra) / 10.0, 1e-3, 1e-4, 0.02});
  }
  return readings;
}

std::vector<RuntimeStartReading> starts() { return {{20.0, 1.1}, {22.0, 1.2}, {21.0, 1.15}}; }

ModelSpec classifier() {
  ModelSpec spec;
  spec.input_shape = {256};
  spec.layers = {LayerSpec{"linear", {{"out_features", 10}}, {}, {}}};
  return spec;
}

TrainingConfig steps(std::int64_t count) {
  TrainingConfig training;
  training.batch_size = 32;
  training.samples_per_epoch = 32 * count;
  return training;
}

}  // namespace

TEST(RuntimeCostTest, the_line_through_the_differences_is_recovered) {
  auto cost = fit_runtime_cost("python", exact_readings(5e-4, 2e-5), starts());
  ASSERT_TRUE(cost) << cost.error().message;
  EXPECT_NEAR(cost->step_joules_base, 5e-4, 1e-12);
  EXPECT_NEAR(cost->step_joules_per_module, 2e-5, 1e-12);
  EXPECT_NEAR(cost->step_seconds_base, 5e-5, 1e-12);
  EXPECT_NEAR(cost->step_seconds_per_module, 2e-6, 1e-12);
  EXPECT_NEAR(cost->step_joules(10), 5e-4 + 2e-4, 1e-12);
  // An exact line with steady readings claims no less than the floor.
  EXPECT_DOUBLE_EQ(cost->step_sigma, kRuntimeStepSigmaFloor);
  EXPECT_DOUBLE_EQ(cost->start_joules, 21.0);  // the median
  EXPECT_DOUBLE_EQ(cost->start_seconds, 1.15);
  EXPECT_DOUBLE_EQ(cost->start_sigma, kRuntimeStartSigmaFloor);  // (22 − 20) / 2 / 21 < the floor
}

TEST(RuntimeCostTest, a_runtime_never_makes_a_step_cheaper_and_noise_widens_its_sigma) {
  // Differences that fall with size are noise: the line is flat at their mean, never negative.
  std::vector<RuntimeStepReading> falling = {{3, 2e-3, 2e-4, 1e-3, 1e-4, 0.5}, {33, 1.5e-3, 1.5e-4, 1e-3, 1e-4, 0.1}};
  auto cost = fit_runtime_cost("python", falling, starts());
  ASSERT_TRUE(cost) << cost.error().message;
  EXPECT_DOUBLE_EQ(cost->step_joules_per_module, 0.0);
  EXPECT_NEAR(cost->step_joules_base, 0.75e-3, 1e-12);
  // A reading that moved 50 % while it was taken makes the line at least that unsure.
  EXPECT_GE(cost->step_sigma, 0.5);

  // LibTorch slower than Python at both sizes: nothing is added.
  std::vector<RuntimeStepReading> below = {{3, 0.9e-3, 1e-4, 1e-3, 1.1e-4, 0.0}, {9, 0.95e-3, 1e-4, 1e-3, 1.1e-4, 0.0}};
  auto none = fit_runtime_cost("python", below, starts());
  ASSERT_TRUE(none);
  EXPECT_EQ(none->step_joules(100), 0.0);
}

TEST(RuntimeCostTest, a_failed_or_partial_measurement_teaches_nothing) {
  auto no_start = fit_runtime_cost("python", exact_readings(1e-4, 1e-5), {});
  ASSERT_FALSE(no_start);
  EXPECT_NE(no_start.error().message.find("start-up"), std::string::npos);
  auto one_size = fit_runtime_cost("python", {exact_readings(1e-4, 1e-5)[0]}, starts());
  ASSERT_FALSE(one_size);
  EXPECT_NE(one_size.error().message.find("two module counts"), std::string::npos);
  auto readings = exact_readings(1e-4, 1e-5);
  readings[1].worker_joules = std::nan("");
  auto not_finite = fit_runtime_cost("python", readings, starts());
  ASSERT_FALSE(not_finite);
  EXPECT_EQ(not_finite.error().where, "steps/1");
  auto zero_start = fit_runtime_cost("python", exact_readings(1e-4, 1e-5), {{0.0, 1.0}});
  ASSERT_FALSE(zero_start);
  EXPECT_EQ(zero_start.error().where, "starts/0");
}

TEST(RuntimeCostTest, saved_and_loaded_it_is_the_same_and_bad_json_is_refused) {
  auto cost = fit_runtime_cost("python", exact_readings(5e-4, 2e-5), starts());
  ASSERT_TRUE(cost);
  cost->interpreter = "/usr/bin/python3";
  cost->version = "Python 3.11.2, torch 1.13.1";
  cost->source = "rapl";
  cost->measured_ms = 1234;
  auto again = runtime_cost_from_json(to_json(*cost));
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(to_json(*again), to_json(*cost));
  auto broken = to_json(*cost);
  broken["step"]["joules_base"] = "many";
  auto refused = runtime_cost_from_json(broken);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().where, "/step/joules_base");
  EXPECT_FALSE(runtime_cost_from_json(nlohmann::json::array()));
}

TEST(RuntimeCostTest, a_command_says_which_runtime_its_loop_runs_in) {
  EXPECT_EQ(runtime_of_command({"python3", "train.py"}), "python");
  EXPECT_EQ(runtime_of_command({"/usr/bin/python3.11", "-m", "trainer"}), "python");
  EXPECT_EQ(runtime_of_command({"/srv/venv/bin/python", "train.py"}), "python");
  EXPECT_EQ(runtime_of_command({"/usr/bin/env", "OMP_NUM_THREADS=2", "python3", "train.py"}), "python");
  EXPECT_EQ(runtime_of_command({"torchrun", "--nproc-per-node", "1", "train.py"}), "python");
  EXPECT_EQ(runtime_of_command({"bash", "run.sh"}), "");
  EXPECT_EQ(runtime_of_command({"/opt/trainer/bin/train"}), "");
  EXPECT_EQ(runtime_of_command({"python3-config"}), "");
  EXPECT_EQ(runtime_of_command({}), "");
}

TEST(RuntimeCostTest, an_estimate_adds_the_runtime_once_per_job_and_per_step_only_where_asked) {
  DeviceEnergyModel model("cpu", "rapl");
  ASSERT_TRUE(model.add_sample(linear_output_sample(256, 0.01)));
  ASSERT_TRUE(model.fit());
  auto bare = model.estimate(classifier(), steps(100));
  ASSERT_TRUE(bare) << bare.error().message;

  // Asked for a runtime the device has not measured: nothing is added, and a warning says so.
  auto unmeasured = model.estimate(classifier(), steps(100), "python");
  ASSERT_TRUE(unmeasured);
  EXPECT_DOUBLE_EQ(unmeasured->joules.mean, bare->joules.mean);
  EXPECT_FALSE(unmeasured->runtime);
  ASSERT_FALSE(unmeasured->warnings.empty());
  EXPECT_NE(unmeasured->warnings.back().find("python has not been measured on device cpu"), std::string::npos);

  const std::uint64_t before = model.revision();
  auto cost = fit_runtime_cost("python", exact_readings(5e-3, 1e-3), starts());
  ASSERT_TRUE(cost);
  model.set_runtime(*cost);
  EXPECT_NE(model.revision(), before);  // kept answers computed from the model are stale

  auto python = model.estimate(classifier(), steps(100), "python");
  ASSERT_TRUE(python);
  ASSERT_TRUE(python->runtime);
  EXPECT_EQ(python->runtime->modules, 1);
  const double per_step = 5e-3 + 1e-3;
  EXPECT_NEAR(python->joules_per_step.mean, bare->joules_per_step.mean + per_step, 1e-12);
  EXPECT_NEAR(python->joules.mean, bare->joules.mean + 100 * per_step + 21.0, 1e-9);
  EXPECT_NEAR(python->seconds.mean, bare->seconds.mean + 100 * per_step / 10.0 + 1.15, 1e-9);
  // Its errors join the layers': wider than either alone.
  EXPECT_GT(python->joules.std, bare->joules.std);
  EXPECT_GT(python->joules.std, kRuntimeStartSigmaFloor * 21.0);
  const auto json = to_json(*python);
  EXPECT_EQ(json["runtime"]["runtime"], "python");
  EXPECT_DOUBLE_EQ(json["runtime"]["start_joules"]["mean"].get<double>(), 21.0);

  // A built-in job (no runtime) is estimated without it.
  auto builtin = model.estimate(classifier(), steps(100), "");
  ASSERT_TRUE(builtin);
  EXPECT_DOUBLE_EQ(builtin->joules.mean, bare->joules.mean);

  // The runtime travels with the saved model.
  auto loaded = DeviceEnergyModel::load(model.save());
  ASSERT_TRUE(loaded) << loaded.error().message;
  ASSERT_EQ(loaded->runtimes().count("python"), 1u);
  auto again = loaded->estimate(classifier(), steps(100), "python");
  ASSERT_TRUE(again);
  EXPECT_NEAR(again->joules.mean, python->joules.mean, 1e-9 * python->joules.mean);
  auto saved = model.save();
  saved["runtimes"]["python"]["start"]["joules"] = -1;
  auto refused = DeviceEnergyModel::load(saved);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("runtimes/python/start/joules"), std::string::npos) << refused.error().message;
}

TEST(RuntimeCostTest, composite_layers_count_the_module_calls_pytorch_makes_for_them) {
  EXPECT_EQ(python_module_calls("linear"), 1);
  EXPECT_EQ(python_module_calls("add"), 1);
  EXPECT_EQ(python_module_calls("lstm"), 1);
  EXPECT_EQ(python_module_calls("transformer_encoder_layer"), 9);
}

TEST(RuntimeCostTest, a_simulated_device_has_no_interpreter_to_measure_and_does_not_ask_for_one) {
  DeviceEnergyModel model("sim:laptop-cpu", "simulated");
  ASSERT_TRUE(model.add_sample(linear_output_sample(256, 0.01)));
  ASSERT_TRUE(model.fit());
  auto estimate = model.estimate(classifier(), steps(10), "python");
  ASSERT_TRUE(estimate);
  EXPECT_FALSE(estimate->runtime);
  for (const auto& warning : estimate->warnings) EXPECT_EQ(warning.find("has not been measured"), std::string::npos);
}

TEST(RuntimeCostTest, paired_differences_are_what_the_line_is_fitted_to) {
  // The medians of each side say 1 ms apart; the pairs, read back to back, say 0.2 and 0.4 ms.
  std::vector<RuntimeStepReading> readings = {{3, 2e-3, 2e-4, 1e-3, 1e-4, 0.3}, {9, 2e-3, 2e-4, 1e-3, 1e-4, 0.3}};
  readings[0].difference_joules = 2e-4;
  readings[0].difference_seconds = 2e-5;
  readings[1].difference_joules = 4e-4;
  readings[1].difference_seconds = 4e-5;
  auto cost = fit_runtime_cost("python", readings, starts());
  ASSERT_TRUE(cost) << cost.error().message;
  EXPECT_NEAR(cost->step_joules(3), 2e-4, 1e-12);
  EXPECT_NEAR(cost->step_joules(9), 4e-4, 1e-12);
  EXPECT_NEAR(cost->step_seconds_per_module, 2e-5 / 6.0, 1e-12);
  // They travel with the saved cost.
  auto again = runtime_cost_from_json(to_json(*cost));
  ASSERT_TRUE(again);
  EXPECT_DOUBLE_EQ(again->steps[1].difference_joules, 4e-4);
}

namespace {

// One probe run of `python3` at `at_ms` whose loop costs `base` + `per_module` × modules.
RuntimeCost run_at(std::int64_t at_ms, double base, double per_module, double start_joules = 21.0) {
  auto readings = exact_readings(base, per_module);
  for (auto& r : readings) r.measured_ms = at_ms;
  std::vector<RuntimeStartReading> started;
  for (auto s : starts()) {
    s.joules += start_joules - 21.0;
    s.measured_ms = at_ms;
    started.push_back(s);
  }
  auto cost = fit_runtime_cost("python", readings, started);
  EXPECT_TRUE(cost) << cost.error().message;
  cost->interpreter = "/usr/bin/python3";
  cost->version = "Python 3.11.2, torch 1.13.1";
  cost->source = "modelled";
  cost->measured_ms = at_ms;
  return *cost;
}

}  // namespace

TEST(RuntimeCostTest, runs_read_again_are_pooled_and_their_disagreement_widens_the_sigma) {
  // Three runs of the same interpreter that disagree as this VM's did (15 against 150 µs).
  const RuntimeCost first = run_at(1'000, 1.5e-4, 2e-5);
  ASSERT_EQ(first.runs(), 1);
  auto second = pool_runtime_runs(first, run_at(2'000, 1.5e-3, 2e-5));
  ASSERT_TRUE(second) << second.error().message;
  EXPECT_EQ(second->runs(), 2);
  EXPECT_EQ(second->steps.size(), 6u);
  EXPECT_EQ(second->measured_ms, 2'000);
  EXPECT_EQ(second->interpreter, "/usr/bin/python3");
  // The line runs between the two runs', and is as unsure as their disagreement: each run alone
  // claims the floor.
  EXPECT_NEAR(second->step_joules_base, (1.5e-4 + 1.5e-3) / 2.0, 1e-9);
  EXPECT_NEAR(second->step_joules_per_module, 2e-5, 1e-9);
  EXPECT_DOUBLE_EQ(first.step_sigma, kRuntimeStepSigmaFloor);
  EXPECT_GT(second->step_sigma, 2.0 * kRuntimeStepSigmaFloor);

  // A third run agreeing with the second; a fourth pushes the first out, and the line is theirs.
  auto third = pool_runtime_runs(*second, run_at(3'000, 1.5e-3, 2e-5, 25.0));
  ASSERT_TRUE(third);
  EXPECT_EQ(third->runs(), 3);
  EXPECT_DOUBLE_EQ(third->start_joules, 22.0);  // the median of all nine start-ups
  auto fourth = pool_runtime_runs(*third, run_at(4'000, 1.5e-3, 2e-5));
  ASSERT_TRUE(fourth);
  EXPECT_EQ(fourth->runs(), kRuntimeRunsPooled);
  for (const auto& r : fourth->steps) EXPECT_GE(r.measured_ms, 2'000);
  for (const auto& s : fourth->starts) EXPECT_GE(s.measured_ms, 2'000);
  EXPECT_NEAR(fourth->step_joules_base, 1.5e-3, 1e-9);
  EXPECT_DOUBLE_EQ(fourth->step_sigma, kRuntimeStepSigmaFloor);

  // Saved and loaded, the runs stay told apart.
  auto loaded = runtime_cost_from_json(to_json(*fourth));
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->runs(), kRuntimeRunsPooled);
  EXPECT_EQ(to_json(*fourth)["runs"], 3);
}

TEST(RuntimeCostTest, another_interpreter_or_meter_is_measured_afresh_not_pooled) {
  const RuntimeCost first = run_at(1'000, 1.5e-4, 2e-5);
  RuntimeCost upgraded = run_at(2'000, 1.5e-3, 2e-5);
  upgraded.version = "Python 3.11.2, torch 2.1.0";
  auto pooled = pool_runtime_runs(first, upgraded);
  ASSERT_TRUE(pooled);
  EXPECT_EQ(pooled->runs(), 1);
  EXPECT_NEAR(pooled->step_joules_base, 1.5e-3, 1e-9);
  RuntimeCost rapl = run_at(2'000, 1.5e-3, 2e-5);
  rapl.source = "rapl";
  EXPECT_EQ(pool_runtime_runs(first, rapl)->runs(), 1);
  // Readings saved before runs were told apart count as one run, and pool with a new one.
  RuntimeCost old = first;
  for (auto& r : old.steps) r.measured_ms = 0;
  for (auto& s : old.starts) s.measured_ms = 0;
  EXPECT_EQ(old.runs(), 1);
  EXPECT_EQ(pool_runtime_runs(old, run_at(2'000, 1.5e-4, 2e-5))->runs(), 2);
}

namespace {

// A reading of `layers` layers of `kind` (plus a flatten and a Linear on the line) whose runtime
// costs `per_layer` joules per layer of the kind beyond the line's price of the rest.
RuntimeStepReading kind_reading(const std::string& kind, std::int64_t layers, double base, double per_module,
                                double per_layer) {
  const std::int64_t others = 2;
  const std::int64_t modules = others + layers * python_module_calls(kind);
  const double extra = base + per_module * static_cast<double>(others) + per_layer * static_cast<double>(layers);
  RuntimeStepReading reading{modules, 1e-3 + extra, (1e-3 + extra) / 10.0, 1e-3, 1e-4, 0.02};
  reading.kind = kind;
  reading.kind_layers = layers;
  return reading;
}

}  // namespace

TEST(RuntimeCostTest, a_kind_read_on_its_own_network_costs_its_own_figure_and_the_rest_stays_on_the_line) {
  // The line's networks say 5 mJ + 1 mJ per module; a conv2d layer costs 9 mJ, a batch norm 6.
  auto readings = exact_readings(5e-3, 1e-3);
  readings.push_back(kind_reading("conv2d", 8, 5e-3, 1e-3, 9e-3));
  readings.push_back(kind_reading("batchnorm2d", 8, 5e-3, 1e-3, 6e-3));
  auto cost = fit_runtime_cost("python", readings, starts());
  ASSERT_TRUE(cost) << cost.error().message;
  // The kinds' readings do not move the line.
  EXPECT_NEAR(cost->step_joules_base, 5e-3, 1e-12);
  EXPECT_NEAR(cost->step_joules_per_module, 1e-3, 1e-12);
  ASSERT_EQ(cost->kinds.size(), 2u);
  EXPECT_NEAR(cost->kinds.at("conv2d").joules_per_layer, 9e-3, 1e-12);
  EXPECT_NEAR(cost->kinds.at("conv2d").seconds_per_layer, 9e-4, 1e-12);
  EXPECT_NEAR(cost->kinds.at("batchnorm2d").joules_per_layer, 6e-3, 1e-12);
  EXPECT_EQ(cost->kinds.at("conv2d").readings, 1);

  // conv2d ×2 and batchnorm2d at their own figures; relu ×2, flatten and linear on the line.
  const auto priced = cost->step_cost({"conv2d", "batchnorm2d", "relu", "conv2d", "relu", "flatten", "linear"});
  EXPECT_EQ(priced.modules, 7);
  EXPECT_EQ(priced.modules_on_line, 4);
  EXPECT_EQ(priced.kinds_read, (std::vector<std::string>{"batchnorm2d", "conv2d"}));
  EXPECT_NEAR(priced.joules, 5e-3 + 4 * 1e-3 + 2 * 9e-3 + 6e-3, 1e-12);

  // And so in an estimate: what it adds per step, and which kinds it priced so (a device that has
  // layer models for Linear only, its one layer priced as a kind read).
  DeviceEnergyModel model("cpu", "rapl");
  ASSERT_TRUE(model.add_sample(linear_output_sample(256, 0.01)));
  ASSERT_TRUE(model.fit());
  RuntimeCost with_linear = *cost;
  with_linear.kinds["linear"] = RuntimeKindCost{3e-3, 3e-4, 1};
  model.set_runtime(with_linear);
  auto estimate = model.estimate(classifier(), steps(10), "python");
  ASSERT_TRUE(estimate) << estimate.error().message;
  ASSERT_TRUE(estimate->runtime);
  EXPECT_NEAR(estimate->runtime->step_joules.mean, 5e-3 + 3e-3, 1e-12);  // the base, and no module on the line
  EXPECT_EQ(to_json(*estimate)["runtime"]["kinds_read"], (nlohmann::json{"linear"}));

  // Saved and loaded, the kinds and their readings come back; pooled with a later run, they stay.
  auto loaded = runtime_cost_from_json(to_json(*cost));
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_NEAR(loaded->kinds.at("conv2d").joules_per_layer, 9e-3, 1e-15);
  EXPECT_EQ(loaded->steps.back().kind, "batchnorm2d");
  EXPECT_EQ(loaded->steps.back().kind_layers, 8);
  auto bad = to_json(*cost);
  bad["kinds"]["conv2d"]["joules_per_layer"] = "a lot";
  auto refused = runtime_cost_from_json(bad);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().where.find("/kinds/conv2d"), std::string::npos) << refused.error().where;
}

TEST(RuntimeCostTest, a_kind_cheaper_than_the_line_costs_nothing_less_than_zero_and_a_bad_kind_reading_is_refused) {
  auto readings = exact_readings(5e-3, 1e-3);
  // Its network read below the line's price of its other modules: noise, or a kind with no
  // Python-side work; it never makes a step cheaper.
  readings.push_back(kind_reading("relu6", 8, 5e-3, 1e-3, -1e-4));
  auto cost = fit_runtime_cost("python", readings, starts());
  ASSERT_TRUE(cost) << cost.error().message;
  EXPECT_DOUBLE_EQ(cost->kinds.at("relu6").joules_per_layer, 0.0);

  auto broken = exact_readings(5e-3, 1e-3);
  broken.push_back(kind_reading("conv2d", 8, 5e-3, 1e-3, 9e-3));
  broken.back().kind_layers = 0;
  auto refused = fit_runtime_cost("python", broken, starts());
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().where, "steps/3");
  // Kind readings alone do not make a line: two module counts of the line's own are needed.
  auto kinds_only = std::vector<RuntimeStepReading>{kind_reading("conv2d", 8, 5e-3, 1e-3, 9e-3),
                                                    kind_reading("lstm", 4, 5e-3, 1e-3, 9e-3)};
  EXPECT_FALSE(fit_runtime_cost("python", kinds_only, starts()));
}

TEST(RuntimeCostTest, the_kinds_to_read_are_the_workloads_not_read_yet_then_those_read_before) {
  const std::vector<std::string> types = {"conv2d", "relu",        "conv2d", "batchnorm2d", "linear", "add",
                                          "conv2d", "batchnorm2d", "lstm",   "embedding",   "flatten"};
  // relu is the line's, add a join, embedding needs tokens: none is read on its own.
  const auto wanted = runtime_readable_kinds(types);
  EXPECT_EQ(wanted, (std::vector<std::string>{"conv2d", "batchnorm2d", "flatten", "linear", "lstm"}));
  EXPECT_EQ(runtime_kinds_to_read(wanted, {}), wanted);
  // Three a run: a workload of five kinds is read whole over two runs, the kinds not read yet
  // first; kinds read before that the workload no longer holds come last.
  const std::map<std::string, RuntimeKindCost> first = {{"conv2d", {}}, {"batchnorm2d", {}}, {"flatten", {}}};
  EXPECT_EQ(runtime_kinds_to_read(wanted, first, 3), (std::vector<std::string>{"linear", "lstm", "conv2d"}));
  const std::map<std::string, RuntimeKindCost> before = {{"gru", {}}, {"lstm", {}}, {"layernorm", {}}};
  EXPECT_EQ(runtime_kinds_to_read(wanted, before, 6),
            (std::vector<std::string>{"conv2d", "batchnorm2d", "flatten", "linear", "lstm", "gru"}));
  EXPECT_TRUE(runtime_kind_readable("linear"));
  EXPECT_FALSE(runtime_kind_readable("relu"));
  EXPECT_FALSE(runtime_kind_readable("concat"));
  EXPECT_TRUE(runtime_kind_readable("transformer_encoder_layer"));
}
