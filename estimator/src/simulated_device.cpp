#include "joule/estimator/simulated_device.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace joule::estimator {
namespace {

double padded_ratio(double channels, int block) {
  if (channels <= 0 || block <= 1) return 1.0;
  return std::ceil(channels / block) * block / channels;
}

double feature(const AnalyzedLayer& layer, const char* name, double fallback = 0.0) {
  const auto it = layer.features.find(name);
  return it == layer.features.end() ? fallback : it->second;
}

// Kernels a layer launches per step: forward, and backward pieces when it has work to do.
int kernel_launches(const AnalyzedLayer& layer) {
  if (layer.type == "flatten" || layer.type == "identity") return 0;  // views
  const bool has_weights = layer.cost.parameters > 0;
  int kernels = 1 + (has_weights ? 1 : 0) + (layer.input_gradient ? 1 : 0);
  if (layer.type == "lstm" || layer.type == "gru") kernels *= static_cast<int>(std::max(1.0, feature(layer, "seq_len", 1)));
  if (layer.type == "multihead_attention") kernels *= 4;
  if (layer.type == "transformer_encoder_layer") kernels *= 9;
  return kernels;
}

}  // namespace

const std::vector<SimulatedProfile>& simulated_profiles() {
  static const std::vector<SimulatedProfile> profiles = [] {
    std::vector<SimulatedProfile> out;
    SimulatedProfile jetson;
    jetson.name = "jetson-orin";
    jetson.description = "embedded GPU: fast at large layers, costly launches, small shared memory";
    jetson.peak_flops_per_second = 1.2e12;
    jetson.half_saturation_flops = 4e7;
    jetson.bandwidth_bytes_per_second = 6e10;
    jetson.cache_bytes = 4e6;
    jetson.cache_penalty = 1.8;
    jetson.channel_block = 8;
    jetson.launch_seconds = 3e-5;
    jetson.static_watts = 6.0;
    jetson.joules_per_flop = 8e-12;
    jetson.joules_per_byte = 1.5e-10;
    jetson.step_overhead_seconds = 1.5e-3;
    out.push_back(jetson);

    SimulatedProfile pi;
    pi.name = "raspberry-pi-4";
    pi.description = "small ARM CPU: low peak, narrow vectors, tiny cache, low power";
    pi.peak_flops_per_second = 8e9;
    pi.half_saturation_flops = 2e5;
    pi.bandwidth_bytes_per_second = 3e9;
    pi.cache_bytes = 1e6;
    pi.cache_penalty = 3.0;
    pi.channel_block = 4;
    pi.launch_seconds = 4e-6;
    pi.static_watts = 2.7;
    pi.joules_per_flop = 2.5e-10;
    pi.joules_per_byte = 4e-10;
    pi.step_overhead_seconds = 2e-3;
    out.push_back(pi);

    SimulatedProfile server;
    server.name = "server-gpu";
    server.description = "data-centre GPU: very high peak that small layers cannot use, high static power";
    server.peak_flops_per_second = 3e13;
    server.half_saturation_flops = 5e8;
    server.bandwidth_bytes_per_second = 1.5e12;
    server.cache_bytes = 4e7;
    server.cache_penalty = 1.5;
    server.channel_block = 16;
    server.launch_seconds = 8e-6;
    server.static_watts = 70.0;
    server.joules_per_flop = 1.5e-12;
    server.joules_per_byte = 6e-11;
    server.step_overhead_seconds = 4e-4;
    out.push_back(server);

    SimulatedProfile laptop;
    laptop.name = "laptop-cpu";
    laptop.description = "x86 laptop CPU: AVX-512 blocks of 16 channels, medium cache";
    laptop.peak_flops_per_second = 1.5e11;
    laptop.half_saturation_flops = 2e6;
    laptop.bandwidth_bytes_per_second = 2.5e10;
    laptop.cache_bytes = 1.2e7;
    laptop.cache_penalty = 2.2;
    laptop.channel_block = 16;
    laptop.launch_seconds = 3e-6;
    laptop.static_watts = 9.0;
    laptop.joules_per_flop = 6e-11;
    laptop.joules_per_byte = 2.5e-10;
    laptop.step_overhead_seconds = 3e-4;
    out.push_back(laptop);
    return out;
  }();
  return profiles;
}

Result<SimulatedProfile> find_simulated_profile(const std::string& name) {
  std::string known;
  for (const auto& profile : simulated_profiles()) {
    if (profile.name == name) return profile;
    known += (known.empty() ? "" : ", ") + profile.name;
  }
  return make_error(ErrorCode::invalid_argument, fmt::format("no simulated profile \"{}\" (known: {})", name, known));
}

SimulatedDevice::SimulatedDevice(SimulatedProfile profile, std::uint64_t seed)
    : profile_(std::move(profile)), rng_(seed) {}

