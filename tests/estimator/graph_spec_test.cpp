// Model specs as graphs: named inputs, joins (add, mul, concat), the layer kinds residual and
// mobile networks need, and what the estimator and the probes make of them.

#include <map>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "example_models.hpp"
#include "noise_free_meter.hpp"

#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/layer_analysis.hpp"
#include "joule/estimator/model_spec.hpp"
#include "joule/estimator/probe_campaign.hpp"
#include "joule/estimator/simulated_device.hpp"
#include "joule/estimator/thor_probes.hpp"

using namespace joule::estimator;
using joule::testing::noise_free_meter;
using nlohmann::json;
using Shape = std::vector<std::int64_t>;

namespace {

json model(Shape input, json layers) { return {{"input", {{"shape", input}}}, {"layers", std::move(layers)}}; }

json conv(int out, int kernel, json extra = json::object()) {
  json layer = {{"type", "conv2d"}, {"out_channels", out}, {"kernel_size", kernel}};
  layer.update(extra);
  return layer;
}

// torchvision's BasicBlock with a downsampling shortcut, then a classifier:
// [16, 8, 8] → conv3x3/2 → bn → relu → conv3x3 → bn ─┐
//          └→ conv1x1/2 → bn ─────────────────────────┴→ add → relu → pool → flatten → linear
json residual_block() {
  return model({16, 8, 8}, {conv(32, 3, {{"stride", 2}, {"padding", 1}, {"bias", false}}),
                            {{"type", "batchnorm2d"}},
                            {{"type", "relu"}},
                            conv(32, 3, {{"padding", 1}, {"bias", false}}),
                            {{"type", "batchnorm2d"}, {"name", "main"}},
                            conv(32, 1, {{"stride", 2}, {"bias", false}, {"inputs", {"input"}}}),
                            {{"type", "batchnorm2d"}, {"name", "shortcut"}},
                            {{"type", "add"}, {"inputs", {"main", "shortcut"}}},
                            {{"type", "relu"}},
                            {{"type", "adaptive_avgpool2d"}},
                            {{"type", "flatten"}},
                            {{"type", "linear"}, {"out_features", 10}}});
}

joule::Result<ModelSpec> parse(const json& spec) { return parse_model_spec(spec, "/model"); }

joule::Result<std::vector<AnalyzedLayer>> analyze(const json& spec, std::int64_t batch = 1) {
  auto parsed = parse(spec);
  if (!parsed) return parsed.error();
  return analyze_model(*parsed, batch, "/model");
}

std::int64_t parameters(const std::vector<AnalyzedLayer>& layers) { return total_cost(layers).parameters; }

}  // namespace

TEST(GraphSpecTest, a_residual_block_has_torchs_shapes_parameters_and_positions) {
  auto layers = analyze(residual_block(), 4);
  ASSERT_TRUE(layers) << layers.error().message;
  ASSERT_EQ(layers->size(), 12u);
  EXPECT_EQ((*layers)[4].output_shape, (Shape{32, 4, 4}));
  EXPECT_EQ((*layers)[5].input_shape, (Shape{16, 8, 8}));  // the shortcut reads the model's input
  EXPECT_EQ((*layers)[5].inputs, (std::vector<std::int64_t>{-1}));
  EXPECT_EQ((*layers)[7].inputs, (std::vector<std::int64_t>{4, 6}));
  EXPECT_EQ((*layers)[7].input_shapes, (std::vector<Shape>{{32, 4, 4}, {32, 4, 4}}));
  EXPECT_EQ((*layers)[7].output_shape, (Shape{32, 4, 4}));
  EXPECT_EQ((*layers)[9].output_shape, (Shape{32, 1, 1}));
  // torch: conv 16·32·9 + bn 64 + conv 32·32·9 + bn 64 + conv 16·32 + bn 64 + linear 32·10 + 10.
  EXPECT_EQ(parameters(*layers), 4608 + 64 + 9216 + 64 + 512 + 64 + 330);
  // Positions come from the graph: the shortcut conv reads the input (nothing learns before it),
  // its batchnorm and the add have learning ancestors.
  const auto keys = layer_keys(*layers);
  EXPECT_EQ(keys[0].name(), "conv2d@input");
  EXPECT_EQ(keys[5].name(), "conv2d@input");
  EXPECT_EQ(keys[6].name(), "batchnorm2d@hidden");
  EXPECT_EQ(keys[7].name(), "add@hidden");
  EXPECT_EQ(keys.back().name(), "linear@output");
  // The add: one FLOP per element forward, and its inputs' gradients backward.
  EXPECT_DOUBLE_EQ((*layers)[7].cost.forward_flops, 4.0 * 32 * 4 * 4);
  EXPECT_DOUBLE_EQ((*layers)[7].cost.backward_flops, 4.0 * 32 * 4 * 4);
  EXPECT_EQ((*layers)[7].features.at("inputs"), 2.0);
}

