#include "joule/estimator/layer_analysis.hpp"

#include <gtest/gtest.h>

#include "example_models.hpp"

// Expected parameter counts are what torch prints for
// sum(p.numel() for p in layer.parameters()), worked out by hand in the comments.

using joule::estimator::analyze_model;
using joule::estimator::AnalyzedLayer;
using joule::estimator::model_kind;
using joule::estimator::ModelSpec;
using joule::estimator::parse_model_spec;
using nlohmann::json;
using Shape = std::vector<std::int64_t>;

namespace {

json lenet(Shape input = {1, 28, 28}) {
  json spec = joule::testing::example_model("lenet5");
  spec["input"] = {{"shape", input}};
  return spec;
}

json model(json input, json layers) { return {{"input", std::move(input)}, {"layers", std::move(layers)}}; }

joule::Result<std::vector<AnalyzedLayer>> analyze(const json& spec, std::int64_t batch = 1,
                                                  const std::string& pointer = "/model") {
  auto parsed = parse_model_spec(spec, pointer);
  EXPECT_TRUE(parsed) << parsed.error().message;
  return analyze_model(parsed ? *parsed : ModelSpec{}, batch, pointer);
}

}  // namespace

TEST(LayerAnalysisTest, lenet5_shapes_and_parameters_match_torch) {
  auto layers = analyze(lenet());
  ASSERT_TRUE(layers) << layers.error().message;
  ASSERT_EQ(layers->size(), 12u);
  const std::vector<Shape> shapes = {{6, 28, 28}, {6, 28, 28}, {6, 14, 14}, {16, 10, 10}, {16, 10, 10}, {16, 5, 5},
                                     {400},       {120},       {120},       {84},         {84},         {10}};
  // conv1 6·1·5·5 + 6; conv2 16·6·5·5 + 16; fc 400·120 + 120, 120·84 + 84, 84·10 + 10.
  const std::vector<std::int64_t> parameters = {156, 0, 0, 2416, 0, 0, 0, 48120, 0, 10164, 0, 850};
  for (std::size_t i = 0; i < layers->size(); ++i) {
    EXPECT_EQ((*layers)[i].index, i);
    EXPECT_EQ((*layers)[i].output_shape, shapes[i]) << "layer " << i;
    EXPECT_EQ((*layers)[i].cost.parameters, parameters[i]) << "layer " << i;
    EXPECT_DOUBLE_EQ((*layers)[i].cost.parameter_bytes, 4.0 * parameters[i]);
  }
  EXPECT_EQ((*layers)[0].input_shape, (Shape{1, 28, 28}));
  EXPECT_EQ(joule::estimator::total_cost(*layers).parameters, 61706);  // torch: 61,706

  const auto& conv2 = (*layers)[3].features;
  EXPECT_EQ(conv2.at("in_channels"), 6);
  EXPECT_EQ(conv2.at("out_channels"), 16);
  EXPECT_EQ(conv2.at("kernel_size"), 5);
  EXPECT_EQ(conv2.at("stride"), 1);
  EXPECT_EQ(conv2.at("padding"), 0);
  EXPECT_EQ(conv2.at("in_height"), 14);
  EXPECT_EQ(conv2.at("in_width"), 14);
  EXPECT_EQ((*layers)[7].features.at("in_features"), 400);
  EXPECT_EQ((*layers)[7].features.at("out_features"), 120);
}

TEST(LayerAnalysisTest, missing_flatten_names_layer_reason_and_fix) {
  json spec = lenet();
  spec["layers"][6] = {{"type", "dropout"}};  // the flatten's place, shape unchanged
  auto layers = analyze(spec);
  ASSERT_FALSE(layers);
  EXPECT_EQ(layers.error().code, joule::ErrorCode::invalid_argument);
  EXPECT_EQ(layers.error().message, "layer 7 linear: expects a flat input, got [16, 5, 5]; add a flatten");
  EXPECT_EQ(layers.error().where, "/model/layers/7");
  EXPECT_EQ(analyze(spec, 1, "/job/model").error().where, "/job/model/layers/7");
}

