#include <gtest/gtest.h>

#include "example_models.hpp"
#include "layer_samples.hpp"
#include "noise_free_meter.hpp"

#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/probe_campaign.hpp"
#include "joule/estimator/simulated_device.hpp"
#include "joule/estimator/thor_probes.hpp"

using namespace joule::estimator;
using joule::testing::linear_output_sample;
using joule::testing::noise_free_meter;
using nlohmann::json;

namespace {

ModelSpec lenet() { return *parse_model_spec(joule::testing::example_model("lenet5"), "/model"); }

ProbeTarget conv_target(LayerPosition position) {
  ProbeTarget target;
  target.layer = LayerSpec{"conv2d", {{"out_channels", 16}, {"kernel_size", 3}}, {}, {}};
  target.input_shape = {8, 12, 12};
  target.batch_size = 32;
  target.position = position;
  return target;
}

}  // namespace

TEST(ThorProbesTest, positions_follow_the_input_gradient_and_the_last_layer) {
  auto layers = analyze_model(lenet(), 32);
  ASSERT_TRUE(layers);
  const auto keys = layer_keys(*layers);
  EXPECT_EQ(keys.front().name(), "conv2d@input");
  EXPECT_EQ(keys[1].name(), "relu@hidden");
  EXPECT_EQ(keys[3].name(), "conv2d@hidden");
  EXPECT_EQ(keys.back().name(), "linear@output");
}

TEST(ThorProbesTest, plans_one_two_or_four_networks_with_signs) {
  auto output = plan_probe(conv_target(LayerPosition::output));
  ASSERT_TRUE(output);
  EXPECT_EQ(output->networks.size(), 1u);
  auto input = plan_probe(conv_target(LayerPosition::input));
  ASSERT_TRUE(input);
  ASSERT_EQ(input->networks.size(), 2u);
  EXPECT_EQ(input->signs, (std::vector<int>{+1, -1}));
  EXPECT_EQ(input->networks[0].layers.front().type, "conv2d");
  EXPECT_EQ(input->networks[0].layers.back().type, "linear");  // the classifier head, after a flatten
  auto hidden = plan_probe(conv_target(LayerPosition::hidden));
  ASSERT_TRUE(hidden);
  ASSERT_EQ(hidden->networks.size(), 4u);
  EXPECT_EQ(hidden->signs, (std::vector<int>{+1, -1, +1, -1}));
  EXPECT_TRUE(hidden->analyzed.input_gradient);  // the reference layer puts it in the hidden position
  EXPECT_FALSE(input->analyzed.input_gradient);
}

TEST(ThorProbesTest, embeddings_cannot_be_hidden_and_misfits_are_refused) {
  ProbeTarget embedding;
  embedding.layer = LayerSpec{"embedding", {{"num_embeddings", 100}, {"embedding_dim", 8}}, {}, {}};
  embedding.input_shape = {16};
  embedding.input_dtype = "token";
  embedding.position = LayerPosition::hidden;
  EXPECT_FALSE(plan_probe(embedding));
  embedding.position = LayerPosition::input;
  EXPECT_TRUE(plan_probe(embedding));
  ProbeTarget too_big = conv_target(LayerPosition::input);
  too_big.layer.args["kernel_size"] = 20;
  EXPECT_FALSE(plan_probe(too_big));
}

TEST(ThorProbesTest, decomposition_recovers_an_output_layer_exactly_on_a_noise_free_device) {
  SimulatedDevice device(*find_simulated_profile("laptop-cpu"), 1);
  auto plan = plan_probe(conv_target(LayerPosition::output));
  ASSERT_TRUE(plan);
  auto measured = noise_free_meter(device)(plan->networks[0], 32, "sgd");
  auto sample = decompose(*plan, {*measured});
  ASSERT_TRUE(sample);
  EXPECT_EQ(sample->key.name(), "conv2d@output");
  EXPECT_DOUBLE_EQ(sample->joules_per_step, measured->joules_per_step);
  EXPECT_EQ(sample->features.at("batch_size"), 32);
  EXPECT_FALSE(decompose(*plan, {}));
}