TEST(GraphSpecTest, list_specs_are_unchanged_and_graphs_round_trip) {
  const json lenet = joule::testing::example_model("lenet5");
  auto plain = parse(lenet);
  ASSERT_TRUE(plain);
  const json written = to_json(*plain);
  for (const auto& layer : written["layers"]) {
    EXPECT_FALSE(layer.contains("name"));
    EXPECT_FALSE(layer.contains("inputs"));
  }
  auto graph = parse(residual_block());
  ASSERT_TRUE(graph);
  auto again = parse(to_json(*graph));
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(to_json(*again), to_json(*graph));
  EXPECT_EQ(again->layers[7].inputs, (std::vector<std::string>{"main", "shortcut"}));
}

TEST(GraphSpecTest, wiring_mistakes_name_the_layer_and_the_pointer) {
  struct Case {
    json layers;
    std::string where;
    std::string says;
  };
  const json relu = {{"type", "relu"}};
  const json head = {{"type", "linear"}, {"out_features", 2}};
  const std::vector<Case> cases = {
      {{head, {{"type", "add"}}}, "/model/layers/1/inputs", "joins two or more layers"},
      {{head, {{"type", "add"}, {"inputs", {"input"}}}}, "/model/layers/1/inputs", "got 1 input"},
      {{{{"type", "linear"}, {"out_features", 2}, {"name", "a"}}, {{"type", "relu"}, {"inputs", {"a", "input"}}}},
       "/model/layers/1/inputs",
       "takes one input, got 2"},
      {{{{"type", "relu"}, {"inputs", {"later"}}}, {{"type", "linear"}, {"out_features", 2}, {"name", "later"}}},
       "/model/layers/0/inputs/0",
       "is not an earlier layer"},
      {{head, {{"type", "relu"}, {"inputs", {"nowhere"}}}}, "/model/layers/1/inputs/0", "no earlier layer is named"},
      {{{{"type", "relu"}, {"name", "x"}}, {{"type", "linear"}, {"out_features", 2}, {"name", "x"}}},
       "/model/layers/1/name",
       "already used by layer 0"},
      {{{{"type", "relu"}, {"name", "input"}}, head}, "/model/layers/0/name", "\"name\" must be"},
      {{{{"type", "relu"}, {"name", "a b"}}, head}, "/model/layers/0/name", "\"name\" must be"},
      {{{{"type", "relu"}, {"inputs", "input"}}, head}, "/model/layers/0/inputs", "non-empty array"},
      // The relu's output feeds nothing: the head reads the input instead.
      {{relu, {{"type", "linear"}, {"out_features", 2}, {"inputs", {"input"}}}},
       "/model/layers/0",
       "layer 0 relu: its output is never used"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.layers.dump());
    auto spec = parse(model({6}, c.layers));
    ASSERT_FALSE(spec);
    EXPECT_EQ(spec.error().where, c.where);
    EXPECT_NE(spec.error().message.find(c.says), std::string::npos) << spec.error().message;
  }
}

