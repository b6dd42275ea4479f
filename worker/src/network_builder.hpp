#pragma once
// Model spec -> LibTorch module, synthetic data and one training step.
//
// Every layer type of the spec (estimator/src/model_spec.cpp) maps to its torch.nn namesake with
// the same defaults the estimator assumes (layer_analysis.hpp), so what is measured here is what
// the estimator counts:
//   conv2d(stride 1, padding 0, bias), linear(bias), maxpool2d/avgpool2d(stride = kernel_size),
//   batchnorm2d(C), layernorm(last dim), dropout(p 0.5), flatten(all per-sample dims),
//   conv1d(as conv2d), dilation and groups as torch, batchnorm1d(C), adaptive_avgpool2d(1),
//   mean(over its per-sample dim; torch.mean(x, dim + 1)),
//   silu, hardswish, relu6, leaky_relu(negative_slope 0.01), elu(alpha 1), softplus(beta 1,
//   threshold 20), mish, identity, softmax(dim -1 per sample), add/mul/concat (torch's
//   broadcasting; concat along per-sample dim 0),
//   embedding, lstm/gru(batch_first, num_layers 1, output "last", bidirectional false: "last"
//   is out[:, -1], both directions' outputs at the last step), multihead_attention
//   (self-attention, no dropout, weights not returned), transformer_encoder_layer (post-norm,
//   relu, dropout 0.1; norm_first and activation "gelu" as torch's, the pre-norm layer built
//   from its parts since LibTorch 1.13 has none). LibTorch 1.13's attention modules are
//   sequence-first: the wrappers transpose batch-first [B, seq, E] around them.
//
// Shapes come from estimator::analyze_model, never re-derived: a spec the estimator rejects
// is rejected here with the same message.
//
// Synthetic data is one fixed batch, drawn once from the seed: float inputs ~ N(0, 1), or token
// ids uniform below the first embedding's num_embeddings. cross_entropy takes the last output
// dimension as the classes (a [B, seq, C] output becomes B·seq rows of C); mse regresses a
// same-shape N(0, 1) target.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "joule/common/result.hpp"
#include "joule/estimator/layer_analysis.hpp"
#include "joule/estimator/model_spec.hpp"

namespace joule::worker {

/// A model spec's graph as a module: layer i reads the outputs its spec names (model_spec.hpp)
/// and joins (add, mul, concat) are applied to their inputs in forward.
class GraphNetworkImpl : public torch::nn::Module {
 public:
  /// Appends layer size(): `module` (a parameter-free placeholder for a join), the layers it
  /// reads (-1: the network's input) and, for a join, "add", "mul" or "concat".
  void add(const std::string& name, torch::nn::AnyModule module, std::vector<std::int64_t> inputs,
           std::string join = {});
  /// The batched dim a concat layer joins along.
  void set_concat_dim(std::size_t index, std::int64_t dim) { concat_dims_[index] = dim; }

  torch::Tensor forward(const torch::Tensor& input);
  /// The same, showing `observe` each layer's output (index, tensor) as it is computed.
  using LayerObserver = std::function<void(std::size_t, const torch::Tensor&)>;
  torch::Tensor forward_observed(const torch::Tensor& input, const LayerObserver& observe);
  /// One layer applied to its inputs (in the order of its spec's inputs).
  torch::Tensor forward_layer(std::size_t index, const std::vector<torch::Tensor>& inputs);
  std::size_t size() const { return modules_.size(); }
  std::shared_ptr<torch::nn::Module> ptr(std::size_t index) const;

 private:
  std::vector<torch::nn::AnyModule> modules_;
  std::vector<std::vector<std::int64_t>> inputs_;
  std::vector<std::string> joins_;
  std::map<std::size_t, std::int64_t> concat_dims_;
};
TORCH_MODULE(GraphNetwork);

/// A spec built into modules, layer i of the spec at position i of `module`.
struct BuiltNetwork {
  estimator::ModelSpec spec;
  std::vector<estimator::AnalyzedLayer> layers;  ///< shapes per sample, from the estimator
  GraphNetwork module;
};

/// Builds the modules (weights initialised from torch's global generator: seed it first).
/// Fails with the estimator's message and pointer when the shapes do not fit.
Result<BuiltNetwork> build_network(const estimator::ModelSpec& spec, std::int64_t batch_size,
                                   const std::string& pointer = "/model");

/// A per-sample shape with the batch (or sample count) in front: {rows, shape...}.
std::vector<std::int64_t> batched(std::int64_t rows, const std::vector<std::int64_t>& shape);

/// One batch of inputs and targets for a network.
struct SyntheticBatch {
  torch::Tensor inputs;   ///< [B, input_shape...]: float, or int64 token ids
  torch::Tensor targets;  ///< class indices (int64) for cross_entropy, floats shaped like the output for mse
};

/// Draws a batch from torch's global generator, on `device`.
SyntheticBatch make_synthetic_batch(const BuiltNetwork& network, std::int64_t batch_size, torch::Device device);

/// The spec's loss of `output` against `targets` (see the header comment for the shapes).
torch::Tensor compute_loss(const std::string& loss, const torch::Tensor& output, const torch::Tensor& targets);

/// Whether EAT counts a layer's outputs as activations: every layer but the network's last (its
/// logits) and those that only reshape (flatten, identity), whose outputs are their inputs'.
bool is_sparsity_layer(const BuiltNetwork& network, std::size_t index);

/// What a session trains with.
struct SessionOptions {
  std::int64_t batch_size = 32;
  std::string optimizer = "sgd";  ///< estimator::known_optimizers(): sgd (lr 0.01), adam (lr 0.001)...
  torch::Device device = torch::kCPU;
  std::uint64_t seed = 1;
};

/// A network, its optimizer and its synthetic batch: everything one training step needs.
/// Construction seeds torch (weights and data are reproducible per seed). Not thread-safe.
class TrainingSession {
 public:
  /// Fails on shapes the estimator rejects or an unknown optimizer.
  static Result<TrainingSession> create(const estimator::ModelSpec& spec, const SessionOptions& options,
                                        const std::string& pointer = "/model");

  /// One forward, loss, backward and optimizer step; returns the loss (still on the device:
  /// reading it synchronises a GPU, so callers read it only outside timed regions).
  torch::Tensor step();
  /// The same on a batch of the caller's (the built-in trainer's data, already on the device).
  torch::Tensor step(const torch::Tensor& inputs, const torch::Tensor& targets);
  /// EAT (seed 004): a step that minimises the loss plus λ × the mean of x² / (x² + σ) over the
  /// activations of every layer that counts (is_sparsity_layer). Returns the loss and the penalty
  /// (before λ), both detached.
  std::pair<torch::Tensor, torch::Tensor> step(const torch::Tensor& inputs, const torch::Tensor& targets,
                                               const estimator::EatConfig& eat);

  BuiltNetwork& network() { return network_; }
  const SyntheticBatch& batch() const { return batch_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }

 private:
  TrainingSession(BuiltNetwork network, SyntheticBatch batch, std::shared_ptr<torch::optim::Optimizer> optimizer);

  BuiltNetwork network_;
  SyntheticBatch batch_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace joule::worker