TEST(ThorProbesTest, decomposed_input_layer_is_its_own_cost_plus_the_head_gradient_it_enables) {
  SimulatedDevice device(*find_simulated_profile("laptop-cpu"), 1);
  auto plan = plan_probe(conv_target(LayerPosition::input));
  ASSERT_TRUE(plan);
  std::vector<NetworkMeasurement> measured;
  for (const auto& network : plan->networks) measured.push_back(*noise_free_meter(device)(network, 32, "sgd"));
  auto sample = decompose(*plan, measured);
  ASSERT_TRUE(sample);
  // The layer's own cost is a lower bound: the head after it now computes an input gradient too.
  EXPECT_GT(sample->joules_per_step, device.layer_cost(plan->analyzed).joules);
  EXPECT_LT(sample->joules_per_step, 2.0 * device.layer_cost(plan->analyzed).joules + 1e-3);
}

TEST(SimulatedDeviceTest, profiles_differ_and_noise_is_seeded) {
  auto layers = analyze_model(lenet(), 64);
  ASSERT_TRUE(layers);
  std::vector<double> joules;
  for (const auto& profile : simulated_profiles()) {
    SimulatedDevice device(profile, 3);
    joules.push_back(device.step_cost(*layers, "cross_entropy").joules);
  }
  std::sort(joules.begin(), joules.end());
  EXPECT_GT(joules.back() / joules.front(), 3.0);  // a Pi and a server GPU are not alike
  SimulatedDevice a(*find_simulated_profile("jetson-orin"), 5), b(*find_simulated_profile("jetson-orin"), 5);
  EXPECT_EQ(a.measure_step(*layers, "cross_entropy").joules, b.measure_step(*layers, "cross_entropy").joules);
  EXPECT_FALSE(find_simulated_profile("cray-1"));
}

TEST(DeviceEnergyModelTest, no_model_means_no_number) {
  DeviceEnergyModel model("sim:laptop-cpu", "simulated");
  TrainingConfig training;
  training.samples_per_epoch = 1000;
  auto estimate = model.estimate(lenet(), training);
  ASSERT_FALSE(estimate);
  EXPECT_NE(estimate.error().message.find("conv2d@input"), std::string::npos) << estimate.error().message;
  EXPECT_NE(estimate.error().message.find("probe"), std::string::npos);
}

TEST(DeviceEnergyModelTest, a_probe_campaign_estimates_an_unmeasured_network) {
  SimulatedDevice device(*find_simulated_profile("laptop-cpu"), 9);
  DeviceEnergyModel model("sim:laptop-cpu", "simulated");
  CampaignOptions options;
  options.probes = 150;
  options.gp.restarts = 1;
  auto report = run_campaign(model, {WorkloadItem{lenet(), 64}}, noise_free_meter(device), options);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->failed_measurements, 0u);
  TrainingConfig training;
  training.batch_size = 64;
  training.samples_per_epoch = 6400;
  auto estimate = model.estimate(lenet(), training);
  ASSERT_TRUE(estimate) << estimate.error().message;
  auto layers = analyze_model(lenet(), 64);
  const double truth = device.step_cost(*layers, "cross_entropy").joules * 100;
  EXPECT_EQ(estimate->steps, 100);
  EXPECT_NEAR(estimate->joules.mean / truth, 1.0, 0.15);
  EXPECT_GT(estimate->joules.std, 0.0);
  EXPECT_EQ(estimate->layers.size(), 12u);
  EXPECT_EQ(estimate->source, "simulated");
  EXPECT_GT(estimate->flops_baseline_joules, 0.0);

  auto loaded = DeviceEnergyModel::load(model.save());
  ASSERT_TRUE(loaded) << loaded.error().message;
  auto again = loaded->estimate(lenet(), training);
  ASSERT_TRUE(again);
  EXPECT_NEAR(again->joules.mean, estimate->joules.mean, 1e-9 * estimate->joules.mean);
  EXPECT_FALSE(to_json(*again).contains("environment"));  // unknown: not named

  // The environment it was learnt under travels with the model and names its estimates.
  model.set_environment("libtorch 1.13.0; openblas 0.3.21; threads 1");
  auto named = DeviceEnergyModel::load(model.save());
  ASSERT_TRUE(named) << named.error().message;
  EXPECT_EQ(named->environment(), "libtorch 1.13.0; openblas 0.3.21; threads 1");
  EXPECT_EQ(to_json(*named->estimate(lenet(), training))["environment"], named->environment());
}