TEST(GraphSpecTest, branches_whose_shapes_do_not_join_name_both_layers_and_shapes) {
  auto add = analyze(model({3, 8, 8}, {conv(8, 3, {{"padding", 1}, {"name", "a"}}),
                                       conv(16, 3, {{"padding", 1}, {"name", "b"}, {"inputs", {"input"}}}),
                                       {{"type", "add"}, {"inputs", {"a", "b"}}}}));
  ASSERT_FALSE(add);
  EXPECT_EQ(add.error().where, "/model/layers/2");
  EXPECT_NE(add.error().message.find("layer 2 add: layer 0 conv2d \"a\" [8, 8, 8] and layer 1 conv2d \"b\" [16, 8, 8] "
                                     "do not broadcast"),
            std::string::npos)
      << add.error().message;

  auto cat = analyze(model({3, 8, 8}, {conv(8, 3, {{"padding", 1}, {"name", "a"}}),
                                       conv(8, 3, {{"name", "b"}, {"inputs", {"input"}}}),
                                       {{"type", "concat"}, {"inputs", {"a", "b"}}}}));
  ASSERT_FALSE(cat);
  EXPECT_NE(cat.error().message.find("[8, 8, 8] and layer 1 conv2d \"b\" [8, 6, 6] differ outside dim 0"),
            std::string::npos)
      << cat.error().message;

  auto dim = analyze(
      model({3, 8, 8}, {conv(8, 3, {{"name", "a"}}), {{"type", "concat"}, {"inputs", {"a", "a"}}, {"dim", 3}}}));
  ASSERT_FALSE(dim);
  EXPECT_EQ(dim.error().where, "/model/layers/1/dim");
}

TEST(GraphSpecTest, joins_broadcast_and_concatenate_like_torch) {
  // Squeeze-and-excitation: [C, H, W] × [C, 1, 1].
  auto se = analyze(model({8, 6, 6}, {conv(8, 3, {{"padding", 1}, {"name", "x"}}),
                                      {{"type", "adaptive_avgpool2d"}},
                                      conv(8, 1),
                                      {{"type", "sigmoid"}, {"name", "w"}},
                                      {{"type", "mul"}, {"inputs", {"x", "w"}}}}));
  ASSERT_TRUE(se) << se.error().message;
  EXPECT_EQ(se->back().output_shape, (Shape{8, 6, 6}));
  // An Inception-like concat along channels, and along the last dim with a negative index.
  auto cat = analyze(model({3, 8, 8}, {conv(4, 1, {{"name", "a"}}),
                                       conv(6, 3, {{"padding", 1}, {"name", "b"}, {"inputs", {"input"}}}),
                                       {{"type", "concat"}, {"inputs", {"a", "b", "input"}}}}));
  ASSERT_TRUE(cat) << cat.error().message;
  EXPECT_EQ(cat->back().output_shape, (Shape{13, 8, 8}));
  auto last = analyze(model({4, 5}, {{{"type", "linear"}, {"out_features", 3}, {"name", "a"}},
                                     {{"type", "concat"}, {"inputs", {"a", "input"}}, {"dim", -1}}}));
  ASSERT_TRUE(last) << last.error().message;
  EXPECT_EQ(last->back().output_shape, (Shape{4, 8}));
}

