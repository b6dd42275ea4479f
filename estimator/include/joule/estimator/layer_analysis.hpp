#pragma once
// Shape inference and per-layer cost counts for a model spec: pure functions, no I/O.
//
// Shapes follow torch.nn layer by layer (per sample, batch excluded). Each layer gets its
// parameter count (exactly what torch's `sum(p.numel() for p in layer.parameters())` prints),
// its FLOPs per training step and the bytes it moves, plus the configuration features the
// energy models (one GP per layer kind and position) are fitted on.
//
// Conventions (all counts are for ONE TRAINING STEP of the WHOLE BATCH; the loss, the optimizer
// update and data loading are outside every layer):
//
//  * A multiply-add is 2 FLOPs. Layers with weights count the multiply-adds of their matrix
//    products and convolutions only; bias additions and bias gradients are neglected (at most
//    1/fan_in of the total). So linear(in, out) on a flat input costs exactly 2·B·in·out
//    forward, 2·B·in·out for the weight gradient and 2·B·in·out for the input gradient.
//  * backward_flops = gradients w.r.t. weights (and gradients that flow between the parts of
//    one layer: the recurrence of an LSTM, the inside of attention) + the gradient w.r.t. the
//    layer's input. The input gradient is counted only when some EARLIER layer has parameters:
//    otherwise nothing upstream needs it and autograd skips it, as it does for a first layer
//    (measured: ignoring this under-predicts a network by 5–25 %). A parameter-free layer
//    in that position (a relu on the raw input) has no backward work at all.
//  * Parameter-free layers count a small constant of arithmetic per element (table below).
//    They are memory-bound: their activation bytes describe them better than their FLOPs.
//
//      layer                      forward / element          backward / element
//      relu                       1                          1
//      tanh, sigmoid              4                          3
//      gelu                       8                          8
//      silu                       5                          6
//      hardswish                  4                          3
//      relu6                      1                          1
//      leaky_relu                 2 (compare, scale)         2
//      elu                        4 (exp, −1, scale, select) 3
//      softplus                   5 (scale, exp, log1p, ÷β)  4
//      mish                       9 (softplus, tanh, ×x)     11 (recomputes softplus, tanh)
//      softmax                    5                          4
//      dropout                    2 (mask and scale)         2
//      batchnorm1d/2d, layernorm  8 (stats, normalise, γβ)   3 (γ, β) + 5 (input)
//      maxpool2d                  k² per output              1 per output (scatter)
//      avgpool2d                  k² per output              k² per output
//      adaptive_avgpool2d, mean   1 per input element        1 per input element
//      flatten, identity          0 (a view)                 0
//      embedding                  0 (a gather)               dim per token (scatter-add)
//      add                        (inputs − 1) per output    1 per output (a reduction where broadcast)
//      mul                        (inputs − 1) per output    inputs per output
//      concat                     0 (a copy)                 0 (views of the gradient)
//
//  * conv1d / conv2d with groups g count (in_channels / g) × kernel taps per output: a
//    depthwise convolution (g = in_channels) is as cheap in FLOPs as it is in parameters.
//    Dilation changes the output size only.
//  * In a graph (model_spec.hpp), "an earlier layer has parameters" means an ancestor: some
//    layer on a path from the model's input to this one. A tensor read by several layers gets
//    their gradients summed in backward; that sum is not counted (one add per element, where a
//    residual block's join already costs more).
//  * lstm / gru count their gate matrix products (4 gates for lstm, 3 for gru, input-to-hidden
//    and hidden-to-hidden, every time step, every stacked layer, each direction where
//    bidirectional: a stacked layer then reads 2h features); gate nonlinearities (O(h) per
//    step against O(h²)) are neglected. multihead_attention counts its projections, QKᵀ,
//    softmax (5 per score forward, 4 backward) and probs·V. transformer_encoder_layer is
//    torch's (dropout 0.1 also on attention probs) counted from the same pieces: post-norm and
//    relu by default; norm_first moves the norms (the same work), activation "gelu" counts
//    gelu's 8 and 8 per hidden element. Both variants share the kind's model (the work carries
//    the difference; a network measured whole carries the rest).
//  * activation_bytes = 4 × B × the float32 elements the layer writes in the forward pass and
//    that backward reads: its output; for lstm/gru/attention/transformer also the internal
//    tensors (per-step gates and states; Q, K, V, scores, probs...). flatten is a view and writes
//    nothing. Position-independent: the memory-traffic proxy of seed 002.
//  * parameter_bytes = 4 × parameters (float32 weights).
//
// Limits: every integer argument and every count per sample (output elements, stored elements,
// parameters) must be at most 2^40; larger specs are rejected as absurd rather than overflowing.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "joule/common/result.hpp"
#include "joule/estimator/model_spec.hpp"

namespace joule::estimator {

/// What one layer costs per training step of the whole batch (see the conventions above).
struct LayerCost {
  std::int64_t parameters = 0;    ///< trainable scalars, as torch counts them (buffers excluded)
  double forward_flops = 0.0;     ///< FLOPs of the forward pass (multiply-add = 2)
  double backward_flops = 0.0;    ///< weight gradients + input gradient when an earlier layer has parameters
  double activation_bytes = 0.0;  ///< float32 bytes written forward and kept for backward
  double parameter_bytes = 0.0;   ///< 4 × parameters

