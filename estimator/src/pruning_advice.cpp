#include "joule/estimator/pruning_advice.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include <fmt/format.h>

#include "joule/estimator/layer_analysis.hpp"

namespace joule::estimator {

namespace {

// Width groups: union-find over nodes. Node 0 is the model's input and node 1 its output
// (neither can change width); every layer that sets a width has a node of its own.
class WidthGroups {
 public:
  std::size_t add(std::string fixed_because = "") {
    parent_.push_back(parent_.size());
    fixed_.push_back(std::move(fixed_because));
    return parent_.size() - 1;
  }
  std::size_t find(std::size_t node) {
    while (parent_[node] != node) node = parent_[node] = parent_[parent_[node]];
    return node;
  }
  void join(std::size_t a, std::size_t b) {
    a = find(a);
    b = find(b);
    if (a == b) return;
    parent_[b] = a;
    if (fixed_[a].empty()) fixed_[a] = fixed_[b];
  }
  void fix(std::size_t node, const std::string& because) {
    auto& reason = fixed_[find(node)];
    if (reason.empty()) reason = because;
  }
  const std::string& fixed_because(std::size_t node) { return fixed_[find(node)]; }

 private:
  std::vector<std::size_t> parent_;
  std::vector<std::string> fixed_;
};

// The argument that sets a layer's width, or "" where its output width follows its input.
std::string width_argument(const LayerSpec& layer) {
  if (layer.type == "conv2d" || layer.type == "conv1d") return "out_channels";
  if (layer.type == "linear") return "out_features";
  if (layer.type == "lstm" || layer.type == "gru") return "hidden_size";
  if (layer.type == "embedding") return "embedding_dim";
  if (layer.type == "transformer_encoder_layer") return "dim_feedforward";  // inside only
  return "";
}

std::int64_t integer_arg(const LayerSpec& layer, const char* name, std::int64_t fallback) {
  const auto it = layer.args.find(name);
  return it != layer.args.end() && it->is_number_integer() ? it->get<std::int64_t>() : fallback;
}

// A width scaled by a multiplier: multiples of 8 stay multiples of 8 (what vector units and
// the probed padding features favour), anything else rounds, never below 1.
std::int64_t scaled(std::int64_t width, double multiplier) {
  if (multiplier >= 1.0) return width;
  if (width >= 16 && width % 8 == 0)
    return std::max<std::int64_t>(8, 8 * std::llround(static_cast<double>(width) * multiplier / 8.0));
  return std::max<std::int64_t>(1, std::llround(static_cast<double>(width) * multiplier));
}

struct Layout {
  std::vector<std::string> argument;       // per layer: its width argument, "" when none or fixed by type
  std::vector<bool> depthwise;             // per layer: a convolution with groups = channels
  std::vector<std::size_t> group;          // per layer: its width group (for layers with an argument)
  std::vector<std::size_t> free_groups;    // groups that may shrink, in first-layer order
  std::vector<std::string> fixed_because;  // per layer with a width argument: why it cannot shrink
};

Layout layout_of(const ModelSpec& spec, const std::vector<AnalyzedLayer>& analyzed) {
  const std::size_t n = spec.layers.size();
  WidthGroups groups;
  const std::size_t input_node = groups.add("it is the network's input");
  const std::size_t output_node = groups.add("it is the network's output (its classes or targets)");
  Layout layout;
  layout.argument.assign(n, "");
  layout.depthwise.assign(n, false);
  layout.group.assign(n, 0);
  std::vector<std::size_t> source(n, input_node);  // the group that sets each layer's output width
  const auto source_of = [&](std::int64_t input) {
    return input < 0 ? input_node : source[static_cast<std::size_t>(input)];
  };
  for (std::size_t i = 0; i < n; ++i) {
    const auto& layer = spec.layers[i];
    const auto& inputs = analyzed[i].inputs;
    const std::size_t first = inputs.empty() ? input_node : source_of(inputs.front());
    std::string argument = width_argument(layer);
    const std::int64_t groups_arg = integer_arg(layer, "groups", 1);
    if (!argument.empty() && groups_arg > 1) {
      const std::int64_t in_channels = analyzed[i].input_shape.empty() ? 0 : analyzed[i].input_shape.front();
      if (groups_arg == in_channels && integer_arg(layer, "out_channels", 0) == in_channels) {
        layout.depthwise[i] = true;  // follows its input, groups and all
        argument.clear();
      } else {
        groups.fix(first, fmt::format("it feeds a grouped convolution (layer {})", i));
        const std::size_t own = groups.add(fmt::format("it is a grouped convolution (groups = {})", groups_arg));
        layout.group[i] = own;
        source[i] = own;
        continue;
      }
    }
    if (layer.type == "transformer_encoder_layer") {
      // Its feed-forward width is its own; its output keeps its input's width.
      layout.argument[i] = argument;
      layout.group[i] = groups.add();
      source[i] = first;
    } else if (!argument.empty()) {
      layout.argument[i] = argument;
      layout.group[i] = groups.add();
      source[i] = layout.group[i];
    } else if (layer.type == "add" || layer.type == "mul") {
      for (const auto input : inputs) groups.join(first, source_of(input));
      source[i] = first;
    } else if (layer.type == "concat") {
      // Its width is the sum of its inputs': it sets no group, but nothing may tie to it.
      source[i] = groups.add(fmt::format("it meets a concat's output (layer {}) in an add or mul", i));
    } else {
      source[i] = first;
    }
  }
  if (n > 0) groups.join(output_node, source[n - 1]);
  layout.fixed_because.assign(n, "");
  for (std::size_t i = 0; i < n; ++i) {
    if (width_argument(spec.layers[i]).empty() || layout.depthwise[i]) continue;
    const std::size_t root = groups.find(layout.group[i]);
    layout.group[i] = root;
    layout.fixed_because[i] = groups.fixed_because(root);
    if (layout.argument[i].empty() || !layout.fixed_because[i].empty()) continue;
    if (std::find(layout.free_groups.begin(), layout.free_groups.end(), root) == layout.free_groups.end())
      layout.free_groups.push_back(root);
  }
  return layout;
}

// The spec with each free group's multiplier applied.
ModelSpec rewrite(const ModelSpec& spec, const std::vector<AnalyzedLayer>& analyzed, const Layout& layout,
                  const std::map<std::size_t, double>& multipliers) {
  ModelSpec out = spec;
  // The width each layer's output has after the rewrite, for depthwise convolutions to follow.
  std::vector<std::int64_t> channels(spec.layers.size(), 0);
  for (std::size_t i = 0; i < spec.layers.size(); ++i) {
    auto& layer = out.layers[i];
    const auto multiplier = [&] {
      const auto it = multipliers.find(layout.group[i]);
      return it == multipliers.end() ? 1.0 : it->second;
    };
    if (!layout.argument[i].empty()) {
      const std::int64_t width = integer_arg(spec.layers[i], layout.argument[i].c_str(), 0);
      if (width > 0) layer.args[layout.argument[i]] = scaled(width, multiplier());
    }
    if (layout.depthwise[i] && !analyzed[i].inputs.empty() && analyzed[i].inputs.front() >= 0) {
      const std::int64_t in_channels = channels[static_cast<std::size_t>(analyzed[i].inputs.front())];
      if (in_channels > 0) {
        layer.args["out_channels"] = in_channels;
        layer.args["groups"] = in_channels;
      }
    }
    // The output's channels (the first dim), as the rewritten layers set them.
    if (layer.type == "conv2d" || layer.type == "conv1d") {
      channels[i] = integer_arg(layer, "out_channels", 0);
    } else if (!analyzed[i].inputs.empty() && analyzed[i].inputs.front() >= 0 && width_argument(layer).empty()) {
      channels[i] = channels[static_cast<std::size_t>(analyzed[i].inputs.front())];
    }
  }
  return out;
}

struct Candidate {
  ModelSpec spec;
  Estimate estimate;
  std::int64_t parameters = 0;
};

Result<Candidate> evaluate(const ModelSpec& spec, const TrainingConfig& training, const DeviceEnergyModel& model) {
  auto layers = analyze_model(spec, training.batch_size);
  if (!layers) return layers.error();
  auto estimate = model.estimate(*layers, training);
  if (!estimate) return estimate.error();
  return Candidate{spec, std::move(*estimate), total_cost(*layers).parameters};
}

}  // namespace

PruningOptions PruningOptions::down_to(double smallest) {
  PruningOptions options;
  options.ladder.clear();
  for (int eighths = 7; eighths >= 1 && eighths / 8.0 >= smallest - 1e-9; --eighths)
    options.ladder.push_back(eighths / 8.0);
  return options;
}

Result<PruningAdvice> advise_pruning(const ModelSpec& spec, const TrainingConfig& training,
                                     const DeviceEnergyModel& model, double target, const PruningOptions& options) {
  if (!(target > 0.0 && target < 1.0))
    return make_error(ErrorCode::invalid_argument,
                      "target must be a share of the energy between 0 and 1 (0.5: save half)", "target");
  auto analyzed = analyze_model(spec, training.batch_size);
  if (!analyzed) return analyzed.error();
  auto original = evaluate(spec, training, model);
  if (!original) return original.error();
  const Layout layout = layout_of(spec, *analyzed);

  PruningAdvice advice;
  advice.target = target;
  advice.original = original->estimate;
  advice.original_parameters = original->parameters;
  const double original_joules = original->estimate.joules.mean;

  // Greedy descent: each step lowers one free group by the notch (or the next that changes
  // the spec) that saves the most estimated joules per parameter it removes.
  std::map<std::size_t, double> multipliers;
  std::map<std::size_t, std::size_t> notch;  // next ladder index per group
  Candidate current = *original;
  while (current.estimate.joules.mean > (1.0 - target) * original_joules) {
    std::optional<Candidate> best;
    std::size_t best_group = 0;
    std::size_t best_notch = 0;
    double best_score = -1.0;
    for (const std::size_t group : layout.free_groups) {
      for (std::size_t k = notch[group]; k < options.ladder.size(); ++k) {
        auto trial = multipliers;
        trial[group] = options.ladder[k];
        auto candidate = evaluate(rewrite(spec, *analyzed, layout, trial), training, model);
        if (!candidate) break;  // a width the network cannot take (heads that no longer divide...)
        const double saved = current.estimate.joules.mean - candidate->estimate.joules.mean;
        const auto removed = current.parameters - candidate->parameters;
        if (removed <= 0 && saved <= 0.0) continue;  // rounding left it as it was: the next notch
        const double score = saved / static_cast<double>(std::max<std::int64_t>(removed, 1));
        if (score > best_score) {
          best_score = score;
          best = std::move(*candidate);
          best_group = group;
          best_notch = k;
        }
        break;
      }
    }
    if (!best || best_score <= 0.0) break;
    multipliers[best_group] = options.ladder[best_notch];
    notch[best_group] = best_notch + 1;
    current = std::move(*best);
  }

  advice.model = current.spec;
  if (!advice.model.name.empty()) advice.model.name += "-pruned";
  advice.advised = current.estimate;
  advice.advised_parameters = current.parameters;
  advice.saving = original_joules > 0.0 ? 1.0 - current.estimate.joules.mean / original_joules : 0.0;
  advice.reached = advice.saving >= target;

  double per_step = 0.0;
  for (const auto& layer : original->estimate.layers) per_step += layer.joules_per_step.mean;
  double fixed_share = 0.0;
  for (std::size_t i = 0; i < spec.layers.size(); ++i) {
    LayerAdvice layer;
    layer.index = i;
    layer.type = spec.layers[i].type;
    layer.name = spec.layers[i].name;
    for (const auto& estimated : original->estimate.layers)
      if (estimated.index == i && estimated.type == layer.type && per_step > 0.0)
        layer.energy_share += estimated.joules_per_step.mean / per_step;
    layer.width_argument = width_argument(spec.layers[i]);
    if (!layer.width_argument.empty()) {
      layer.width = integer_arg(spec.layers[i], layer.width_argument.c_str(), 0);
      layer.advised_width = integer_arg(current.spec.layers[i], layer.width_argument.c_str(), layer.width);
      const auto it = multipliers.find(layout.group[i]);
      layer.multiplier = layout.argument[i].empty() || it == multipliers.end() ? 1.0 : it->second;
      const bool free =
          std::find(layout.free_groups.begin(), layout.free_groups.end(), layout.group[i]) != layout.free_groups.end();
      if (layout.depthwise[i]) {
        layer.fixed_because = "a depthwise convolution: it follows its input's channels";
      } else if (layout.argument[i].empty() || !free) {
        layer.fixed_because = layout.fixed_because.at(i);
        fixed_share += layer.energy_share;
      }
    }
    advice.layers.push_back(std::move(layer));
  }
  if (!advice.reached) {
    advice.detail = fmt::format(
        "no pruning with widths down to x{} reaches a {:.0f} % saving: the most is {:.1f} %, and {:.0f} % of "
        "the estimated energy per step is in layers whose width cannot shrink",
        options.ladder.empty() ? 1.0 : options.ladder.back(), 100.0 * target, 100.0 * advice.saving,
        100.0 * fixed_share);
  }
  return advice;
}

}  // namespace joule::estimator