// A network prepared once and estimated on several devices gives each device the estimate it
// gives alone, to the bit: the keys, work and feature vectors found once are the same ones.
TEST(DeviceEnergyModelTest, a_network_prepared_once_estimates_as_on_each_device_alone) {
  std::vector<std::unique_ptr<DeviceEnergyModel>> models;
  for (const char* profile : {"laptop-cpu", "jetson-orin"}) {
    SimulatedDevice device(*find_simulated_profile(profile), 3);
    models.push_back(std::make_unique<DeviceEnergyModel>(std::string("sim:") + profile, "simulated"));
    CampaignOptions options;
    options.probes = 80;
    options.gp.restarts = 1;
    ASSERT_TRUE(run_campaign(*models.back(), {WorkloadItem{lenet(), 32}}, noise_free_meter(device), options));
  }
  TrainingConfig training;
  training.batch_size = 32;
  training.samples_per_epoch = 3200;
  auto layers = analyze_model(lenet(), 32);
  ASSERT_TRUE(layers);
  const PreparedNetwork network(*layers, 32);
  for (const auto& model : models) {
    const auto alone = model->estimate(*layers, training);
    const auto prepared = model->estimate(network, training);
    ASSERT_TRUE(alone && prepared);
    EXPECT_EQ(to_json(*prepared), to_json(*alone)) << model->device();
  }
  // Prepared for another batch size: estimated as the training says, not from stale features.
  training.batch_size = 64;
  const auto other = models[0]->estimate(network, training);
  ASSERT_TRUE(other);
  EXPECT_EQ(to_json(*other), to_json(*models[0]->estimate(*layers, training)));
}

namespace {

ModelSpec linear_classifier(std::int64_t features) {
  ModelSpec spec;
  spec.input_shape = {features};
  spec.layers = {LayerSpec{"linear", {{"out_features", 10}}, {}, {}}};
  return spec;
}

double work_of(std::int64_t features) {
  auto layers = analyze_model(linear_classifier(features), 32);
  return layer_work(layers->front().cost);
}

TrainingConfig one_step() {
  TrainingConfig training;
  training.batch_size = 32;
  training.samples_per_epoch = 32;
  return training;
}

}  // namespace

TEST(DeviceEnergyModelTest, one_sample_estimates_by_work_with_a_wide_spread_and_says_so) {
  DeviceEnergyModel model("cpu", "rapl");
  ASSERT_TRUE(model.add_sample(linear_output_sample(256, 0.01)));
  ASSERT_TRUE(model.fit());
  auto estimate = model.estimate(linear_classifier(1024), one_step());
  ASSERT_TRUE(estimate) << estimate.error().message;
  ASSERT_EQ(estimate->layers.size(), 1u);
  EXPECT_TRUE(estimate->layers[0].sparse);
  // One sample: the prior is proportional to work, the median exactly the sample scaled by it.
  const double median = 0.01 * work_of(1024) / work_of(256);
  EXPECT_NEAR(estimate->joules_per_step.mean / median, std::exp(kSparseSigma * kSparseSigma / 2.0), 1e-6);
  // Its spread: the prior's σ = 0.5 in log space, plus the step's structural share.
  EXPECT_NEAR(estimate->joules_per_step.std / estimate->joules_per_step.mean,
              std::sqrt(std::expm1(0.25) + kStructuralSigma * kStructuralSigma), 1e-6);
  ASSERT_FALSE(estimate->warnings.empty());
  EXPECT_NE(estimate->warnings.back().find("linear@output: 1 probe sample(s)"), std::string::npos)
      << estimate->warnings.back();
  EXPECT_EQ(to_json(*estimate)["layers"][0]["sparse"], true);
}

