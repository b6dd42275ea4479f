#include "network_builder.hpp"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "environment.hpp"
#include "example_models.hpp"
#include "joule/estimator/runtime_cost.hpp"
#include "runtime_probe.hpp"
#include "temp_dir.hpp"
#include "trainer.hpp"

namespace joule::worker {
namespace {

using nlohmann::json;

estimator::ModelSpec spec_of(const json& model) {
  auto spec = estimator::parse_model_spec(model, "/model");
  if (!spec) throw std::runtime_error(spec.error().where + ": " + spec.error().message);
  return std::move(spec).value();
}

json model(json shape, json layers, std::string loss = "cross_entropy", std::string dtype = "float") {
  json out = {{"input", {{"shape", std::move(shape)}}}, {"layers", std::move(layers)}, {"loss", std::move(loss)}};
  if (dtype != "float") out["input"]["dtype"] = dtype;
  return out;
}

// A small network around each layer type: the type under test, with whatever it needs to have
// parameters before or after it, ending in classes.
std::map<std::string, json> one_network_per_layer_type() {
  const json linear3 = {{"type", "linear"}, {"out_features", 3}};
  const json flatten = {{"type", "flatten"}};
  const json conv = {{"type", "conv2d"}, {"out_channels", 4}, {"kernel_size", 3}, {"padding", 1}};
  const auto around_linear = [&](json layer) {
    return model({6}, {{{"type", "linear"}, {"out_features", 5}}, std::move(layer), linear3});
  };
  const auto after_conv = [&](json layer) { return model({2, 8, 8}, {conv, std::move(layer), flatten, linear3}); };
  std::map<std::string, json> networks = {
      {"conv2d",
       model({2, 8, 8}, {{{"type", "conv2d"}, {"out_channels", 4}, {"kernel_size", 3}, {"stride", 2}, {"bias", false}},
                         flatten,
                         linear3})},
      {"linear", model({6}, {{{"type", "linear"}, {"out_features", 3}, {"bias", false}}})},
      {"relu", around_linear({{"type", "relu"}})},
      {"gelu", around_linear({{"type", "gelu"}})},
      {"tanh", around_linear({{"type", "tanh"}})},
      {"sigmoid", around_linear({{"type", "sigmoid"}})},
      {"dropout", around_linear({{"type", "dropout"}, {"p", 0.25}})},
      {"maxpool2d", after_conv({{"type", "maxpool2d"}, {"kernel_size", 2}})},
      {"avgpool2d", after_conv({{"type", "avgpool2d"}, {"kernel_size", 3}, {"stride", 2}})},
      {"batchnorm2d", after_conv({{"type", "batchnorm2d"}})},
      {"layernorm",
       model({4, 6}, {{{"type", "linear"}, {"out_features", 5}}, {{"type", "layernorm"}}, flatten, linear3})},
      {"flatten", model({2, 3, 3}, {flatten, linear3})},
      {"embedding",
       model({7}, {{{"type", "embedding"}, {"num_embeddings", 20}, {"embedding_dim", 8}}, flatten, linear3},
             "cross_entropy", "token")},
      {"lstm", model({5, 6}, {{{"type", "lstm"}, {"hidden_size", 8}, {"num_layers", 2}}, linear3})},
      {"gru", model({5, 6}, {{{"type", "gru"}, {"hidden_size", 8}, {"output", "sequence"}}, linear3})},
      // Model kinds of their own (model_kind): stacked, a layer reads both directions of the one below.
      {"lstm_bidirectional",
       model({5, 6}, {{{"type", "lstm"}, {"hidden_size", 8}, {"num_layers", 2}, {"bidirectional", true}}, linear3})},
      {"gru_bidirectional",
       model(
           {5, 6},
           {{{"type", "gru"}, {"hidden_size", 8}, {"output", "sequence"}, {"bidirectional", true}}, flatten, linear3})},
      {"multihead_attention", model({5, 8}, {{{"type", "multihead_attention"}, {"num_heads", 2}}, flatten, linear3})},
      {"transformer_encoder_layer",
       model({5, 8},
             {{{"type", "transformer_encoder_layer"}, {"nhead", 2}, {"dim_feedforward", 16}}, flatten, linear3})},
      // torch's norm_first layer (built from its parts here) with gelu, behind a linear.
      {"transformer_encoder_layer_norm_first", model({5, 8}, {{{"type", "linear"}, {"out_features", 8}},
                                                              {{"type", "transformer_encoder_layer"},
                                                               {"nhead", 2},
                                                               {"dim_feedforward", 16},
                                                               {"norm_first", true},
                                                               {"activation", "gelu"}},
                                                              flatten,
                                                              linear3})},
      {"conv1d",
       model({3, 10}, {{{"type", "conv1d"}, {"out_channels", 4}, {"kernel_size", 3}, {"dilation", 2}, {"padding", 1}},
                       {{"type", "conv1d"}, {"out_channels", 4}, {"kernel_size", 3}, {"groups", 4}, {"bias", false}},
                       flatten,
                       linear3})},
      {"batchnorm1d", around_linear({{"type", "batchnorm1d"}})},
      {"adaptive_avgpool2d", after_conv({{"type", "adaptive_avgpool2d"}, {"output_size", 2}})},
      {"silu", around_linear({{"type", "silu"}})},
      {"hardswish", around_linear({{"type", "hardswish"}})},
      {"relu6", around_linear({{"type", "relu6"}})},
      {"leaky_relu", around_linear({{"type", "leaky_relu"}, {"negative_slope", 0.1}})},
      {"elu", around_linear({{"type", "elu"}, {"alpha", 0.5}})},
      {"softplus", around_linear({{"type", "softplus"}, {"beta", 2.0}, {"threshold", 10.0}})},
      {"mish", around_linear({{"type", "mish"}})},
      {"identity", around_linear({{"type", "identity"}})},
      {"softmax", around_linear({{"type", "softmax"}, {"dim", 0}})},
      {"mean", model({4, 6}, {{{"type", "linear"}, {"out_features", 5}}, {{"type", "mean"}, {"dim", 0}}, linear3})},
      // A residual block: conv → relu → depthwise conv, added to the block's input.
      {"add",
       model({4, 6, 6}, {{{"type", "conv2d"}, {"out_channels", 4}, {"kernel_size", 1}, {"name", "stem"}},
                         {{"type", "relu"}},
                         {{"type", "conv2d"}, {"out_channels", 4}, {"kernel_size", 3}, {"padding", 1}, {"groups", 4}},
                         {{"type", "add"}, {"inputs", {"stem", "2"}}},
                         flatten,
                         linear3})},
      // Squeeze-and-excitation: channel weights [C, 1, 1] broadcast over [C, H, W].
      {"mul",
       model({4, 6, 6},
             {{{"type", "conv2d"}, {"out_channels", 4}, {"kernel_size", 3}, {"padding", 1}, {"name", "features"}},
              {{"type", "adaptive_avgpool2d"}},
              {{"type", "conv2d"}, {"out_channels", 4}, {"kernel_size", 1}},
              {{"type", "sigmoid"}, {"name", "weights"}},
              {{"type", "mul"}, {"inputs", {"features", "weights"}}},
              {{"type", "maxpool2d"}, {"kernel_size", 3}, {"stride", 2}, {"padding", 1}},
              flatten,
              linear3})},
      // Two branches on the input, joined along channels.
      {"concat", model({2, 5, 5}, {{{"type", "conv2d"}, {"out_channels", 3}, {"kernel_size", 1}, {"name", "narrow"}},
                                   {{"type", "conv2d"},
                                    {"out_channels", 2},
                                    {"kernel_size", 3},
                                    {"padding", 1},
                                    {"inputs", {"input"}},
                                    {"name", "wide"}},
                                   {{"type", "concat"}, {"inputs", {"narrow", "wide"}}},
                                   flatten,
                                   linear3})},
  };
  // The residual block's add names its second input by a name given here, so the JSON above stays readable.
  networks["add"]["layers"][2]["name"] = "2";
  return networks;
}

std::vector<torch::Tensor> copy_parameters(torch::nn::Module& module) {
  std::vector<torch::Tensor> copies;
  for (const auto& parameter : module.parameters()) copies.push_back(parameter.detach().clone());
  return copies;
}

class NetworkBuilderTest : public ::testing::Test {
 protected:
  void SetUp() override { set_worker_threads(1); }
};

TEST_F(NetworkBuilderTest, every_layer_type_has_a_test_network) {
  const auto networks = one_network_per_layer_type();
  for (const auto& type : estimator::known_layer_types())
    EXPECT_TRUE(networks.contains(type)) << "no test network for layer type " << type;
}

TEST_F(NetworkBuilderTest, every_layer_type_matches_the_estimator_shapes_and_parameters) {
  constexpr std::int64_t kBatch = 3;
  for (const auto& [type, json_model] : one_network_per_layer_type()) {
    SCOPED_TRACE(type);
    torch::manual_seed(1);
    auto network = build_network(spec_of(json_model), kBatch);
    ASSERT_TRUE(network) << network.error().message;
    const SyntheticBatch batch = make_synthetic_batch(*network, kBatch, torch::kCPU);
    ASSERT_EQ(network->module->size(), network->layers.size());
    std::vector<torch::Tensor> outputs;
    for (std::size_t i = 0; i < network->layers.size(); ++i) {
      const auto& layer = network->layers[i];
      std::vector<torch::Tensor> inputs;
      for (const auto source : layer.inputs)
        inputs.push_back(source < 0 ? batch.inputs : outputs.at(static_cast<std::size_t>(source)));
      const torch::Tensor x = network->module->forward_layer(i, inputs);
      outputs.push_back(x);
      std::vector<std::int64_t> expected{kBatch};
      expected.insert(expected.end(), layer.output_shape.begin(), layer.output_shape.end());
      EXPECT_EQ(x.sizes().vec(), expected) << "layer " << i << " " << layer.type;
      std::int64_t parameters = 0;
      for (const auto& p : network->module->ptr(i)->parameters()) parameters += p.numel();
      EXPECT_EQ(parameters, layer.cost.parameters) << "layer " << i << " " << layer.type;
    }
  }
}

// The activations with arguments compute what torch.nn's do with the same arguments (each is
// what the spec's Python tracer read off the user's module).
TEST_F(NetworkBuilderTest, the_activations_honour_their_arguments) {
  const torch::Tensor x = torch::tensor({-2.0F, -0.5F, 0.0F, 1.5F, 30.0F}).reshape({1, 5});
  auto apply = [&](const json& layer) {
    auto network = build_network(spec_of(model({5}, {layer})), 1);
    if (!network) throw std::runtime_error(network.error().message);
    return network->module->forward_layer(0, {x});
  };
  EXPECT_TRUE(torch::allclose(apply({{"type", "leaky_relu"}, {"negative_slope", 0.2}}), torch::leaky_relu(x, 0.2)));
  EXPECT_TRUE(torch::allclose(apply({{"type", "leaky_relu"}}), torch::leaky_relu(x, 0.01)));
  EXPECT_TRUE(torch::allclose(apply({{"type", "elu"}, {"alpha", 0.5}}), torch::elu(x, 0.5)));
  EXPECT_TRUE(torch::allclose(apply({{"type", "softplus"}, {"beta", 2.0}, {"threshold", 10.0}}),
                              torch::softplus(x, 2.0, 10.0)));
  EXPECT_TRUE(torch::allclose(apply({{"type", "mish"}}), x * torch::tanh(torch::softplus(x))));
}

TEST_F(NetworkBuilderTest, every_layer_type_trains) {
  for (const auto& [type, json_model] : one_network_per_layer_type()) {
    SCOPED_TRACE(type);
    for (const std::string optimizer : {"sgd", "adam"}) {
      auto session = TrainingSession::create(spec_of(json_model), {4, optimizer, torch::kCPU, 7});
      ASSERT_TRUE(session) << session.error().message;
      auto& module = *session->network().module;
      const auto before = copy_parameters(module);
      for (int step = 0; step < 3; ++step) {
        const double loss = session->step().item<double>();
        ASSERT_TRUE(std::isfinite(loss)) << optimizer << " step " << step;
      }
      // Every parameter of the first layer that has any moved (so gradients reach the input end).
      const auto after = copy_parameters(module);
      ASSERT_EQ(before.size(), after.size());
      bool changed = false;
      for (std::size_t i = 0; i < before.size(); ++i) changed |= !torch::equal(before[i], after[i]);
      EXPECT_TRUE(changed) << optimizer;
      auto first = session->network().module->ptr(0)->parameters();
      if (!first.empty()) {
        EXPECT_FALSE(torch::equal(first[0].detach(), before[0])) << optimizer << ": first layer";
      }
    }
  }
}

// The runtime probe reads each kind it admits on a network of its own (runtime_probe.hpp): every
// one builds and trains here as it does in the interpreter.
TEST_F(NetworkBuilderTest, every_kind_the_runtime_probe_reads_has_a_network_that_trains) {
  int kinds = 0;
  for (const auto& type : estimator::known_layer_types()) {
    auto spec = runtime_probe_kind_network(type, kRuntimeKindLayers);
    if (!estimator::runtime_kind_readable(type)) {
      ASSERT_FALSE(spec) << type;
      EXPECT_EQ(spec.error().where, "--kinds");
      continue;
    }
    SCOPED_TRACE(type);
    ++kinds;
    ASSERT_TRUE(spec) << spec.error().message;
    std::int64_t of_kind = 0;
    for (const auto& layer : spec->layers) of_kind += layer.type == type;
    EXPECT_GE(of_kind, kRuntimeKindLayers);
    auto session = TrainingSession::create(*spec, {8, "sgd", torch::kCPU, 1});
    ASSERT_TRUE(session) << session.error().message;
    ASSERT_TRUE(std::isfinite(session->step().item<double>()));
  }
  EXPECT_GE(kinds, 20);
}

TEST_F(NetworkBuilderTest, mse_regresses_a_target_shaped_like_the_output) {
  auto session = TrainingSession::create(spec_of(model({4, 6}, {{{"type", "linear"}, {"out_features", 2}}}, "mse")),
                                         {5, "sgd", torch::kCPU, 1});
  ASSERT_TRUE(session) << session.error().message;
  EXPECT_EQ(session->batch().targets.sizes().vec(), (std::vector<std::int64_t>{5, 4, 2}));
  EXPECT_EQ(session->batch().targets.scalar_type(), torch::kFloat);
  EXPECT_TRUE(std::isfinite(session->step().item<double>()));
}

TEST_F(NetworkBuilderTest, cross_entropy_over_a_sequence_uses_the_last_dim_as_classes) {
  auto session = TrainingSession::create(spec_of(one_network_per_layer_type().at("gru")), {4, "sgd", torch::kCPU, 1});
  ASSERT_TRUE(session) << session.error().message;
  EXPECT_EQ(session->batch().targets.sizes().vec(), (std::vector<std::int64_t>{4 * 5}));
  EXPECT_LT(session->batch().targets.max().item<std::int64_t>(), 3);
}

TEST_F(NetworkBuilderTest, token_ids_stay_below_num_embeddings) {
  torch::manual_seed(3);
  auto network = build_network(spec_of(testing::example_model("lstm_classifier")), 8);
  ASSERT_TRUE(network);
  const SyntheticBatch batch = make_synthetic_batch(*network, 8, torch::kCPU);
  EXPECT_EQ(batch.inputs.scalar_type(), torch::kLong);
  EXPECT_EQ(batch.inputs.sizes().vec(), (std::vector<std::int64_t>{8, 64}));
  EXPECT_GE(batch.inputs.min().item<std::int64_t>(), 0);
  EXPECT_LT(batch.inputs.max().item<std::int64_t>(), 10000);
}

TEST_F(NetworkBuilderTest, the_seed_fixes_weights_and_data) {
  const auto spec = spec_of(testing::example_model("mlp"));
  auto a = TrainingSession::create(spec, {4, "adam", torch::kCPU, 11});
  auto b = TrainingSession::create(spec, {4, "adam", torch::kCPU, 11});
  auto c = TrainingSession::create(spec, {4, "adam", torch::kCPU, 12});
  ASSERT_TRUE(a && b && c);
  EXPECT_TRUE(torch::equal(a->batch().inputs, b->batch().inputs));
  EXPECT_FALSE(torch::equal(a->batch().inputs, c->batch().inputs));
  EXPECT_DOUBLE_EQ(a->step().item<double>(), b->step().item<double>());
}

TEST_F(NetworkBuilderTest, every_example_model_trains_two_steps) {
  const auto directory = std::filesystem::path(JOULE_SOURCE_DIR) / "examples" / "models";
  int models = 0;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().filename().string());
    ++models;
    auto session = TrainingSession::create(spec_of(testing::example_model(entry.path().stem().string())),
                                           {2, "sgd", torch::kCPU, 1});
    ASSERT_TRUE(session) << session.error().where << ": " << session.error().message;
    for (int step = 0; step < 2; ++step) EXPECT_TRUE(std::isfinite(session->step().item<double>()));
  }
  EXPECT_GE(models, 9);
}