  LayerCost& operator+=(const LayerCost& other);
};

/// One layer after shape inference.
struct AnalyzedLayer {
  std::size_t index = 0;                  ///< position in ModelSpec::layers
  std::string type;                       ///< the layer type as written ("conv2d", "lstm"...)
  std::string name;                       ///< the layer's name, if it has one
  std::vector<std::int64_t> inputs;       ///< indices of the layers it reads; -1: the model's input
  std::vector<std::int64_t> input_shape;  ///< per sample, batch excluded (the first input's)
  std::vector<std::vector<std::int64_t>> input_shapes;  ///< every input's, in `inputs` order
  std::vector<std::int64_t> output_shape;
  /// True when some ancestor layer has parameters, so this layer's backward computes the
  /// gradient w.r.t. its input. False for the first layer: the THOR "input" position.
  bool input_gradient = false;
  LayerCost cost;
  /// The layer's configuration, for the GP of its kind (the caller adds batch_size):
  ///   conv2d: in_channels, out_channels, kernel_size, stride, padding, in_height, in_width, bias,
  ///     and groups when above 1 (a grouped convolution is a model kind of its own, model_kind())
  ///   conv1d: in_channels, out_channels, kernel_size, stride, padding, in_length, bias (groups as conv2d)
  ///   linear: in_features, out_features, rows (product of the leading dims, 1 if flat), bias
  ///   maxpool2d, avgpool2d: channels, in_height, in_width, kernel_size, stride
  ///   adaptive_avgpool2d: channels, in_height, in_width, output_size
  ///   mean: elements (per sample, of the input), dim_size (the dim averaged away)
  ///   batchnorm2d: channels, height, width; batchnorm1d: channels, length (1 for a flat input)
  ///   layernorm: normalized_size (last dim), rows
  ///   relu, gelu, tanh, sigmoid, silu, hardswish, relu6, leaky_relu, elu, softplus, mish, flatten,
  ///     identity: elements (per sample); dropout: elements, p; softmax: elements, dim_size
  ///   add, mul, concat: elements (of the output, per sample), inputs
  ///   embedding: num_embeddings, embedding_dim, seq_len (tokens per sample)
  ///   lstm, gru: input_size, hidden_size, num_layers, seq_len, output_sequence (0 or 1), and
  ///     bidirectional (1) where it is (a model kind of its own, model_kind())
  ///   multihead_attention: embed_dim, num_heads, seq_len
  ///   transformer_encoder_layer: d_model, nhead, dim_feedforward, seq_len
  std::map<std::string, double> features;
};

/// Infers every layer's shapes and costs like torch.nn would build the network for a batch of
/// `batch_size` samples (1 <= batch_size <= 2^40).
///
/// Layers are analysed in order; each reads the outputs named by its inputs (model_spec.hpp).
/// Shape rules: conv2d, pooling and batchnorm2d need [C, H, W], conv1d [C, L], batchnorm1d [C]
/// or [C, L]; linear acts on the last dim of
/// a flat [in] or sequence [seq, in] input; layernorm normalises the last dim; flatten turns
/// every per-sample dim into one; embedding needs token ids (input dtype "token") and must come
/// first, [..] → [.., embedding_dim]; lstm/gru take [seq, features] and give [hidden] (output
/// "last", the default) or [seq, hidden] ("sequence"); multihead_attention and
/// transformer_encoder_layer are self-attention over [seq, features] with features divisible
/// by the heads; activations, softmax and dropout keep the shape; add and mul broadcast their
/// inputs like torch (aligned from the last dim; a dim of 1 stretches), concat joins along
/// "dim" (per sample, default 0: channels) with every other dim equal; mean averages away its
/// "dim" (per sample; the input has at least 2 dims per sample).
///
/// Fails with ErrorCode::invalid_argument on the first layer whose shapes do not fit. The
/// message names the layer and the reason, with a fix where one is obvious ("layer 7 linear:
/// expects a flat input, got [16, 5, 5]; add a flatten"); `where` is the JSON pointer of the
/// layer ("<pointer>/layers/7") or of the offending argument. `pointer` is where the model sits
/// in the request, as for parse_model_spec.
Result<std::vector<AnalyzedLayer>> analyze_model(const ModelSpec& spec, std::int64_t batch_size,
                                                 const std::string& pointer = "/model");

/// The energy-model kind of a layer: its type, except "conv2d_grouped" / "conv1d_grouped" for
/// grouped and depthwise convolutions, whose cost per FLOP differs from a dense one's by an
/// order of magnitude (they are memory-bound), and "lstm_bidirectional" / "gru_bidirectional"
/// (two recurrences whose outputs are concatenated: not one of twice the FLOPs).
std::string model_kind(const AnalyzedLayer& layer);

/// The sum of every layer's cost.
LayerCost total_cost(const std::vector<AnalyzedLayer>& layers);

/// Forward plus backward FLOPs of one training step, all layers.
double total_flops(const std::vector<AnalyzedLayer>& layers);

/// "[16, 5, 5]": a shape as the error messages print it.
std::string format_shape(const std::vector<std::int64_t>& shape);

}  // namespace joule::estimator