TEST(DeviceEnergyModelTest, far_from_its_samples_a_kind_scales_with_work_not_towards_their_mean) {
  // Energy proportional to work (±1 %): a GP with a constant mean would pull a layer 16 times
  // the largest probed one back towards the probes' average; the prior carries it.
  DeviceEnergyModel model("cpu", "rapl");
  const double per_work = 2e-10;
  int i = 0;
  for (std::int64_t features : {32, 48, 64, 96, 128, 192, 256}) {
    const double wobble = 1.0 + 0.01 * ((i++ % 3) - 1);
    ASSERT_TRUE(model.add_sample(linear_output_sample(features, per_work * work_of(features) * wobble)));
  }
  GpFitOptions options;
  options.restarts = 1;
  ASSERT_TRUE(model.fit(options));
  auto estimate = model.estimate(linear_classifier(4096), one_step());
  ASSERT_TRUE(estimate) << estimate.error().message;
  EXPECT_FALSE(estimate->layers[0].sparse);
  EXPECT_NEAR(estimate->joules_per_step.mean / (per_work * work_of(4096)), 1.0, 0.1);

  auto loaded = DeviceEnergyModel::load(model.save());
  ASSERT_TRUE(loaded) << loaded.error().message;
  auto again = loaded->estimate(linear_classifier(4096), one_step());
  ASSERT_TRUE(again);
  EXPECT_NEAR(again->joules_per_step.mean, estimate->joules_per_step.mean, 1e-9 * estimate->joules_per_step.mean);
}

TEST(DeviceEnergyModelTest, a_saved_prior_without_the_work_of_its_samples_is_refused) {
  DeviceEnergyModel model("cpu", "rapl");
  ASSERT_TRUE(model.add_sample(linear_output_sample(256, 0.01)));
  ASSERT_TRUE(model.fit());
  auto saved = model.save();
  saved["models"]["linear@output"].erase("log_work");
  auto loaded = DeviceEnergyModel::load(saved);
  ASSERT_FALSE(loaded);
  EXPECT_NE(loaded.error().message.find("work"), std::string::npos) << loaded.error().message;
}

TEST(DeviceEnergyModelTest, a_sample_without_its_counts_leaves_its_kind_without_a_prior) {
  // Samples restored from rows that lost their target: the kind waits for a GP, as before priors.
  DeviceEnergyModel model("cpu", "rapl");
  auto sample = linear_output_sample(256, 0.01);
  sample.cost = LayerCost{};
  ASSERT_TRUE(model.add_sample(sample));
  ASSERT_TRUE(model.fit());
  EXPECT_FALSE(model.estimate(linear_classifier(256), one_step()));
}

