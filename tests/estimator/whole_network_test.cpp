#include <gtest/gtest.h>

#include <cmath>

#include "example_models.hpp"
#include "noise_free_meter.hpp"

#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/probe_campaign.hpp"
#include "joule/estimator/simulated_device.hpp"
#include "joule/estimator/whole_network.hpp"

using namespace joule::estimator;
using joule::testing::noise_free_meter;
using nlohmann::json;

namespace {

ModelSpec example(const std::string& name) { return *parse_model_spec(joule::testing::example_model(name), "/model"); }

std::string family_of(const std::string& name) { return network_family(*analyze_model(example(name), 32)); }

TrainingConfig one_step(std::int64_t batch) { return TrainingConfig{batch, 1, batch, "sgd", std::nullopt}; }

// LeNet's layers learnt on a noise-free simulated laptop CPU: the sum of its layer lines is
// close to the simulator's truth, so a whole measurement's ratio is what the test sets.
struct LearntLenet {
  SimulatedDevice device{*find_simulated_profile("laptop-cpu"), 9};
  DeviceEnergyModel model{"sim:laptop-cpu", "simulated"};
  LearntLenet() {
    CampaignOptions options;
    options.probes = 60;
    options.gp.restarts = 1;
    EXPECT_TRUE(run_campaign(model,
                             {WorkloadItem{example("lenet5"), 32}, WorkloadItem{example("lenet5"), 64},
                              WorkloadItem{example("lenet5"), 128}},
                             noise_free_meter(device), options));
  }
  // The raw layer sum per step at a batch size, as estimated before any whole measurement.
  Estimate raw(std::int64_t batch) const { return *model.estimate(example("lenet5"), one_step(batch)); }
  WholeNetworkSample measured(std::int64_t batch, double joules_ratio, double seconds_ratio) const {
    const Estimate sum = raw(batch);
    WholeNetworkSample sample;
    sample.model = example("lenet5");
    sample.signature = network_signature(sample.model);
    sample.family = "convolutional";
    sample.batch_size = batch;
    sample.joules_per_step = sum.joules_per_step.mean * joules_ratio;
    sample.seconds_per_step = sum.seconds.mean * seconds_ratio;
    sample.joules_spread = 0.04;
    sample.seconds_spread = 0.04;
    sample.measured_ms = 1'700'000'000'000;
    return sample;
  }
};

}  // namespace

TEST(WholeNetworkTest, a_signature_names_the_architecture_not_the_job) {
  ModelSpec a = example("lenet5");
  ModelSpec b = a;
  b.name = "someone else's lenet";
  EXPECT_EQ(network_signature(a), network_signature(b));
  EXPECT_EQ(network_signature(a).size(), 16u);
  ModelSpec wider = a;
  wider.layers[0].args["out_channels"] = 12;
  EXPECT_NE(network_signature(a), network_signature(wider));
  EXPECT_NE(network_signature(a), network_signature(example("lenet5_wide")));
}

TEST(WholeNetworkTest, families_go_by_the_layers_that_compose_differently) {
  EXPECT_EQ(family_of("transformer_small"), "attention");
  EXPECT_EQ(family_of("lstm_classifier"), "recurrent");
  EXPECT_EQ(family_of("gru_tagger"), "recurrent");
  EXPECT_EQ(family_of("lenet5"), "convolutional");
  EXPECT_EQ(family_of("resnet18_cifar"), "convolutional");
  EXPECT_EQ(family_of("mlp"), "dense");
}

