#include "joule/estimator/layer_analysis.hpp"

#include <functional>
#include <optional>
#include <utility>

#include <fmt/format.h>

namespace joule::estimator {
namespace {

using Shape = std::vector<std::int64_t>;
using nlohmann::json;

// Counts are computed in double and checked against 2^40 before any cast to int64: every
// partial product of positive integers is at most the checked total, so below 2^53 they are
// exact, and above it they cannot overflow (arguments are at most 2^40 each).
constexpr double kMaxCount = 1099511627776.0;  // 2^40
constexpr std::int64_t kMaxArgument = 1099511627776;

// Per-sample work of one layer; LayerCost is this times the batch.
struct Work {
  double forward = 0;
  double backward_inner = 0;  // weight gradients and gradients between the layer's own parts
  double backward_input = 0;  // gradient w.r.t. the layer's input: only if something upstream learns
  double stored = 0;          // float32 elements written forward and kept for backward

  Work& operator+=(const Work& other) {
    forward += other.forward;
    backward_inner += other.backward_inner;
    backward_input += other.backward_input;
    stored += other.stored;
    return *this;
  }
};

// A part of a composite layer whose input is made inside the layer: its input gradient is always needed.
Work inside(Work work) {
  work.backward_inner += work.backward_input;
  work.backward_input = 0;
  return work;
}

Work elementwise(double elements, double forward_per, double backward_per) {
  return {forward_per * elements, 0, backward_per * elements, elements};
}

// batchnorm/layernorm: stats + normalise + affine forward; γ, β gradients and the input gradient.
Work normalization(double elements) { return {8 * elements, 3 * elements, 5 * elements, elements}; }

// rows × [in → out] against a weight: the forward, weight-gradient and input-gradient products are equal.
Work matmul(double rows, double in, double out) {
  const double flops = 2 * rows * in * out;
  return {flops, flops, flops, rows * out};
}

// torch.nn.MultiheadAttention self-attention over [seq, embed], `heads` heads.
Work attention(double seq, double embed, double heads, bool dropout_on_probs) {
  const double scores = heads * seq * seq;
  const double products = 2 * seq * seq * embed;  // QKᵀ or probs·V, all heads together
  Work work = matmul(seq, embed, 3 * embed);      // in_proj; its input gradient is the layer's
  work += {products, 2 * products, 0, scores};    // QKᵀ; backward dQ, dK
  work += {5 * scores, 4 * scores, 0, scores};    // softmax
  if (dropout_on_probs) work += inside(elementwise(scores, 2, 2));
  work += {products, 2 * products, 0, seq * embed};  // probs·V; backward dprobs, dV
  work += inside(matmul(seq, embed, embed));         // out_proj
  return work;
}

// lstm (4 gates, states c and h) and gru (3 gates, state h): gate products of every step and layer.
Work recurrent(double gates, double states, double seq, double input, double hidden, double layers,
               double upper_input) {
  const auto one_layer = [&](double in) {
    const double ih = 2 * seq * gates * hidden * in;
    const double hh = 2 * seq * gates * hidden * hidden;
    // Weight gradients match the forward; the recurrence adds dh_{t-1} every step.
    return Work{ih + hh, ih + 2 * hh, ih, seq * (gates + states) * hidden};
  };
  Work work = one_layer(input);
  const Work upper = inside(one_layer(upper_input));
  work.forward += (layers - 1) * upper.forward;
  work.backward_inner += (layers - 1) * upper.backward_inner;
  work.stored += (layers - 1) * upper.stored;
  return work;
}

constexpr double num(std::int64_t value) { return static_cast<double>(value); }

double elements_of(const Shape& shape) {
  double n = 1;
  for (const auto dim : shape) n *= static_cast<double>(dim);
  return n;
}

// What a layer analyser sees: the layer, its input shapes and how to fail.
struct Layer {
  const LayerSpec& spec;
  std::size_t index;
  const std::vector<Shape>& ins;
  const std::vector<std::string>& in_names;  // how messages name each input ("layer 3 relu", "the input")
  const Shape& in;                           // ins.front()
  const std::string& where;