TEST(LayerAnalysisTest, conv_kernel_larger_than_padded_input_is_rejected) {
  auto layers = analyze(lenet({1, 8, 8}));  // conv1 keeps 8x8, pool halves it, conv2 meets 4x4
  ASSERT_FALSE(layers);
  EXPECT_EQ(layers.error().message, "layer 3 conv2d: kernel 5 is larger than the padded input 4x4");
  EXPECT_EQ(layers.error().where, "/model/layers/3");
}

TEST(LayerAnalysisTest, pooling_to_zero_is_rejected_and_strides_floor_like_torch) {
  auto layers = analyze(lenet({1, 10, 10}));  // conv2 leaves 1x1; the second pool has nothing left
  ASSERT_FALSE(layers);
  EXPECT_EQ(layers.error().where, "/model/layers/5");
  EXPECT_EQ(layers.error().message.rfind("layer 5 maxpool2d: kernel 2 is larger than the input 1x1", 0), 0u)
      << layers.error().message;

  // torch: floor((7 - 3) / 2) + 1 = 3; conv floor((7 + 2 - 3) / 2) + 1 = 4.
  auto strided = analyze(model(
      {{"shape", {3, 7, 7}}},
      {{{"type", "avgpool2d"}, {"kernel_size", 3}, {"stride", 2}},
       {{"type", "conv2d"}, {"out_channels", 4}, {"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"bias", false}}}));
  ASSERT_TRUE(strided) << strided.error().message;
  EXPECT_EQ((*strided)[0].output_shape, (Shape{3, 3, 3}));
  EXPECT_EQ((*strided)[1].output_shape, (Shape{4, 2, 2}));
  EXPECT_EQ((*strided)[1].cost.parameters, 4 * 3 * 3 * 3);  // no bias
}

TEST(LayerAnalysisTest, transformer_d_model_not_divisible_by_nhead_is_rejected) {
  auto layers = analyze(
      model({{"shape", {10, 30}}}, {{{"type", "transformer_encoder_layer"}, {"nhead", 4}, {"dim_feedforward", 64}}}));
  ASSERT_FALSE(layers);
  EXPECT_EQ(layers.error().message,
            "layer 0 transformer_encoder_layer: d_model 30 (the input's last dim) is not divisible by nhead 4");
  EXPECT_EQ(layers.error().where, "/model/layers/0");
}

TEST(LayerAnalysisTest, token_model_embedding_lstm_last_linear) {
  auto layers = analyze(model({{"shape", {50}}, {"dtype", "token"}},
                              {{{"type", "embedding"}, {"num_embeddings", 1000}, {"embedding_dim", 32}},
                               {{"type", "lstm"}, {"hidden_size", 64}},
                               {{"type", "linear"}, {"out_features", 5}}}));
  ASSERT_TRUE(layers) << layers.error().message;
  EXPECT_EQ((*layers)[0].output_shape, (Shape{50, 32}));
  EXPECT_EQ((*layers)[1].output_shape, (Shape{64}));
  EXPECT_EQ((*layers)[2].output_shape, (Shape{5}));
  EXPECT_EQ((*layers)[0].cost.parameters, 32000);  // 1000·32
  EXPECT_EQ((*layers)[1].cost.parameters, 25088);  // 4·(32·64 + 64·64 + 2·64)
  EXPECT_EQ((*layers)[2].cost.parameters, 325);    // 64·5 + 5
  EXPECT_FALSE((*layers)[0].input_gradient);
  EXPECT_TRUE((*layers)[1].input_gradient);
  // Gate products per step: 2·4·64·32 (input) + 2·4·64·64 (hidden), 50 steps. Backward: weight
  // gradients as forward, dh through time, and dx because the embedding learns.
  const double ih = 2.0 * 50 * 4 * 64 * 32, hh = 2.0 * 50 * 4 * 64 * 64;
  EXPECT_DOUBLE_EQ((*layers)[1].cost.forward_flops, ih + hh);
  EXPECT_DOUBLE_EQ((*layers)[1].cost.backward_flops, 2 * ih + 2 * hh);
  EXPECT_EQ((*layers)[1].features.at("seq_len"), 50);
  EXPECT_EQ((*layers)[1].features.at("input_size"), 32);
  EXPECT_EQ((*layers)[1].features.at("output_sequence"), 0);
}

TEST(LayerAnalysisTest, token_and_float_inputs_must_match_the_embedding) {
  auto tokens_into_linear =
      analyze(model({{"shape", {50}}, {"dtype", "token"}}, {{{"type", "linear"}, {"out_features", 5}}}));
  ASSERT_FALSE(tokens_into_linear);
  EXPECT_EQ(tokens_into_linear.error().message, "layer 0 linear: the input is token ids; start with an embedding");

  const json embedding = {{"type", "embedding"}, {"num_embeddings", 100}, {"embedding_dim", 8}};
  auto floats_into_embedding = analyze(model({{"shape", {50}}}, {embedding}));
  ASSERT_FALSE(floats_into_embedding);
  EXPECT_NE(floats_into_embedding.error().message.find("\"dtype\" to \"token\""), std::string::npos);

  auto embedding_later = analyze(model({{"shape", {50}}, {"dtype", "token"}}, {embedding, embedding}));
  ASSERT_FALSE(embedding_later);
  EXPECT_EQ(embedding_later.error().where, "/model/layers/1");
  EXPECT_EQ(embedding_later.error().message,
            "layer 1 embedding: expects token ids, got a float tensor [50, 8]; an embedding must come first");
}

TEST(LayerAnalysisTest, lstm_sequence_then_linear_acts_on_the_last_dim) {
  auto layers = analyze(model({{"shape", {12, 8}}}, {{{"type", "lstm"}, {"hidden_size", 16}, {"output", "sequence"}},
                                                     {{"type", "layernorm"}},
                                                     {{"type", "linear"}, {"out_features", 4}}}),
                        3);
  ASSERT_TRUE(layers) << layers.error().message;
  EXPECT_EQ((*layers)[0].output_shape, (Shape{12, 16}));
  EXPECT_EQ((*layers)[1].output_shape, (Shape{12, 16}));
  EXPECT_EQ((*layers)[2].output_shape, (Shape{12, 4}));
  EXPECT_EQ((*layers)[0].cost.parameters, 1664);  // 4·(8·16 + 16·16 + 2·16)
  EXPECT_EQ((*layers)[1].cost.parameters, 32);    // γ, β of 16
  EXPECT_EQ((*layers)[2].cost.parameters, 68);    // 16·4 + 4
  EXPECT_DOUBLE_EQ((*layers)[2].cost.forward_flops, 2.0 * 3 * 12 * 16 * 4);
  EXPECT_EQ((*layers)[2].features.at("rows"), 12);
}

TEST(LayerAnalysisTest, stacked_recurrent_and_attention_parameters_match_torch) {
  auto rnn = [](const char* type) {
    return analyze(model({{"shape", {7, 10}}}, {{{"type", type}, {"hidden_size", 20}, {"num_layers", 2}}}));
  };
  auto lstm = rnn("lstm");
  auto gru = rnn("gru");
  ASSERT_TRUE(lstm && gru);
  EXPECT_EQ((*lstm)[0].cost.parameters, 5920);  // nn.LSTM(10, 20, 2): 4·(10·20 + 20·20 + 40) + 4·(20·20 + 20·20 + 40)
  EXPECT_EQ((*gru)[0].cost.parameters, 4440);  // nn.GRU(10, 20, 2): 3·(...) alike
  EXPECT_EQ((*gru)[0].output_shape, (Shape{20}));

  // Bidirectional: each direction's recurrence, a stacked layer reading both directions' outputs.
  auto both = analyze(model({{"shape", {7, 10}}},
                            {{{"type", "lstm"}, {"hidden_size", 20}, {"num_layers", 2}, {"bidirectional", true}}}));
  ASSERT_TRUE(both) << both.error().message;
  // nn.LSTM(10, 20, 2, bidirectional=True): 2·(4·(10·20 + 20·20 + 40) + 4·(40·20 + 20·20 + 40)).
  EXPECT_EQ((*both)[0].cost.parameters, 15040);
  EXPECT_EQ((*both)[0].output_shape, (Shape{40}));
  EXPECT_EQ(model_kind((*both)[0]), "lstm_bidirectional");
  EXPECT_EQ(model_kind((*lstm)[0]), "lstm");
  EXPECT_FALSE((*lstm)[0].features.contains("bidirectional"));  // a one-way recurrence keeps its features
  // Twice a one-way stack's work where the upper layer reads as many features as the one-way one.
  auto one_way_wide = analyze(model({{"shape", {7, 10}}}, {{{"type", "lstm"}, {"hidden_size", 20}}}));
  auto both_single =
      analyze(model({{"shape", {7, 10}}}, {{{"type", "lstm"}, {"hidden_size", 20}, {"bidirectional", true}}}));
  ASSERT_TRUE(one_way_wide && both_single);
  EXPECT_DOUBLE_EQ((*both_single)[0].cost.forward_flops, 2 * (*one_way_wide)[0].cost.forward_flops);

  auto attention = analyze(model({{"shape", {16, 64}}}, {{{"type", "multihead_attention"}, {"num_heads", 8}}}));
  ASSERT_TRUE(attention) << attention.error().message;
  EXPECT_EQ((*attention)[0].output_shape, (Shape{16, 64}));
  EXPECT_EQ((*attention)[0].cost.parameters, 16640);  // in_proj 192·64 + 192, out_proj 64·64 + 64

  // nn.TransformerEncoderLayer(512, 8, 2048): 4·512² + 4·512 + (512·2048 + 2048) + (2048·512 + 512) + 4·512.
  auto encoder = analyze(model({{"shape", {10, 512}}},
                               {{{"type", "transformer_encoder_layer"}, {"nhead", 8}, {"dim_feedforward", 2048}}}));
  ASSERT_TRUE(encoder) << encoder.error().message;
  EXPECT_EQ((*encoder)[0].cost.parameters, 3152384);
  EXPECT_EQ((*encoder)[0].features.at("d_model"), 512);
  // norm_first: the same parts in another order; gelu: 8 and 8 per hidden element where relu has 1 and 1.
  auto variant = [](json args) {
    json layer = {{"type", "transformer_encoder_layer"}, {"nhead", 8}, {"dim_feedforward", 2048}};
    layer.update(args);
    return analyze(model({{"shape", {10, 512}}}, {{{"type", "linear"}, {"out_features", 512}}, layer}));
  };
  auto post = variant(json::object()), pre = variant({{"norm_first", true}}), gelu = variant({{"activation", "gelu"}});
  ASSERT_TRUE(post && pre && gelu);
  EXPECT_EQ((*pre)[1].cost.parameters, 3152384);
  EXPECT_DOUBLE_EQ((*pre)[1].cost.forward_flops, (*post)[1].cost.forward_flops);
  EXPECT_DOUBLE_EQ((*gelu)[1].cost.forward_flops - (*post)[1].cost.forward_flops, 7.0 * 10 * 2048);
  EXPECT_DOUBLE_EQ((*gelu)[1].cost.backward_flops - (*post)[1].cost.backward_flops, 7.0 * 10 * 2048);
}

TEST(LayerAnalysisTest, first_layer_backward_skips_the_input_gradient) {
  const json dense = {{"type", "linear"}, {"out_features", 50}};
  auto first = analyze(model({{"shape", {100}}}, {dense}), 8);
  auto later = analyze(model({{"shape", {100}}}, {{{"type", "linear"}, {"out_features", 100}}, dense}), 8);
  ASSERT_TRUE(first && later);
  const auto& a = (*first)[0].cost;
  const auto& b = (*later)[1].cost;
  EXPECT_DOUBLE_EQ(a.forward_flops, b.forward_flops);
  EXPECT_DOUBLE_EQ(a.backward_flops, 2.0 * 8 * 100 * 50);  // weight gradient only
  EXPECT_DOUBLE_EQ(b.backward_flops, 4.0 * 8 * 100 * 50);  // weight and input gradients
  EXPECT_FALSE((*first)[0].input_gradient);
  EXPECT_TRUE((*later)[1].input_gradient);

  // LeNet's convolutions: the same rule, and nothing upstream of a parameter-free first layer.
  auto lenet5 = analyze(lenet());
  ASSERT_TRUE(lenet5);
  EXPECT_DOUBLE_EQ((*lenet5)[0].cost.forward_flops, 2.0 * 6 * 28 * 28 * 1 * 25);
  EXPECT_DOUBLE_EQ((*lenet5)[0].cost.backward_flops, (*lenet5)[0].cost.forward_flops);
  EXPECT_DOUBLE_EQ((*lenet5)[3].cost.backward_flops, 2 * (*lenet5)[3].cost.forward_flops);
  auto relu_first = analyze(model({{"shape", {100}}}, {{{"type", "relu"}}, dense}));
  ASSERT_TRUE(relu_first);
  EXPECT_EQ((*relu_first)[0].cost.backward_flops, 0.0);
  EXPECT_FALSE((*relu_first)[1].input_gradient);
}

TEST(LayerAnalysisTest, linear_forward_flops_are_two_per_multiply_add) {
  auto layers = analyze(lenet(), 32);
  ASSERT_TRUE(layers);
  EXPECT_DOUBLE_EQ((*layers)[7].cost.forward_flops, 2.0 * 32 * 400 * 120);  // 3,072,000
  EXPECT_DOUBLE_EQ((*layers)[7].cost.activation_bytes, 4.0 * 32 * 120);
  EXPECT_EQ((*layers)[6].cost.activation_bytes, 0.0);  // flatten is a view
}

TEST(LayerAnalysisTest, batch_scales_flops_and_activations_not_parameters) {
  auto one = analyze(lenet(), 1);
  auto eight = analyze(lenet(), 8);
  ASSERT_TRUE(one && eight);
  EXPECT_DOUBLE_EQ((*one)[0].cost.activation_bytes, 4.0 * 6 * 28 * 28);
  for (std::size_t i = 0; i < one->size(); ++i) {
    const auto& a = (*one)[i].cost;
    const auto& b = (*eight)[i].cost;
    EXPECT_DOUBLE_EQ(b.forward_flops, 8 * a.forward_flops) << "layer " << i;
    EXPECT_DOUBLE_EQ(b.backward_flops, 8 * a.backward_flops) << "layer " << i;
    EXPECT_DOUBLE_EQ(b.activation_bytes, 8 * a.activation_bytes) << "layer " << i;
    EXPECT_EQ(b.parameters, a.parameters);
    EXPECT_DOUBLE_EQ(b.parameter_bytes, a.parameter_bytes);
  }
  EXPECT_DOUBLE_EQ(joule::estimator::total_flops(*eight), 8 * joule::estimator::total_flops(*one));
}

TEST(LayerAnalysisTest, absurd_sizes_are_rejected_before_overflow) {
  auto huge_output = analyze(model({{"shape", {4096, 4096}}}, {{{"type", "linear"}, {"out_features", 1 << 30}}}));
  ASSERT_FALSE(huge_output);
  EXPECT_NE(huge_output.error().message.find("above the limit of 2^40"), std::string::npos);

  auto huge_weights =
      analyze(model({{"shape", {1 << 20}}}, {{{"type", "linear"}, {"out_features", std::int64_t{1} << 21}}}));
  ASSERT_FALSE(huge_weights);
  EXPECT_EQ(huge_weights.error().message, "layer 0 linear: has 2199025352704 parameters, above the limit of 2^40");

  auto huge_padding = analyze(
      model({{"shape", {1, 8, 8}}},
            {{{"type", "conv2d"}, {"out_channels", 1}, {"kernel_size", 3}, {"padding", std::int64_t{1} << 62}}}));
  ASSERT_FALSE(huge_padding);
  EXPECT_EQ(huge_padding.error().where, "/model/layers/0/padding");

  EXPECT_FALSE(analyze(lenet(), 0));
}

TEST(LayerAnalysisTest, spatial_layers_need_channels_height_width) {
  auto layers = analyze(model({{"shape", {400}}}, {{{"type", "batchnorm2d"}}}));
  ASSERT_FALSE(layers);
  EXPECT_EQ(layers.error().message,
            "layer 0 batchnorm2d: expects a [channels, height, width] input, got [400]; use layernorm for flat or "
            "sequence features");

  auto norm = analyze(model({{"shape", {16, 5, 5}}}, {{{"type", "batchnorm2d"}}}));
  ASSERT_TRUE(norm);
  EXPECT_EQ((*norm)[0].cost.parameters, 32);  // γ, β per channel; running stats are buffers
}