TEST(WholeNetworkTest, a_network_measured_whole_is_estimated_from_its_measurement) {
  LearntLenet learnt;
  const Estimate before = learnt.raw(64);
  EXPECT_FALSE(before.whole);
  ASSERT_TRUE(learnt.model.add_whole_network(learnt.measured(64, 1.4, 1.6)));
  ASSERT_TRUE(learnt.model.fit({}, 3));

  TrainingConfig training = one_step(64);
  training.samples_per_epoch = 6400;  // 100 steps
  auto estimate = learnt.model.estimate(example("lenet5"), training);
  ASSERT_TRUE(estimate) << estimate.error().message;
  ASSERT_TRUE(estimate->whole);
  EXPECT_EQ(estimate->whole->basis, "measured");
  EXPECT_EQ(estimate->whole->family, "convolutional");
  EXPECT_EQ(estimate->whole->measured_ms, 1'700'000'000'000);
  // (The refit moves the layer sum a little: ratios to the sum before it are near, not exact.)
  EXPECT_NEAR(estimate->joules_per_step.mean / before.joules_per_step.mean, 1.4, 1e-3);
  EXPECT_NEAR(estimate->seconds.mean / (before.seconds.mean * 100), 1.6, 1e-3);
  EXPECT_NEAR(estimate->whole->layers_joules_per_step / before.joules_per_step.mean, 1.0, 1e-3);
  // Never tighter than the machine's drift between measurement and job.
  EXPECT_GE(estimate->joules_per_step.std, kMeasuredWholeSigma * estimate->joules_per_step.mean * 0.999);
  EXPECT_LT(estimate->joules_per_step.std, 0.2 * estimate->joules_per_step.mean);
  // The layer lines apportion the measurement.
  double lines = 0.0;
  for (const auto& layer : estimate->layers) lines += layer.joules_per_step.mean;
  EXPECT_NEAR(lines, estimate->joules_per_step.mean, 1e-9 * lines);
  EXPECT_EQ(to_json(*estimate)["whole"]["basis"], "measured");

  // Another batch size is another measurement: one network of a family is no gap yet.
  auto other = learnt.model.estimate(example("lenet5"), one_step(32));
  ASSERT_TRUE(other);
  EXPECT_FALSE(other->whole);
  EXPECT_TRUE(learnt.model.whole_network_gaps().empty());
}

TEST(WholeNetworkTest, a_family_gap_learnt_from_measured_networks_scales_the_ones_not_measured) {
  LearntLenet learnt;
  const Estimate raw128 = learnt.raw(128);
  ASSERT_TRUE(learnt.model.add_whole_network(learnt.measured(32, 1.3, 1.2)));
  ASSERT_TRUE(learnt.model.add_whole_network(learnt.measured(64, 1.5, 1.4)));
  ASSERT_TRUE(learnt.model.fit({}, 3));
  ASSERT_EQ(learnt.model.whole_network_gaps().size(), 1u);
  const auto& gap = learnt.model.whole_network_gaps().at("convolutional");
  EXPECT_EQ(gap.samples, 2u);
  EXPECT_NEAR(gap.log_joules_mean, (std::log(1.3) + std::log(1.5)) / 2.0, 1e-3);

  auto estimate = learnt.model.estimate(example("lenet5"), one_step(128));
  ASSERT_TRUE(estimate) << estimate.error().message;
  ASSERT_TRUE(estimate->whole);
  EXPECT_EQ(estimate->whole->basis, "family-gap");
  EXPECT_EQ(estimate->whole->samples, 2u);
  EXPECT_NEAR(estimate->joules_per_step.mean / raw128.joules_per_step.mean, std::sqrt(1.3 * 1.5), 1e-3);
  // The gap's spread, widened for the few it was learnt from, is at least the sum's own.
  EXPECT_GE(estimate->joules_per_step.std / estimate->joules_per_step.mean,
            raw128.joules_per_step.std / raw128.joules_per_step.mean * 0.999);

  // Another family learns nothing from convolutional networks.
  // (A transformer on this model lacks its layers' models: no estimate at all, as before.)
  EXPECT_FALSE(learnt.model.whole_network_gaps().contains("attention"));

  // A measurement replaced keeps one per network; the snapshot keeps samples and gaps.
  ASSERT_TRUE(learnt.model.add_whole_network(learnt.measured(64, 1.5, 1.4)));
  EXPECT_EQ(learnt.model.whole_networks().size(), 2u);
  auto loaded = DeviceEnergyModel::load(learnt.model.save());
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->whole_networks().size(), 2u);
  ASSERT_EQ(loaded->whole_network_gaps().size(), 1u);
  auto again = loaded->estimate(example("lenet5"), one_step(128));
  ASSERT_TRUE(again);
  EXPECT_NEAR(again->joules_per_step.mean, estimate->joules_per_step.mean, 1e-9 * estimate->joules_per_step.mean);
}