TEST_F(NetworkBuilderTest, shape_errors_name_the_layer) {
  json bad = testing::example_model("lenet5");
  bad["layers"].erase(6);  // no flatten before the first linear
  auto session = TrainingSession::create(spec_of(bad), {2, "sgd", torch::kCPU, 1});
  ASSERT_FALSE(session);
  EXPECT_EQ(session.error().where.rfind("/model/layers/6", 0), 0u) << session.error().where;
  EXPECT_NE(session.error().message.find("layer 6"), std::string::npos) << session.error().message;
}

TEST_F(NetworkBuilderTest, a_model_without_parameters_is_rejected) {
  auto session = TrainingSession::create(spec_of(model({2, 3}, {{{"type", "flatten"}}, {{"type", "relu"}}})),
                                         {2, "sgd", torch::kCPU, 1});
  ASSERT_FALSE(session);
  EXPECT_EQ(session.error().where, "/model/layers");
}

// A meter that gains one joule per read, so each reading's joules are known.
class CountingMeter final : public adapters::EnergyMeter {
 public:
  explicit CountingMeter(std::string source) : source_(std::move(source)) {}
  std::string_view source() const override { return source_; }
  Result<Joules> read() override { return Joules{static_cast<double>(reads_++)}; }
  int reads() const { return reads_; }

