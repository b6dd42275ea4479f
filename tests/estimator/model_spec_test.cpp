#include "joule/estimator/model_spec.hpp"

#include <gtest/gtest.h>

#include "example_models.hpp"

using joule::estimator::known_optimizers;
using joule::estimator::parse_model_spec;
using joule::estimator::parse_training_config;
using nlohmann::json;

namespace {

json lenet() { return joule::testing::example_model("lenet5"); }

}  // namespace

TEST(ModelSpecTest, parses_the_architecture_example) {
  auto spec = parse_model_spec(lenet(), "/model");
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(spec->name, "lenet5");
  EXPECT_EQ(spec->input_shape, (std::vector<std::int64_t>{1, 28, 28}));
  ASSERT_EQ(spec->layers.size(), 12u);
  EXPECT_EQ(spec->layers[0].type, "conv2d");
  EXPECT_EQ(spec->layers[0].args["padding"], 2);
  EXPECT_EQ(joule::estimator::to_json(*spec)["layers"][0]["out_channels"], 6);
}

TEST(ModelSpecTest, unknown_layer_type_names_index_and_pointer) {
  json spec = lenet();
  spec["layers"][3]["type"] = "conv3d";
  auto parsed = parse_model_spec(spec, "/model");
  ASSERT_FALSE(parsed);
  EXPECT_EQ(parsed.error().where, "/model/layers/3/type");
  EXPECT_NE(parsed.error().message.find("layer 3"), std::string::npos);
  EXPECT_NE(parsed.error().message.find("conv3d"), std::string::npos);
}

TEST(ModelSpecTest, missing_required_argument_is_named) {
  json spec = lenet();
  spec["layers"][7].erase("out_features");
  auto parsed = parse_model_spec(spec, "/model");
  ASSERT_FALSE(parsed);
  EXPECT_EQ(parsed.error().where, "/model/layers/7/out_features");
}

TEST(ModelSpecTest, wrong_argument_type_and_unknown_argument_are_rejected) {
  json spec = lenet();
  spec["layers"][0]["kernel_size"] = "5";
  EXPECT_EQ(parse_model_spec(spec, "/model").error().where, "/model/layers/0/kernel_size");
  spec = lenet();
  spec["layers"][0]["kernel"] = 5;
  EXPECT_EQ(parse_model_spec(spec, "/model").error().where, "/model/layers/0/kernel");
  spec = lenet();
  spec["layers"][1]["p"] = 1.5;  // relu takes no arguments
  EXPECT_FALSE(parse_model_spec(spec, "/model"));
}

TEST(ModelSpecTest, input_shape_must_be_positive_integers) {
  json spec = lenet();
  spec["input"]["shape"] = json::array({1, 0, 28});
  EXPECT_EQ(parse_model_spec(spec, "/model").error().where, "/model/input/shape/1");
  spec["input"]["shape"] = json::array();
  EXPECT_EQ(parse_model_spec(spec, "/model").error().where, "/model/input/shape");
  spec.erase("input");
  EXPECT_EQ(parse_model_spec(spec, "/model").error().where, "/model/input");
}

TEST(ModelSpecTest, token_inputs_and_sequence_layers_parse) {
  auto spec = parse_model_spec(json::parse(R"({
      "input": {"shape": [64], "dtype": "token"},
      "layers": [{"type": "embedding", "num_embeddings": 1000, "embedding_dim": 32},
                 {"type": "lstm", "hidden_size": 64, "output": "last"},
                 {"type": "linear", "out_features": 2}]})"),
                               "/model");
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(spec->input_dtype, "token");
  json bad =
      json::parse(R"({"input": {"shape": [64]}, "layers": [{"type": "gru", "hidden_size": 8, "output": "all"}]})");
  EXPECT_EQ(parse_model_spec(bad, "/model").error().where, "/model/layers/0/output");
}

TEST(TrainingConfigTest, steps_round_up_partial_batches) {
  auto training =
      parse_training_config(json::parse(R"({"batch_size": 64, "epochs": 5, "samples_per_epoch": 60000})"), "/training");
  ASSERT_TRUE(training);
  EXPECT_EQ(joule::estimator::steps_of(*training), 5 * 938);
}

TEST(TrainingConfigTest, rejects_zero_batch_and_unknown_optimizer) {
  EXPECT_EQ(
      parse_training_config(json::parse(R"({"batch_size": 0, "samples_per_epoch": 10})"), "/training").error().where,
      "/training/batch_size");
  EXPECT_EQ(parse_training_config(json::parse(R"({"optimizer": "lion", "samples_per_epoch": 10})"), "/training")
                .error()
                .where,
            "/training/optimizer");
  const auto lion =
      parse_training_config(json::parse(R"({"optimizer": "lion", "samples_per_epoch": 10})"), "/training");
  EXPECT_NE(lion.error().message.find("\"sgd_momentum\", \"adam\", \"adamw\", \"rmsprop\""), std::string::npos)
      << lion.error().message;
  for (const auto& name : known_optimizers()) {
    auto config = parse_training_config(json{{"optimizer", name}, {"samples_per_epoch", 10}}, "/training");
    ASSERT_TRUE(config) << name;
    EXPECT_EQ(config->optimizer, name);
  }
  EXPECT_EQ(parse_training_config(json::parse(R"({"epochs": 1})"), "/training").error().where,
            "/training/samples_per_epoch");
}

TEST(ModelSpecTest, the_parametrised_activations_take_their_torch_arguments_and_name_a_bad_one) {
  auto spec = parse_model_spec(json::parse(R"({"input": {"shape": [8]}, "layers": [
      {"type": "leaky_relu", "negative_slope": 0.2}, {"type": "elu", "alpha": -0.5},
      {"type": "softplus", "beta": 2, "threshold": 10.5}, {"type": "mish"}, {"type": "leaky_relu"}]})"),
                               "/model");
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(spec->layers[0].args["negative_slope"], 0.2);
  auto bad = [](const json& layer) {
    json model = {{"input", {{"shape", {8}}}}, {"layers", json::array({layer})}};
    auto parsed = parse_model_spec(model, "/model");
    return parsed ? std::string("accepted") : parsed.error().where + ": " + parsed.error().message;
  };
  EXPECT_EQ(bad({{"type", "leaky_relu"}, {"negative_slope", "0.1"}}),
            "/model/layers/0/negative_slope: layer 0 leaky_relu: negative_slope must be a finite number");
  EXPECT_EQ(bad({{"type", "softplus"}, {"beta", 0}}),
            "/model/layers/0/beta: layer 0 softplus: beta must be a number > 0");
  EXPECT_EQ(bad({{"type", "mish"}, {"inplace", true}}).substr(0, 24), "/model/layers/0/inplace:");
  EXPECT_EQ(bad({{"type", "transformer_encoder_layer"}, {"nhead", 2}, {"dim_feedforward", 8}, {"activation", "swish"}}),
            "/model/layers/0/activation: layer 0 transformer_encoder_layer: activation must be \"relu\" or \"gelu\"");
  EXPECT_EQ(bad({{"type", "transformer_encoder_layer"}, {"nhead", 2}, {"dim_feedforward", 8}, {"norm_first", 1}}),
            "/model/layers/0/norm_first: layer 0 transformer_encoder_layer: norm_first must be true or false");
}