  std::int64_t arg(const char* key, std::int64_t fallback) const {
    const auto it = spec.args.find(key);
    return it != spec.args.end() && it->is_number_integer() ? it->get<std::int64_t>() : fallback;
  }
  bool flag(const char* key, bool fallback) const {
    const auto it = spec.args.find(key);
    return it != spec.args.end() && it->is_boolean() ? it->get<bool>() : fallback;
  }
  std::string text(const char* key, const std::string& fallback) const {
    const auto it = spec.args.find(key);
    return it != spec.args.end() && it->is_string() ? it->get<std::string>() : fallback;
  }
  Error fail(const std::string& reason) const {
    return make_error(ErrorCode::invalid_argument, fmt::format("{}: {}", layer_label(index, spec), reason), where);
  }
};

// What a layer analyser finds: per sample, before the batch and the position are applied.
struct Step {
  Shape out;
  Work work;
  double parameters = 0;
  std::map<std::string, double> features;
};

using Analyser = std::function<Result<Step>(const Layer&)>;

Error needs_chw(const Layer& layer, const std::string& fix = {}) {
  return layer.fail(fmt::format("expects a [channels, height, width] input, got {}{}", format_shape(layer.in), fix));
}

// The output size of a window of `kernel` taps `dilation` apart, sliding by `stride` over
// `size` + 2 × `padding`; 0 when the window does not fit.
std::int64_t window_output(std::int64_t size, std::int64_t kernel, std::int64_t stride, std::int64_t padding,
                           std::int64_t dilation) {
  const std::int64_t span = dilation * (kernel - 1) + 1, padded = size + 2 * padding;
  return span > padded ? 0 : (padded - span) / stride + 1;
}

// conv1d over [C, L] (spatial = {L}) and conv2d over [C, H, W] (spatial = {H, W}).
Result<Step> convolution(const Layer& layer, std::size_t spatial_dims) {
  if (layer.in.size() != spatial_dims + 1) {
    if (spatial_dims == 2) return needs_chw(layer);
    return layer.fail(fmt::format("expects a [channels, length] input, got {}", format_shape(layer.in)));
  }
  const std::int64_t channels = layer.in[0];
  const std::int64_t out = layer.arg("out_channels", 1), kernel = layer.arg("kernel_size", 1);
  const std::int64_t stride = layer.arg("stride", 1), padding = layer.arg("padding", 0);
  const std::int64_t dilation = layer.arg("dilation", 1), groups = layer.arg("groups", 1);
  const bool bias = layer.flag("bias", true);
  if (channels % groups != 0 || out % groups != 0)
    return layer.fail(
        fmt::format("groups {} must divide both in_channels {} and out_channels {}", groups, channels, out));
  Shape out_shape{out};
  double positions = 1;
  for (std::size_t d = 1; d <= spatial_dims; ++d) {
    const std::int64_t size = window_output(layer.in[d], kernel, stride, padding, dilation);
    if (size == 0) {
      std::string padded;
      for (std::size_t e = 1; e <= spatial_dims; ++e)
        padded += (e == 1 ? "" : "x") + std::to_string(layer.in[e] + 2 * padding);
      return layer.fail(fmt::format("kernel {}{} is larger than the padded input {}", kernel,
                                    dilation > 1 ? fmt::format(" (dilation {})", dilation) : "", padded));
    }
    out_shape.push_back(size);
    positions *= static_cast<double>(size);
  }
  double taps = 1;
  for (std::size_t d = 0; d < spatial_dims; ++d) taps *= static_cast<double>(kernel);
  const double fan_in = static_cast<double>(channels / groups) * taps;
  std::map<std::string, double> features{{"in_channels", num(channels)}, {"out_channels", num(out)},
                                         {"kernel_size", num(kernel)},   {"stride", num(stride)},
                                         {"padding", num(padding)},      {"bias", bias ? 1.0 : 0.0}};
  if (spatial_dims == 2) {
    features["in_height"] = num(layer.in[1]);
    features["in_width"] = num(layer.in[2]);
  } else {
    features["in_length"] = num(layer.in[1]);
  }
  if (groups > 1) features["groups"] = num(groups);
  return Step{std::move(out_shape), matmul(positions, fan_in, out), fan_in * out + (bias ? out : 0),
              std::move(features)};
}

Result<Step> pool2d(const Layer& layer, bool max) {
  if (layer.in.size() != 3) return needs_chw(layer);
  const std::int64_t channels = layer.in[0], height = layer.in[1], width = layer.in[2];
  const std::int64_t kernel = layer.arg("kernel_size", 1), stride = layer.arg("stride", kernel);
  const std::int64_t padding = layer.arg("padding", 0);
  if (2 * padding > kernel)
    return layer.fail(fmt::format("padding {} is more than half the kernel {} (torch refuses it)", padding, kernel));
  const std::int64_t out_h = window_output(height, kernel, stride, padding, 1);
  const std::int64_t out_w = window_output(width, kernel, stride, padding, 1);
  if (out_h == 0 || out_w == 0)
    return layer.fail(
        fmt::format("kernel {} is larger than the input {}x{}; the output would be empty; remove "
                    "this pooling or use a smaller kernel_size",
                    kernel, height, width));
  const Shape out{channels, out_h, out_w};
  const double window = static_cast<double>(kernel) * kernel;
  std::map<std::string, double> features{{"channels", num(channels)},
                                         {"in_height", num(height)},
                                         {"in_width", num(width)},
                                         {"kernel_size", num(kernel)},
                                         {"stride", num(stride)}};
  if (padding > 0) features["padding"] = num(padding);
  return Step{out, elementwise(elements_of(out), window, max ? 1 : window), 0, std::move(features)};
}

Result<Step> adaptive_avgpool2d(const Layer& layer) {
  if (layer.in.size() != 3) return needs_chw(layer);
  const std::int64_t size = layer.arg("output_size", 1);
  const double in = elements_of(layer.in);
  const Shape out{layer.in[0], size, size};
  // Every input element is read once forward and receives its share of a gradient backward.
  return Step{out,
              {in, 0, in, elements_of(out)},
              0,
              {{"channels", num(layer.in[0])},
               {"in_height", num(layer.in[1])},
               {"in_width", num(layer.in[2])},
               {"output_size", num(size)}}};
}

Result<Step> batchnorm1d(const Layer& layer) {
  if (layer.in.size() != 1 && layer.in.size() != 2)
    return layer.fail(
        fmt::format("expects a [channels] or [channels, length] input, got {}; use batchnorm2d for "
                    "images",
                    format_shape(layer.in)));
  const double length = layer.in.size() == 2 ? num(layer.in[1]) : 1.0;
  return Step{layer.in,
              normalization(elements_of(layer.in)),
              2.0 * layer.in[0],
              {{"channels", num(layer.in[0])}, {"length", length}}};
}

// A per-sample dim argument, torch style: negative counts from the end.
Result<std::size_t> dim_argument(const Layer& layer, const Shape& shape, std::int64_t fallback) {
  const std::int64_t rank = static_cast<std::int64_t>(shape.size());
  const std::int64_t dim = layer.arg("dim", fallback);
  const std::int64_t resolved = dim < 0 ? dim + rank : dim;
  if (resolved < 0 || resolved >= rank)
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("{}: dim {} is outside the input {} (dims count per sample, without the batch)",
                                  layer_label(layer.index, layer.spec), dim, format_shape(shape)),
                      layer.where + "/dim");
  return static_cast<std::size_t>(resolved);
}

Result<Step> softmax(const Layer& layer) {
  auto dim = dim_argument(layer, layer.in, -1);
  if (!dim) return dim.error();
  const double elements = elements_of(layer.in);
  Step step{layer.in, elementwise(elements, 5, 4), 0, {{"elements", elements}, {"dim_size", num(layer.in[*dim])}}};
  return step;
}

// The mean over one per-sample dim (a sequence's tokens, a signal's time steps): that dim goes.
Result<Step> mean(const Layer& layer) {
  if (layer.in.size() < 2)
    return layer.fail(
        fmt::format("takes an input of at least 2 dims per sample, got {}; a mean over every "
                    "feature of a sample is not a Joule layer",
                    format_shape(layer.in)));
  auto dim = dim_argument(layer, layer.in, 0);
  if (!dim) return dim.error();
  Shape out = layer.in;
  out.erase(out.begin() + static_cast<std::ptrdiff_t>(*dim));
  const double in = elements_of(layer.in);
  // As global average pooling: every input element read once forward, and given its share of
  // the gradient backward.
  return Step{out, {in, 0, in, elements_of(out)}, 0, {{"elements", in}, {"dim_size", num(layer.in[*dim])}}};
}

// add and mul: torch's broadcasting of the inputs' per-sample shapes.
Result<Step> broadcast_join(const Layer& layer, bool multiply) {
  Shape out = layer.ins.front();
  for (std::size_t k = 1; k < layer.ins.size(); ++k) {
    const Shape& next = layer.ins[k];
    Shape joined(std::max(out.size(), next.size()), 1);
    for (std::size_t d = 0; d < joined.size(); ++d) {
      const std::int64_t a = d < out.size() ? out[out.size() - 1 - d] : 1;
      const std::int64_t b = d < next.size() ? next[next.size() - 1 - d] : 1;
      if (a != b && a != 1 && b != 1)
        return layer.fail(fmt::format("{} {} and {} {} do not broadcast (dim {} from the end: {} against {})",
                                      layer.in_names[0], format_shape(layer.ins[0]), layer.in_names[k],
                                      format_shape(next), d + 1, a, b));
      joined[joined.size() - 1 - d] = std::max(a, b);
    }
    out = std::move(joined);
  }
  const double elements = elements_of(out), inputs = num(static_cast<std::int64_t>(layer.ins.size()));
  return Step{
      out, elementwise(elements, inputs - 1, multiply ? inputs : 1), 0, {{"elements", elements}, {"inputs", inputs}}};
}

Result<Step> concat(const Layer& layer) {
  auto dim = dim_argument(layer, layer.in, 0);
  if (!dim) return dim.error();
  Shape out = layer.in;
  for (std::size_t k = 1; k < layer.ins.size(); ++k) {
    const Shape& next = layer.ins[k];
    bool fits = next.size() == out.size();
    for (std::size_t d = 0; fits && d < out.size(); ++d) fits = d == *dim || next[d] == out[d];
    if (!fits)
      return layer.fail(fmt::format("{} {} and {} {} differ outside dim {}; concat needs every other dim equal",
                                    layer.in_names[0], format_shape(layer.ins[0]), layer.in_names[k],
                                    format_shape(next), *dim));
    out[*dim] += next[*dim];
  }
  const double elements = elements_of(out);
  return Step{out,
              {0, 0, 0, elements},
              0,
              {{"elements", elements}, {"inputs", num(static_cast<std::int64_t>(layer.ins.size()))}}};
}

Result<Step> batchnorm2d(const Layer& layer) {
  if (layer.in.size() != 3) return needs_chw(layer, "; use layernorm for flat or sequence features");
  return Step{layer.in,
              normalization(elements_of(layer.in)),
              2.0 * layer.in[0],
              {{"channels", num(layer.in[0])}, {"height", num(layer.in[1])}, {"width", num(layer.in[2])}}};
}

Result<Step> layernorm(const Layer& layer) {
  const double size = static_cast<double>(layer.in.back()), elements = elements_of(layer.in);
  return Step{layer.in, normalization(elements), 2 * size, {{"normalized_size", size}, {"rows", elements / size}}};
}

Result<Step> linear(const Layer& layer) {
  if (layer.in.size() > 2)
    return layer.fail(fmt::format("expects a flat input, got {}; add a flatten", format_shape(layer.in)));
  const std::int64_t in = layer.in.back(), out = layer.arg("out_features", 1);
  const bool bias = layer.flag("bias", true);
  const double rows = layer.in.size() == 2 ? static_cast<double>(layer.in[0]) : 1.0;
  Shape out_shape = layer.in;
  out_shape.back() = out;
  return Step{std::move(out_shape),
              matmul(rows, in, out),
              static_cast<double>(in) * out + (bias ? out : 0),
              {{"in_features", num(in)}, {"out_features", num(out)}, {"rows", rows}, {"bias", bias ? 1.0 : 0.0}}};
}

Analyser pointwise(double forward_per, double backward_per) {
  return [=](const Layer& layer) -> Result<Step> {
    const double elements = elements_of(layer.in);
    Step step{layer.in, elementwise(elements, forward_per, backward_per), 0, {{"elements", elements}}};
    if (layer.spec.type == "dropout") {
      const auto p = layer.spec.args.find("p");
      step.features["p"] = p != layer.spec.args.end() && p->is_number() ? p->get<double>() : 0.5;
    }
    return step;
  };
}

Result<Step> flatten(const Layer& layer) {
  const double elements = elements_of(layer.in);  // a view: no work, nothing written
  return Step{{static_cast<std::int64_t>(elements)}, {}, 0, {{"elements", elements}}};
}

Result<Step> identity(const Layer& layer) { return Step{layer.in, {}, 0, {{"elements", elements_of(layer.in)}}}; }

Result<Step> embedding(const Layer& layer) {
  const std::int64_t vocabulary = layer.arg("num_embeddings", 1), dim = layer.arg("embedding_dim", 1);
  const double tokens = elements_of(layer.in);
  Shape out = layer.in;
  out.push_back(dim);
  // A gather forward; backward scatter-adds one row per token into the weight gradient.
  return Step{std::move(out),
              {0, tokens * dim, 0, tokens * dim},
              static_cast<double>(vocabulary) * dim,
              {{"num_embeddings", num(vocabulary)}, {"embedding_dim", num(dim)}, {"seq_len", tokens}}};
}

Error needs_sequence(const Layer& layer) {
  return layer.fail(fmt::format("expects a [seq, features] input, got {}", format_shape(layer.in)));
}

Result<Step> rnn(const Layer& layer, double gates, double states) {
  if (layer.in.size() != 2) return needs_sequence(layer);
  const std::int64_t seq = layer.in[0], input = layer.in[1];
  const std::int64_t hidden = layer.arg("hidden_size", 1), layers = layer.arg("num_layers", 1);
  const bool sequence = layer.text("output", "last") == "sequence";
  const bool bidirectional = layer.flag("bidirectional", false);
  const double directions = bidirectional ? 2 : 1;
  const double h = static_cast<double>(hidden);
  // torch, per direction: weight_ih (G·h × in), weight_hh (G·h × h), bias_ih and bias_hh (G·h)
  // per layer; a stacked layer's input is every direction's output of the layer below.
  const double parameters =
      directions * (gates * (input * h + h * h + 2 * h) + (layers - 1) * gates * (directions * h * h + h * h + 2 * h));
  // Each direction runs the same recurrence over the sequence (the reverse one from its end).
  Work work = recurrent(gates, states, seq, input, h, layers, directions * h);
  work.forward *= directions;
  work.backward_inner *= directions;
  work.backward_input *= directions;
  work.stored *= directions;
  const std::int64_t width = bidirectional ? 2 * hidden : hidden;
  Step step{sequence ? Shape{seq, width} : Shape{width},
            work,
            parameters,
            {{"input_size", num(input)},
             {"hidden_size", num(hidden)},
             {"num_layers", num(layers)},
             {"seq_len", num(seq)},
             {"output_sequence", sequence ? 1.0 : 0.0}}};
  if (bidirectional) step.features["bidirectional"] = 1.0;  // a model kind of its own (model_kind)
  return step;
}

// Checks [seq, embed] with embed divisible by the heads; returns the error, if any.
std::optional<Error> check_heads(const Layer& layer, const char* embed_name, const char* heads_name) {
  if (layer.in.size() != 2) return needs_sequence(layer);
  const std::int64_t heads = layer.arg(heads_name, 1);
  if (layer.in[1] % heads != 0)
    return layer.fail(fmt::format("{} {} (the input's last dim) is not divisible by {} {}", embed_name, layer.in[1],
                                  heads_name, heads));
  return std::nullopt;
}

Result<Step> multihead_attention(const Layer& layer) {
  if (auto error = check_heads(layer, "embed_dim", "num_heads")) return *error;
  const double seq = static_cast<double>(layer.in[0]), embed = static_cast<double>(layer.in[1]);
  const double heads = static_cast<double>(layer.arg("num_heads", 1));
  // in_proj 3E×E + 3E, out_proj E×E + E.
  return Step{layer.in,
              attention(seq, embed, heads, false),
              4 * embed * embed + 4 * embed,
              {{"embed_dim", embed}, {"num_heads", heads}, {"seq_len", seq}}};
}

Result<Step> transformer_encoder_layer(const Layer& layer) {
  if (auto error = check_heads(layer, "d_model", "nhead")) return *error;
  const double seq = static_cast<double>(layer.in[0]), model = static_cast<double>(layer.in[1]);
  const double heads = static_cast<double>(layer.arg("nhead", 1));
  const double feedforward = static_cast<double>(layer.arg("dim_feedforward", 1));
  const double tokens = seq * model, hidden = seq * feedforward;
  // torch defaults: x = norm1(x + dropout1(attn(x))); x = norm2(x + dropout2(linear2(dropout(relu(linear1(x)))))).
  // norm_first moves each norm before its block (x = x + dropout1(attn(norm1(x))), ...): the same
  // work in another order. activation "gelu" costs GELU's arithmetic on the feed-forward's hidden.
  const bool gelu = layer.text("activation", "relu") == "gelu";
  Work work = attention(seq, model, heads, true);
  work += inside(elementwise(tokens, 2, 2));  // dropout1
  work += elementwise(tokens, 1, 1);          // residual add; backward meets the input gradient
  work += inside(normalization(tokens));
  work += inside(matmul(seq, model, feedforward));
  work += inside(gelu ? elementwise(hidden, 8, 8) : elementwise(hidden, 1, 1));  // relu or gelu
  work += inside(elementwise(hidden, 2, 2));  // dropout
  work += inside(matmul(seq, feedforward, model));
  work += inside(elementwise(tokens, 2, 2));  // dropout2
  work += inside(elementwise(tokens, 1, 1));  // residual add
  work += inside(normalization(tokens));
  const double parameters = (4 * model * model + 4 * model)               // self_attn
                            + (model * feedforward + feedforward)         // linear1
                            + (feedforward * model + model) + 4 * model;  // linear2, norm1, norm2
  return Step{layer.in,
              work,
              parameters,
              {{"d_model", model}, {"nhead", heads}, {"dim_feedforward", feedforward}, {"seq_len", seq}}};
}

const std::map<std::string, Analyser>& analysers() {
  static const std::map<std::string, Analyser> table = {
      {"conv2d", [](const Layer& layer) { return convolution(layer, 2); }},
      {"conv1d", [](const Layer& layer) { return convolution(layer, 1); }},
      {"linear", linear},
      {"relu", pointwise(1, 1)},
      {"relu6", pointwise(1, 1)},
      {"silu", pointwise(5, 6)},
      {"hardswish", pointwise(4, 3)},
      {"leaky_relu", pointwise(2, 2)},
      {"elu", pointwise(4, 3)},
      {"softplus", pointwise(5, 4)},
      {"mish", pointwise(9, 11)},
      {"softmax", softmax},
      {"identity", identity},
      {"adaptive_avgpool2d", adaptive_avgpool2d},
      {"mean", mean},
      {"batchnorm1d", batchnorm1d},
      {"add", [](const Layer& layer) { return broadcast_join(layer, false); }},
      {"mul", [](const Layer& layer) { return broadcast_join(layer, true); }},
      {"concat", concat},
      {"gelu", pointwise(8, 8)},
      {"tanh", pointwise(4, 3)},
      {"sigmoid", pointwise(4, 3)},
      {"dropout", pointwise(2, 2)},
      {"maxpool2d", [](const Layer& layer) { return pool2d(layer, true); }},
      {"avgpool2d", [](const Layer& layer) { return pool2d(layer, false); }},
      {"batchnorm2d", batchnorm2d},
      {"layernorm", layernorm},
      {"flatten", flatten},
      {"embedding", embedding},
      {"lstm", [](const Layer& layer) { return rnn(layer, 4, 2); }},
      {"gru", [](const Layer& layer) { return rnn(layer, 3, 1); }},
      {"multihead_attention", multihead_attention},
      {"transformer_encoder_layer", transformer_encoder_layer},
  };
  return table;
}

// Integer arguments must be in range before any shape arithmetic: this keeps every sum and
// product of them far from int64 overflow and rules out a zero stride.
std::optional<Error> check_arguments(const Layer& layer) {
  static const std::map<std::string, std::int64_t> kMinimums = {
      {"out_channels", 1}, {"kernel_size", 1},    {"stride", 1},        {"padding", 0},
      {"out_features", 1}, {"num_embeddings", 1}, {"embedding_dim", 1}, {"hidden_size", 1},
      {"num_layers", 1},   {"num_heads", 1},      {"nhead", 1},         {"dim_feedforward", 1},
      {"dilation", 1},     {"groups", 1},         {"output_size", 1},   {"dim", -kMaxArgument},
  };
  for (const auto& [key, minimum] : kMinimums) {
    const auto it = layer.spec.args.find(key);
    if (it == layer.spec.args.end()) continue;
    const std::string where = layer.where + "/" + key;
    if (!it->is_number_integer())
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("{}: {} must be an integer", layer_label(layer.index, layer.spec), key), where);
    const auto value = it->get<std::int64_t>();
    if (value < minimum || value > kMaxArgument)
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("{}: {} {} is outside [{}, 2^40]", layer_label(layer.index, layer.spec), key, value,
                                    minimum == -kMaxArgument ? "-2^40" : std::to_string(minimum)),
                        where);
  }
  return std::nullopt;
}