 private:
  std::string source_;
  int reads_ = 0;
};

ProbeRequest small_request() {
  ProbeRequest request;
  request.batch_size = 2;
  request.warmup_steps = 1;
  request.steps_per_repetition = 4;
  request.repetitions = 3;
  request.min_reading_seconds = 1e-9;  // exactly steps_per_repetition steps per reading
  request.networks = {spec_of(testing::example_model("mlp")), spec_of(testing::example_model("lenet5"))};
  return request;
}

TEST_F(NetworkBuilderTest, run_probe_reads_the_meter_around_every_block) {
  CountingMeter meter("modelled");
  auto result = run_probe(small_request(), meter);
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(meter.reads(), 2 * 2 * 3);  // before and after, 2 networks, 3 rounds
  EXPECT_EQ(result->meter_source, "modelled");
  EXPECT_FALSE(result->measured);
  ASSERT_EQ(result->networks.size(), 2u);
  EXPECT_EQ(result->networks[0].name, "har-mlp");
  EXPECT_EQ(result->networks[1].name, "lenet5");
  for (const auto& network : result->networks) {
    ASSERT_EQ(network.repetitions.size(), 3u);
    EXPECT_EQ(network.steps_per_repetition, 4);
    EXPECT_DOUBLE_EQ(network.joules_per_step, 0.25);  // 1 J per reading over 4 steps
    EXPECT_GT(network.seconds_per_step, 0.0);
    EXPECT_TRUE(std::isfinite(network.final_loss));
  }
  EXPECT_EQ(result->environment.threads, 1);
  EXPECT_GE(result->wall_seconds, result->networks[1].seconds_per_step * 12);
}