TEST(GraphSpecTest, grouped_and_depthwise_convolutions_are_their_own_model_kind) {
  auto layers =
      analyze(model({32, 16, 16}, {conv(32, 3, {{"padding", 1}, {"groups", 32}}),
                                   conv(64, 3, {{"padding", 2}, {"dilation", 2}, {"groups", 2}}), conv(8, 1)}));
  ASSERT_TRUE(layers) << layers.error().message;
  // Depthwise: 1·9 weights per output channel plus the bias; 2 groups: 16·9 per output channel.
  EXPECT_EQ((*layers)[0].cost.parameters, 32 * 9 + 32);
  EXPECT_EQ((*layers)[1].cost.parameters, 64 * 16 * 9 + 64);
  EXPECT_EQ((*layers)[1].output_shape, (Shape{64, 16, 16}));  // dilation 2 and padding 2 keep the size
  EXPECT_DOUBLE_EQ((*layers)[0].cost.forward_flops, 2.0 * 16 * 16 * 9 * 32);
  EXPECT_EQ(model_kind((*layers)[0]), "conv2d_grouped");
  EXPECT_EQ(model_kind((*layers)[2]), "conv2d");
  EXPECT_EQ(layer_keys(*layers)[1].name(), "conv2d_grouped@hidden");
  EXPECT_FALSE((*layers)[2].features.contains("groups"));  // dense convolutions keep their features

  auto misfit = analyze(model({6, 8, 8}, {conv(8, 3, {{"groups", 4}})}));
  ASSERT_FALSE(misfit);
  EXPECT_NE(misfit.error().message.find("groups 4 must divide both in_channels 6 and out_channels 8"),
            std::string::npos);
}

// leaky_relu, elu, softplus and mish: shape-preserving, parameter-free, each a model kind of its
// own, counted per element (layer_analysis.hpp's table); behind a linear, backward is counted.
TEST(GraphSpecTest, the_further_activations_are_pointwise_kinds_of_their_own) {
  auto layers = analyze(model({4, 6}, {{{"type", "linear"}, {"out_features", 5}},
                                       {{"type", "leaky_relu"}, {"negative_slope", 0.2}},
                                       {{"type", "elu"}},
                                       {{"type", "softplus"}, {"beta", 2}},
                                       {{"type", "mish"}}}),
                        2);
  ASSERT_TRUE(layers) << layers.error().message;
  const std::vector<std::pair<std::string, std::pair<double, double>>> expected = {
      {"leaky_relu", {2, 2}}, {"elu", {4, 3}}, {"softplus", {5, 4}}, {"mish", {9, 11}}};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const auto& layer = (*layers)[i + 1];
    SCOPED_TRACE(layer.type);
    EXPECT_EQ(model_kind(layer), expected[i].first);
    EXPECT_EQ(layer.output_shape, (Shape{4, 5}));
    EXPECT_EQ(layer.cost.parameters, 0);
    EXPECT_EQ(layer.features.at("elements"), 20.0);
    EXPECT_DOUBLE_EQ(layer.cost.forward_flops, 2 * 20 * expected[i].second.first);
    EXPECT_DOUBLE_EQ(layer.cost.backward_flops, 2 * 20 * expected[i].second.second);
  }
}