TEST(ThorProbesTest, an_optimizer_probe_measures_one_classifier_with_the_optimizer_and_with_sgd) {
  auto plan = plan_probe(optimizer_target("adam", 100'000));
  ASSERT_TRUE(plan) << plan.error().message;
  ASSERT_EQ(plan->networks.size(), 2u);
  EXPECT_EQ(to_json(plan->networks[0]), to_json(plan->networks[1]));
  EXPECT_EQ(plan->optimizers, (std::vector<std::string>{"adam", "sgd"}));
  EXPECT_EQ(plan->signs, (std::vector<int>{+1, -1}));
  // About the parameters asked for: a linear classifier on 1,024 features.
  EXPECT_NEAR(static_cast<double>(plan->analyzed.cost.parameters), 100'000.0, 1'025.0);
  EXPECT_FALSE(plan_probe(optimizer_target("sgd", 1000)));  // sgd is what every probe trains with
  EXPECT_FALSE(plan_probe(optimizer_target("lion", 1000)));

  SimulatedDevice device(*find_simulated_profile("laptop-cpu"), 1);
  const auto meter = noise_free_meter(device);
  auto with = meter(plan->networks[0], plan->target.batch_size, "adam");
  auto without = meter(plan->networks[1], plan->target.batch_size, "sgd");
  auto sample = decompose(*plan, {*with, *without});
  ASSERT_TRUE(sample);
  EXPECT_EQ(sample->key.name(), "optimizer:adam@output");
  EXPECT_EQ(sample->features, (std::map<std::string, double>{{"parameters", plan->analyzed.cost.parameters}}));
  EXPECT_GT(sample->joules_per_step, 0.0);  // Adam's moments cost more passes over the parameters
}

TEST(DeviceEnergyModelTest, another_optimizer_adds_its_own_line_learnt_from_its_probes) {
  SimulatedDevice device(*find_simulated_profile("laptop-cpu"), 9);
  DeviceEnergyModel model("sim:laptop-cpu", "simulated");
  TrainingConfig training;
  training.batch_size = 64;
  training.samples_per_epoch = 6400;
  training.optimizer = "adam";
  CampaignOptions options;
  options.probes = 60;
  options.gp.restarts = 1;
  // Probed for sgd only: an Adam job has no estimate, and the error names the missing model.
  ASSERT_TRUE(run_campaign(model, {WorkloadItem{lenet(), 64}}, noise_free_meter(device), options));
  auto missing = model.estimate(lenet(), training);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("optimizer:adam@output"), std::string::npos) << missing.error().message;

  options.probes = 150;
  DeviceEnergyModel learnt("sim:laptop-cpu", "simulated");
  ASSERT_TRUE(run_campaign(learnt, {WorkloadItem{lenet(), 64, "adam"}}, noise_free_meter(device), options));
  auto estimate = learnt.estimate(lenet(), training);
  ASSERT_TRUE(estimate) << estimate.error().message;
  ASSERT_EQ(estimate->layers.back().type, "optimizer");
  EXPECT_EQ(estimate->layers.back().key, "optimizer:adam@output");
  EXPECT_GT(estimate->layers.back().joules_per_step.mean, 0.0);
  auto layers = analyze_model(lenet(), 64);
  const double truth = device.step_cost(*layers, "cross_entropy", "adam").joules * 100;
  EXPECT_NEAR(estimate->joules.mean / truth, 1.0, 0.15);
  training.optimizer = "sgd";
  auto sgd = learnt.estimate(lenet(), training);
  ASSERT_TRUE(sgd);
  EXPECT_NE(sgd->layers.back().type, "optimizer");
  EXPECT_LT(sgd->joules.mean, estimate->joules.mean);
}

TEST(DeviceEnergyModelTest, a_kind_every_probe_of_which_came_out_below_zero_is_estimated_from_the_pooled_rate) {
  DeviceEnergyModel model("cpu", "rapl");
  for (const std::int64_t features : {128, 256, 512})
    ASSERT_TRUE(model.add_sample(linear_output_sample(features, features * 4e-5)));
  // A two-layer network: its first linear (the input position) is a kind of its own.
  ModelSpec network;
  network.input_shape = {256};
  network.layers = {LayerSpec{"linear", {{"out_features", 64}}, {}, {}},
                    LayerSpec{"linear", {{"out_features", 10}}, {}, {}}};
  LayerSample below_zero = linear_output_sample(256, -1e-4);
  below_zero.key = LayerKey{"linear", LayerPosition::input};
  const auto input_key = below_zero.key;
  for (std::size_t drop = 1; drop <= DeviceEnergyModel::kUnresolvedProbes; ++drop) {
    ASSERT_TRUE(model.fit());
    // Until enough probes agree that it is below the meter's resolution: no number.
    auto layers = analyze_model(network, 32);
    EXPECT_TRUE(std::isinf(model.uncertainty(input_key, layers->front(), 32)));
    EXPECT_FALSE(model.estimate(network, one_step()));
    EXPECT_FALSE(model.add_sample(below_zero));
  }
  ASSERT_TRUE(model.fit());
  EXPECT_EQ(model.unresolved().at("linear@input"), DeviceEnergyModel::kUnresolvedProbes);
  auto estimate = model.estimate(network, one_step());
  ASSERT_TRUE(estimate) << estimate.error().message;
  EXPECT_TRUE(estimate->layers[0].sparse);
  EXPECT_GT(estimate->layers[0].joules_per_step.mean, 0.0);
  ASSERT_FALSE(estimate->warnings.empty());
  EXPECT_NE(estimate->warnings.front().find("linear@input: its 3 probes all came out at or below zero"),
            std::string::npos)
      << estimate->warnings.front();
  auto layers = analyze_model(network, 32);
  EXPECT_TRUE(std::isfinite(model.uncertainty(input_key, layers->front(), 32)));
  // Saved and loaded, it stays unresolved; a kept sample of the kind ends that.
  auto loaded = DeviceEnergyModel::load(model.save());
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->unresolved(), model.unresolved());
  LayerSample resolved = linear_output_sample(256, 2e-3);
  resolved.key = input_key;
  EXPECT_TRUE(model.add_sample(resolved));
  EXPECT_TRUE(model.unresolved().empty());
}