TEST_F(NetworkBuilderTest, every_optimizer_trains_and_each_network_may_name_its_own) {
  for (const auto& optimizer : estimator::known_optimizers()) {
    SessionOptions options;
    options.batch_size = 4;
    options.optimizer = optimizer;
    auto session = TrainingSession::create(spec_of(testing::example_model("mlp")), options, "/model");
    ASSERT_TRUE(session) << optimizer << ": " << session.error().message;
    const double first = session->step().item<double>();
    double last = first;
    for (int i = 0; i < 20; ++i) last = session->step().item<double>();
    EXPECT_TRUE(std::isfinite(last)) << optimizer;
    EXPECT_LT(last, first) << optimizer << " does not train the same batch";
  }
  CountingMeter meter("modelled");
  ProbeRequest request = small_request();
  request.networks[1] = request.networks[0];
  request.network_optimizers = {"adamw", "sgd"};  // an optimizer probe: one network, two optimizers
  auto result = run_probe(request, meter);
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->networks.size(), 2u);
}

TEST_F(NetworkBuilderTest, run_probe_calls_only_real_meters_measured) {
  CountingMeter meter("rapl");
  auto result = run_probe(small_request(), meter);
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_TRUE(result->measured);
}

TEST_F(NetworkBuilderTest, threads_are_set_and_recorded) {
  set_worker_threads(2);
  EXPECT_EQ(detect_environment("cpu").threads, 2);
  // OpenBLAS keeps its own pool, which ATen does not size: set_worker_threads does.
  using GetThreads = int (*)();
  if (auto* blas_threads = reinterpret_cast<GetThreads>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"))) {
    EXPECT_EQ(blas_threads(), 2);
  }
  ProbeRequest request = small_request();
  request.threads = 1;
  request.networks.resize(1);
  CountingMeter meter("modelled");
  auto result = run_probe(request, meter);
  ASSERT_TRUE(result);
  EXPECT_EQ(result->environment.threads, 1);
  EXPECT_EQ(torch::get_num_interop_threads(), 1);
}