StepCost SimulatedDevice::layer_cost(const AnalyzedLayer& layer) const {
  const auto& p = profile_;
  double flops = layer.cost.forward_flops + layer.cost.backward_flops;
  if (layer.type == "conv2d") {
    flops *= padded_ratio(feature(layer, "in_channels"), p.channel_block) *
             padded_ratio(feature(layer, "out_channels"), p.channel_block);
  } else if (layer.type == "linear") {
    flops *= padded_ratio(feature(layer, "out_features"), p.channel_block);
  }
  // Forward writes activations and backward reads them and writes their gradients; weights
  // are read forward and backward and their gradients written.
  const double bytes = 3.0 * layer.cost.activation_bytes + 3.0 * layer.cost.parameter_bytes;
  const double utilisation = flops / (flops + p.half_saturation_flops);
  const double compute = flops > 0 ? flops / (p.peak_flops_per_second * std::max(utilisation, 1e-9)) : 0.0;
  const double working_set = layer.cost.activation_bytes + layer.cost.parameter_bytes;
  const double memory = bytes * (working_set > p.cache_bytes ? p.cache_penalty : 1.0) / p.bandwidth_bytes_per_second;
  StepCost cost;
  cost.seconds = std::max(compute, memory) + kernel_launches(layer) * p.launch_seconds;
  cost.joules = p.static_watts * cost.seconds + p.joules_per_flop * flops + p.joules_per_byte * bytes;
  return cost;
}

StepCost SimulatedDevice::loss_cost(const std::vector<AnalyzedLayer>& layers, const std::string& loss) const {
  double elements = 1.0;
  if (!layers.empty()) {
    for (auto dim : layers.back().output_shape) elements *= static_cast<double>(dim);
  }
  // The batch is folded into the last layer's activation bytes: recover it from there.
  const double batch_elements = layers.empty() ? 0.0 : layers.back().cost.activation_bytes / 4.0;
  const double per_element = loss == "cross_entropy" ? 12.0 : 4.0;  // log-softmax vs squared error
  const double flops = per_element * std::max(batch_elements, elements);
  StepCost cost;
  cost.seconds = flops / (profile_.peak_flops_per_second * 0.05) + 2 * profile_.launch_seconds;
  cost.joules = profile_.static_watts * cost.seconds + profile_.joules_per_flop * flops;
  return cost;
}

namespace {

// Passes over the parameters' bytes an optimizer's update makes: weights and gradients read,
// weights written (sgd), plus a read and a write per state tensor (momentum; Adam's two
// moments), plus AdamW's separate decay.
double parameter_passes(const std::string& optimizer) {
  if (optimizer == "sgd_momentum") return 5.0;
  if (optimizer == "rmsprop") return 6.0;
  if (optimizer == "adam") return 7.0;
  if (optimizer == "adamw") return 8.0;
  return 3.0;
}

}  // namespace

StepCost SimulatedDevice::overhead_cost(const std::vector<AnalyzedLayer>& layers, const std::string& optimizer) const {
  double parameter_bytes = 0.0;
  int tensors = 0;
  for (const auto& layer : layers) {
    parameter_bytes += layer.cost.parameter_bytes;
    tensors += layer.cost.parameters > 0 ? 2 : 0;
  }
  const double bytes = parameter_passes(optimizer) * parameter_bytes;
  StepCost cost;
  cost.seconds = profile_.step_overhead_seconds + bytes / profile_.bandwidth_bytes_per_second +
                 tensors * profile_.launch_seconds;
  cost.joules = profile_.static_watts * cost.seconds + profile_.joules_per_byte * bytes;
  return cost;
}

StepCost SimulatedDevice::step_cost(const std::vector<AnalyzedLayer>& layers, const std::string& loss,
                                    const std::string& optimizer) const {
  StepCost total = overhead_cost(layers, optimizer);
  const StepCost loss_part = loss_cost(layers, loss);
  total.joules += loss_part.joules;
  total.seconds += loss_part.seconds;
  for (const auto& layer : layers) {
    const StepCost part = layer_cost(layer);
    total.joules += part.joules;
    total.seconds += part.seconds;
  }
  return total;
}

StepCost SimulatedDevice::measure_step(const std::vector<AnalyzedLayer>& layers, const std::string& loss,
                                       const std::string& optimizer) {
  StepCost cost = step_cost(layers, loss, optimizer);
  std::normal_distribution<double> noise(0.0, profile_.noise_sigma);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  double factor = std::exp(noise(rng_));
  if (unit(rng_) < profile_.outlier_probability) factor *= 1.0 + profile_.outlier_scale * unit(rng_);
  cost.joules *= factor;
  cost.seconds *= factor;
  return cost;
}

}  // namespace joule::estimator