TEST(GraphSpecTest, new_layer_kinds_have_torchs_shapes_and_parameters) {
  auto sequence = analyze(model({3, 20}, {{{"type", "conv1d"}, {"out_channels", 8}, {"kernel_size", 5}, {"stride", 2}},
                                          {{"type", "batchnorm1d"}},
                                          {{"type", "silu"}},
                                          {{"type", "hardswish"}},
                                          {{"type", "relu6"}},
                                          {{"type", "identity"}},
                                          {{"type", "softmax"}, {"dim", 0}}}));
  ASSERT_TRUE(sequence) << sequence.error().message;
  EXPECT_EQ(sequence->front().output_shape, (Shape{8, 8}));  // (20 − 5) / 2 + 1
  EXPECT_EQ(sequence->front().cost.parameters, 3 * 8 * 5 + 8);
  EXPECT_EQ((*sequence)[1].cost.parameters, 16);
  EXPECT_EQ(sequence->back().features.at("dim_size"), 8.0);
  EXPECT_TRUE(is_free_layer((*sequence)[5]));  // identity is a view
  auto pools = analyze(model({4, 7, 7}, {{{"type", "maxpool2d"}, {"kernel_size", 3}, {"stride", 2}, {"padding", 1}},
                                         {{"type", "adaptive_avgpool2d"}, {"output_size", 2}}}));
  ASSERT_TRUE(pools) << pools.error().message;
  EXPECT_EQ(pools->front().output_shape, (Shape{4, 4, 4}));
  EXPECT_EQ(pools->back().output_shape, (Shape{4, 2, 2}));
  // A mean over a sequence's tokens: that dim goes, read once forward and once backward.
  auto pooled = analyze(model({12, 24}, {{{"type", "linear"}, {"out_features", 16}},
                                         {{"type", "mean"}, {"dim", 0}},
                                         {{"type", "linear"}, {"out_features", 3}}}));
  ASSERT_TRUE(pooled) << pooled.error().message;
  EXPECT_EQ((*pooled)[1].output_shape, (Shape{16}));
  EXPECT_DOUBLE_EQ((*pooled)[1].cost.forward_flops, 12.0 * 16);
  EXPECT_EQ((*pooled)[1].features.at("dim_size"), 12.0);
  auto flat = analyze(model({6}, {{{"type", "mean"}, {"dim", 0}}, {{"type", "linear"}, {"out_features", 3}}}));
  ASSERT_FALSE(flat);
  EXPECT_NE(flat.error().message.find("layer 0 mean: takes an input of at least 2 dims per sample, got [6]"),
            std::string::npos)
      << flat.error().message;
  auto outside = analyze(model({4, 6}, {{{"type", "mean"}, {"dim", 2}}, {{"type", "linear"}, {"out_features", 3}}}));
  ASSERT_FALSE(outside);
  EXPECT_NE(outside.error().message.find("dim 2 is outside the input [4, 6]"), std::string::npos)
      << outside.error().message;
  // And it is probed like any kind: where it sits in a network, by THOR's four networks.
  ProbeTarget target;
  target.layer = LayerSpec{"mean", json{{"dim", 0}}, "pool", {}};
  target.input_shape = {12, 16};
  target.batch_size = 8;
  target.position = LayerPosition::hidden;
  auto plan = plan_probe(target);
  ASSERT_TRUE(plan) << plan.error().message;
  EXPECT_EQ(plan->networks.size(), 4u);
  EXPECT_EQ(plan->analyzed.type, "mean");
  EXPECT_EQ(plan->analyzed.output_shape, (Shape{16}));
}

TEST(GraphSpecTest, a_join_probe_reads_one_tensor_twice_and_decomposes) {
  ProbeTarget target;
  target.layer = LayerSpec{"add", json::object(), "block1.add", {"main", "shortcut"}};
  target.input_shape = {16, 8, 8};
  target.batch_size = 8;
  target.position = LayerPosition::hidden;
  auto plan = plan_probe(target);
  ASSERT_TRUE(plan) << plan.error().message;
  ASSERT_EQ(plan->networks.size(), 4u);
  const auto& with_target = plan->networks.front();
  EXPECT_EQ(with_target.layers[1].inputs, (std::vector<std::string>{"reference", "reference"}));
  EXPECT_TRUE(with_target.layers[1].name.empty());
  EXPECT_TRUE(plan->analyzed.input_gradient);
  EXPECT_EQ(plan->analyzed.output_shape, (Shape{16, 8, 8}));

  SimulatedDevice device(*find_simulated_profile("laptop-cpu"), 1);
  std::vector<NetworkMeasurement> measured;
  for (const auto& network : plan->networks) {
    auto measurement = noise_free_meter(device)(network, 8, "sgd");
    ASSERT_TRUE(measurement) << measurement.error().message;
    measured.push_back(*measurement);
  }
  auto sample = decompose(*plan, measured);
  ASSERT_TRUE(sample);
  EXPECT_EQ(sample->key.name(), "add@hidden");
  EXPECT_GT(sample->joules_per_step, 0.0);
}