std::optional<Error> check_counts(const Layer& layer, const Step& step) {
  const double out = elements_of(step.out);
  if (out > kMaxCount)
    return layer.fail(fmt::format("the output {} has {:.0f} elements per sample, above the limit of 2^40",
                                  format_shape(step.out), out));
  if (step.work.stored > kMaxCount)
    return layer.fail(fmt::format("keeps {:.0f} activations per sample, above the limit of 2^40", step.work.stored));
  if (step.parameters > kMaxCount)
    return layer.fail(fmt::format("has {:.0f} parameters, above the limit of 2^40", step.parameters));
  return std::nullopt;
}

// Tokens flow only into an embedding, and an embedding takes only tokens.
std::optional<Error> check_dtype(const Layer& layer, bool tokens) {
  const bool is_embedding = layer.spec.type == "embedding";
  if (tokens && !is_embedding) return layer.fail("the input is token ids; start with an embedding");
  if (!tokens && is_embedding) {
    if (layer.index == 0)
      return layer.fail("expects token ids, got a float input; set the input's \"dtype\" to \"token\"");
    return layer.fail(
        fmt::format("expects token ids, got a float tensor {}; an embedding must come first", format_shape(layer.in)));
  }
  return std::nullopt;
}

}  // namespace

LayerCost& LayerCost::operator+=(const LayerCost& other) {
  parameters += other.parameters;
  forward_flops += other.forward_flops;
  backward_flops += other.backward_flops;
  activation_bytes += other.activation_bytes;
  parameter_bytes += other.parameter_bytes;
  return *this;
}