TEST_F(NetworkBuilderTest, cuda_without_cuda_is_a_clear_error) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "this machine has CUDA";
  auto status = check_device("cuda:0");
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error().code, ErrorCode::unavailable);
  EXPECT_NE(status.error().message.find("CUDA is not available"), std::string::npos);
  ProbeRequest request = small_request();
  request.device = "cuda:0";
  CountingMeter meter("nvml");
  EXPECT_FALSE(run_probe(request, meter));
  EXPECT_EQ(check_device("gpu0").error().code, ErrorCode::invalid_argument);
}

TEST_F(NetworkBuilderTest, environment_names_torch_blas_and_cpu) {
  const WorkerEnvironment environment = detect_environment("cpu");
  EXPECT_EQ(environment.torch_version.rfind(std::to_string(TORCH_VERSION_MAJOR) + ".", 0), 0u);
  EXPECT_FALSE(environment.blas.empty());
  EXPECT_NE(environment.blas, "unknown");
  EXPECT_FALSE(environment.device_name.empty());
  EXPECT_EQ(environment.device, "cpu");
}

TEST(EnvironmentTest, blas_libraries_are_read_from_maps) {
  const std::string maps =
      "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3\n"
      "7f01-7f02 r--p 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3\n"
      "7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13\n"
      "7f03-7f04 r-xp 00000000 08:01 3 /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so\n"
      "7f04-7f05 rw-p 00000000 00:00 0 [heap]\n";
  EXPECT_EQ(blas_libraries_in_maps(maps),
            (std::vector<std::string>{"/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
                                      "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so"}));
  EXPECT_TRUE(blas_libraries_in_maps("7f00-7f01 r-xp 0 0:0 0 /usr/lib/libc.so.6\n").empty());
}

