#include "joule/estimator/pruning_advice.hpp"

#include <gtest/gtest.h>

#include "joule/estimator/layer_analysis.hpp"
#include "joule/estimator/probe_campaign.hpp"
#include "joule/estimator/simulated_device.hpp"

using namespace joule::estimator;
using nlohmann::json;

namespace {

// A small CNN whose second block is residual (both branches meet in an add, so they must keep
// one width) and ends in a depthwise convolution (which follows its input's channels).
json residual_cnn() {
  return {{"name", "residual-cnn"},
          {"input", {{"shape", {3, 16, 16}}}},
          {"layers",
           {{{"type", "conv2d"}, {"out_channels", 32}, {"kernel_size", 3}, {"padding", 1}, {"name", "stem"}},
            {{"type", "relu"}},
            {{"type", "conv2d"}, {"out_channels", 64}, {"kernel_size", 3}, {"padding", 1}, {"name", "main"}},
            {{"type", "conv2d"}, {"out_channels", 64}, {"kernel_size", 1}, {"name", "shortcut"}, {"inputs", {"stem"}}},
            {{"type", "add"}, {"inputs", {"main", "shortcut"}}},
            {{"type", "relu"}},
            {{"type", "conv2d"},
             {"out_channels", 64},
             {"kernel_size", 3},
             {"padding", 1},
             {"groups", 64},
             {"name", "depthwise"}},
            {{"type", "maxpool2d"}, {"kernel_size", 4}},
            {{"type", "flatten"}},
            {{"type", "linear"}, {"out_features", 128}},
            {{"type", "relu"}},
            {{"type", "linear"}, {"out_features", 10}, {"name", "classes"}}}}};
}

ModelSpec parse(const json& spec) {
  auto parsed = parse_model_spec(spec, "/model");
  EXPECT_TRUE(parsed) << parsed.error().message;
  return *parsed;
}

TrainingConfig training() {
  TrainingConfig config;
  config.batch_size = 32;
  config.samples_per_epoch = 3200;
  return config;
}

// A model learnt by probing the simulated laptop for this network (noise-free), and the device.
struct Learnt {
  SimulatedDevice device{*find_simulated_profile("laptop-cpu"), 4};
  DeviceEnergyModel model{"sim:laptop-cpu", "simulated"};
  explicit Learnt(const ModelSpec& network) {
    CampaignOptions options;
    options.probes = 100;
    options.gp.restarts = 1;
    auto report = run_campaign(model, {WorkloadItem{network, 32}}, simulated_network_meter(device, 1), options);
    EXPECT_TRUE(report) << report.error().message;
  }
  // What the simulator says one step of `network` costs: the truth the advice is judged by.
  double true_joules(const ModelSpec& network) {
    auto layers = analyze_model(network, 32);
    EXPECT_TRUE(layers) << layers.error().message;
    return device.step_cost(*layers, network.loss).joules;
  }
};

const LayerAdvice& layer_named(const PruningAdvice& advice, const std::string& name) {
  for (const auto& layer : advice.layers)
    if (layer.name == name) return layer;
  throw std::runtime_error("no layer " + name);
}

}  // namespace

TEST(PruningAdviceTest, saves_the_target_keeping_ties_and_classes_and_the_simulator_agrees) {
  const ModelSpec network = parse(residual_cnn());
  Learnt learnt(network);
  auto advice = advise_pruning(network, training(), learnt.model, 0.4);
  ASSERT_TRUE(advice) << advice.error().message;
  EXPECT_TRUE(advice->reached) << advice->detail;
  EXPECT_GE(advice->saving, 0.4);
  EXPECT_LT(advice->advised.joules.mean, 0.6 * advice->original.joules.mean + 1e-9);
  EXPECT_LT(advice->advised_parameters, advice->original_parameters);
  // The classes stay; the two branches of the add keep one width; the depthwise follows them.
  EXPECT_EQ(layer_named(*advice, "classes").advised_width, 10);
  EXPECT_FALSE(layer_named(*advice, "classes").fixed_because.empty());
  EXPECT_EQ(layer_named(*advice, "main").advised_width, layer_named(*advice, "shortcut").advised_width);
  EXPECT_EQ(layer_named(*advice, "depthwise").advised_width, layer_named(*advice, "main").advised_width);
  EXPECT_EQ(advice->model.layers[6].args["groups"], layer_named(*advice, "main").advised_width);
  // The energy shares rank the layers and add up to the network (less loss and optimizer).
  double shares = 0.0;
  for (const auto& layer : advice->layers) shares += layer.energy_share;
  EXPECT_NEAR(shares, 1.0, 1e-6);
  // The advised spec is a valid network, and the simulated device saves about what was predicted.
  ASSERT_TRUE(analyze_model(advice->model, 32));
  const double true_saving = 1.0 - learnt.true_joules(advice->model) / learnt.true_joules(network);
  EXPECT_NEAR(true_saving, advice->saving, 0.1) << "predicted " << advice->saving << ", simulated " << true_saving;
}

TEST(PruningAdviceTest, a_target_no_pruning_reaches_says_how_far_it_got) {
  const ModelSpec network = parse(residual_cnn());
  Learnt learnt(network);
  auto advice = advise_pruning(network, training(), learnt.model, 0.99);
  ASSERT_TRUE(advice) << advice.error().message;
  EXPECT_FALSE(advice->reached);
  EXPECT_GT(advice->saving, 0.3);
  EXPECT_NE(advice->detail.find("reaches a 99 % saving: the most is"), std::string::npos) << advice->detail;
  // Every free width went down to the smallest multiplier it could.
  EXPECT_DOUBLE_EQ(layer_named(*advice, "main").multiplier, 0.5);
  // Further down when asked to.
  auto deeper = advise_pruning(network, training(), learnt.model, 0.99, PruningOptions::down_to(0.25));
  ASSERT_TRUE(deeper) << deeper.error().message;
  EXPECT_DOUBLE_EQ(layer_named(*deeper, "main").multiplier, 0.25);
  EXPECT_GT(deeper->saving, advice->saving);
  EXPECT_NE(deeper->detail.find("down to x0.25"), std::string::npos) << deeper->detail;
}

TEST(PruningAdviceTest, a_target_outside_zero_and_one_is_refused) {
  const ModelSpec network = parse(residual_cnn());
  DeviceEnergyModel empty("cpu", "modelled");
  for (const double target : {0.0, 1.0, -0.5, std::nan("")}) {
    auto advice = advise_pruning(network, training(), empty, target);
    ASSERT_FALSE(advice);
    EXPECT_EQ(advice.error().where, "target");
  }
}