std::string format_shape(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  return text + "]";
}

Result<std::vector<AnalyzedLayer>> analyze_model(const ModelSpec& spec, std::int64_t batch_size,
                                                 const std::string& pointer) {
  if (batch_size < 1 || batch_size > kMaxArgument)
    return make_error(ErrorCode::invalid_argument, fmt::format("batch_size {} is outside [1, 2^40]", batch_size));
  Shape shape = spec.input_shape;
  if (shape.empty()) return make_error(ErrorCode::invalid_argument, "input shape is empty", pointer + "/input/shape");
  for (const auto dim : shape) {
    if (dim < 1 || dim > kMaxArgument)
      return make_error(ErrorCode::invalid_argument, fmt::format("input dimension {} is outside [1, 2^40]", dim),
                        pointer + "/input/shape");
  }
  if (elements_of(shape) > kMaxCount)
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("input {} has more than 2^40 elements per sample", format_shape(shape)),
                      pointer + "/input/shape");

  auto wiring = resolve_inputs(spec.layers, pointer);
  if (!wiring) return wiring.error();

  const double batch = static_cast<double>(batch_size);
  const bool token_input = spec.input_dtype == "token";
  // Per layer: whether it or an ancestor learns, so a layer reading it owes it a gradient.
  std::vector<bool> learns_upstream(spec.layers.size(), false);
  std::vector<AnalyzedLayer> analyzed;
  analyzed.reserve(spec.layers.size());
  for (std::size_t i = 0; i < spec.layers.size(); ++i) {
    const std::string where = fmt::format("{}/layers/{}", pointer, i);
    const auto& sources = (*wiring)[i];
    std::vector<Shape> ins;
    std::vector<std::string> in_names;
    bool upstream_parameters = false, tokens = false;
    for (const auto source : sources) {
      if (source < 0) {
        ins.push_back(shape);
        in_names.push_back("the input");
        tokens = tokens || token_input;
      } else {
        const auto& from = analyzed[static_cast<std::size_t>(source)];
        ins.push_back(from.output_shape);
        in_names.push_back(layer_label(from.index, spec.layers[from.index]));
        upstream_parameters = upstream_parameters || learns_upstream[from.index];
      }
    }
    const Layer layer{spec.layers[i], i, ins, in_names, ins.front(), where};
    const auto analyser = analysers().find(layer.spec.type);
    if (analyser == analysers().end())
      return make_error(ErrorCode::invalid_argument, fmt::format("layer {}: unknown type \"{}\"", i, layer.spec.type),
                        where + "/type");
    if (auto error = check_arguments(layer)) return *error;
    if (auto error = check_dtype(layer, tokens)) return *error;
    auto step = analyser->second(layer);
    if (!step) return step.error();
    if (auto error = check_counts(layer, *step)) return *error;

    AnalyzedLayer out;
    out.index = i;
    out.type = layer.spec.type;
    out.name = layer.spec.name;
    out.inputs = sources;
    out.input_shape = ins.front();
    out.input_shapes = std::move(ins);
    out.output_shape = step->out;
    out.input_gradient = upstream_parameters;
    const Work& work = step->work;
    out.cost.parameters = static_cast<std::int64_t>(step->parameters);
    out.cost.forward_flops = batch * work.forward;
    out.cost.backward_flops = batch * (work.backward_inner + (upstream_parameters ? work.backward_input : 0.0));
    out.cost.activation_bytes = 4.0 * batch * work.stored;
    out.cost.parameter_bytes = 4.0 * step->parameters;
    out.features = std::move(step->features);

    learns_upstream[i] = upstream_parameters || out.cost.parameters > 0;
    analyzed.push_back(std::move(out));
  }
  return analyzed;
}

std::string model_kind(const AnalyzedLayer& layer) {
  if ((layer.type == "conv2d" || layer.type == "conv1d") && layer.features.contains("groups"))
    return layer.type + "_grouped";
  if ((layer.type == "lstm" || layer.type == "gru") && layer.features.contains("bidirectional"))
    return layer.type + "_bidirectional";
  return layer.type;
}

LayerCost total_cost(const std::vector<AnalyzedLayer>& layers) {
  LayerCost total;
  for (const auto& layer : layers) total += layer.cost;
  return total;
}

double total_flops(const std::vector<AnalyzedLayer>& layers) {
  const LayerCost total = total_cost(layers);
  return total.forward_flops + total.backward_flops;
}

}  // namespace joule::estimator