TEST(EnvironmentTest, cpu_model_name_from_cpuinfo) {
  testing::TempDir dir;
  const auto x86 = dir.write("x86", "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU\n");
  EXPECT_EQ(cpu_model_name(x86), "Intel(R) Xeon(R) CPU");
  const auto arm = dir.write("arm", "processor\t: 0\nBogoMIPS\t: 62.50\n\nModel\t: NVIDIA Jetson Orin Nano\n");
  EXPECT_EQ(cpu_model_name(arm), "NVIDIA Jetson Orin Nano");
  EXPECT_EQ(cpu_model_name(dir / "missing"), "unknown CPU");
}

TEST_F(NetworkBuilderTest, readings_are_lengthened_until_the_meter_can_resolve_them) {
  CountingMeter meter("nvml");
  ProbeRequest request = small_request();
  request.networks.resize(1);
  request.min_reading_seconds = 0.3;  // ~1000x 4 steps of the tiny MLP at batch 2 (tens of µs each)
  auto result = run_probe(request, meter);
  ASSERT_TRUE(result) << result.error().message;
  const auto& network = result->networks[0];
  EXPECT_GT(network.steps_per_repetition, 4);
  // Each reading is sized by the pace of the one before: its joules are one count over its steps.
  for (const auto& repetition : network.repetitions) {
    EXPECT_GT(repetition.steps, 4);
    EXPECT_DOUBLE_EQ(repetition.joules_per_step, 1.0 / repetition.steps);
  }
  EXPECT_EQ(network.repetitions.front().steps, network.steps_per_repetition);
  EXPECT_DOUBLE_EQ(default_min_reading_seconds("nvml"), 2.0);
  EXPECT_DOUBLE_EQ(default_min_reading_seconds("modelled"), 0.25);
}

}  // namespace
}  // namespace joule::worker