TEST(WholeNetworkTest, a_saved_sample_that_is_not_one_is_refused_naming_the_field) {
  LearntLenet learnt;
  ASSERT_TRUE(learnt.model.add_whole_network(learnt.measured(64, 1.4, 1.6)));
  json saved = learnt.model.save();
  saved["whole_networks"][0]["joules_per_step"] = -1.0;
  auto refused = DeviceEnergyModel::load(saved);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("/whole_networks/0/joules_per_step"), std::string::npos)
      << refused.error().message;
  saved = learnt.model.save();
  saved["whole_networks"][0]["model"]["layers"][0]["type"] = "warp_drive";
  EXPECT_FALSE(DeviceEnergyModel::load(saved));
  // A sample without figures is not kept.
  WholeNetworkSample empty = learnt.measured(32, 1.0, 1.0);
  empty.joules_per_step = 0.0;
  EXPECT_FALSE(learnt.model.add_whole_network(empty));
}

TEST(WholeNetworkTest, the_planner_measures_what_cuts_the_workloads_error_most_per_root_cost) {
  auto candidate = [](std::string signature, double share, double sigma, double flops, double seconds) {
    WholeNetworkCandidate c;
    c.signature = std::move(signature);
    c.batch_size = 32;
    c.share = share;
    c.relative_std = sigma;
    c.flops_per_step = flops;
    c.seconds_per_step = seconds;
    return c;
  };
  const std::vector<WholeNetworkCandidate> candidates = {
      candidate("small", 0.2, 0.3, 1e8, 0.01),  // 0.2 × 0.2 / √1.5
      candidate("big", 0.3, 0.3, 2e10, 0.5),    // 0.3 × 0.2 / √10.5: more in all, less per √cost
      candidate("sure", 0.2, 0.08, 1e8, 0.01),  // already surer than a measurement
      candidate("slow", 0.9, 0.5, 1e9, 30.0)};  // 150 steps of 30 s: too long
  auto best = plan_whole_network(candidates, {}, 150, 600.0);
  ASSERT_TRUE(best);
  EXPECT_EQ(best->index, 0u);
  EXPECT_NEAR(best->error_reduction, 0.2 * (0.3 - kMeasuredWholeSigma), 1e-12);
  EXPECT_NEAR(best->cost, 1.5, 1e-12);
  auto next = plan_whole_network(candidates, {whole_network_key("small", 32, "sgd")}, 150, 600.0);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->index, 1u);
  EXPECT_FALSE(plan_whole_network(candidates, {whole_network_key("small", 32, "sgd"), whole_network_key("big", 32, "")},
                                  150, 600.0));
}

TEST(WholeNetworkTest, a_model_keeps_the_latest_measurements_up_to_its_bound) {
  DeviceEnergyModel model("cpu", "modelled");
  ModelSpec spec = example("mlp");
  for (std::size_t i = 0; i < kMaxWholeNetworks + 5; ++i) {
    WholeNetworkSample sample;
    sample.model = spec;
    sample.signature = network_signature(spec);
    sample.family = "dense";
    sample.batch_size = static_cast<std::int64_t>(i + 1);  // another measurement each
    sample.joules_per_step = 1.0;
    sample.seconds_per_step = 0.01;
    sample.measured_ms = static_cast<std::int64_t>(1000 + i);
    ASSERT_TRUE(model.add_whole_network(sample));
  }
  ASSERT_EQ(model.whole_networks().size(), kMaxWholeNetworks);
  EXPECT_EQ(model.whole_network(network_signature(spec), 1, "sgd"), nullptr);  // the oldest went
  EXPECT_NE(model.whole_network(network_signature(spec), kMaxWholeNetworks + 5, "sgd"), nullptr);
}