namespace {

// What 120 probes of one network on the noise-free simulated laptop CPU teach: the samples per
// layer key, and the network's estimate over the simulator's own cost of its step.
struct ProbedOnTheSimulator {
  std::map<std::string, std::size_t> samples;
  double estimate_over_truth = 0.0;
  std::int64_t steps = 0;
};

ProbedOnTheSimulator probe_on_the_simulator(const ModelSpec& network, std::int64_t batch) {
  SimulatedDevice device(*find_simulated_profile("laptop-cpu"), 4);
  DeviceEnergyModel model("sim:laptop-cpu", "simulated");
  CampaignOptions options;
  options.probes = 120;
  options.gp.restarts = 1;
  auto report = run_campaign(model, {WorkloadItem{network, batch}}, noise_free_meter(device), options);
  if (!report) throw std::runtime_error(report.error().message);
  EXPECT_EQ(report->failed_measurements, 0u);
  TrainingConfig training;
  training.batch_size = batch;
  training.samples_per_epoch = 100 * batch;
  auto estimate = model.estimate(network, training);
  if (!estimate) throw std::runtime_error(estimate.error().message);
  auto layers = analyze_model(network, batch);
  if (!layers) throw std::runtime_error(layers.error().message);
  return {model.sample_counts(), estimate->joules_per_step.mean / device.step_cost(*layers, "cross_entropy").joules,
          estimate->steps};
}

}  // namespace

TEST(GraphSpecTest, probes_learn_a_residual_network_well_enough_to_estimate_it) {
  const auto probed = probe_on_the_simulator(*parse(residual_block()), 32);
  // THOR's sum over layers misses what the graph adds (gradients summed where the input fans
  // out); on the noise-free simulator the whole network is still within 25 %.
  EXPECT_NEAR(probed.estimate_over_truth, 1.0, 0.25);
  EXPECT_EQ(probed.steps, 100);
}

// A bidirectional GRU and the further activations are probed as kinds of their own (THOR's
// networks built around them) and the network is estimated from what the probes taught.
TEST(GraphSpecTest, probes_learn_a_bidirectional_recurrence_and_the_further_activations) {
  const auto probed = probe_on_the_simulator(
      *parse(model({12, 8}, {{{"type", "linear"}, {"out_features", 16}},
                             {{"type", "mish"}},
                             {{"type", "gru"}, {"hidden_size", 16}, {"bidirectional", true}, {"output", "sequence"}},
                             {{"type", "leaky_relu"}, {"negative_slope", 0.1}},
                             {{"type", "flatten"}},
                             {{"type", "linear"}, {"out_features", 4}}})),
      16);
  for (const char* key : {"mish@hidden", "gru_bidirectional@hidden", "leaky_relu@hidden"})
    EXPECT_GE(probed.samples.contains(key) ? probed.samples.at(key) : 0, 1u) << key;
  EXPECT_NEAR(probed.estimate_over_truth, 1.0, 0.25);
}

TEST(GraphSpecTest, bundled_resnet18_and_mobilenetv2_count_what_torchvision_counts) {
  // torchvision.models.resnet18(num_classes=10) and mobilenet_v2(num_classes=10):
  // sum(p.numel() for p in model.parameters()), as torchvision documents them for 1,000 classes
  // less the classifier difference (512·990 + 990 and 1280·990 + 990).
  const std::map<std::string, std::int64_t> expected = {{"resnet18_cifar", 11'689'512 - 512 * 990 - 990},
                                                        {"mobilenetv2_cifar", 3'504'872 - 1280 * 990 - 990}};
  for (const auto& [name, count] : expected) {
    SCOPED_TRACE(name);
    auto layers = analyze(joule::testing::example_model(name), 8);
    ASSERT_TRUE(layers) << layers.error().message;
    EXPECT_EQ(parameters(*layers), count);
    EXPECT_EQ(layers->back().output_shape, (Shape{10}));
  }
  // MobileNetV2's depthwise convolutions are grouped-convolution models; ResNet's joins are adds.
  auto mobile = analyze(joule::testing::example_model("mobilenetv2_cifar"), 8);
  ASSERT_TRUE(mobile);
  const auto keys = layer_keys(*mobile);
  EXPECT_TRUE(std::any_of(keys.begin(), keys.end(), [](const LayerKey& k) { return k.kind == "conv2d_grouped"; }));
  EXPECT_TRUE(std::any_of(keys.begin(), keys.end(), [](const LayerKey& k) { return k.kind == "add"; }));
}
