#include "joule/estimator/whole_network.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace joule::estimator {

using nlohmann::json;

namespace {

// FNV-1a, 64 bits: the estimator builds without OpenSSL (a GPU node's worker-only build), and a
// signature tells architectures apart, it guards nothing.
std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (const unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

bool has_type(const std::vector<AnalyzedLayer>& layers, std::initializer_list<const char*> types) {
  return std::any_of(layers.begin(), layers.end(), [&](const AnalyzedLayer& layer) {
    return std::any_of(types.begin(), types.end(), [&](const char* type) { return layer.type == type; });
  });
}

double mean_of(const std::vector<double>& values) {
  double sum = 0.0;
  for (const double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

double std_of(const std::vector<double>& values, double mean) {
  if (values.size() < 2) return 0.0;
  double sum = 0.0;
  for (const double v : values) sum += (v - mean) * (v - mean);
  return std::sqrt(sum / static_cast<double>(values.size() - 1));
}

}  // namespace

std::string network_signature(const ModelSpec& model) {
  json spec = to_json(model);
  spec.erase("name");  // what a job calls its network does not change its cost
  return fmt::format("{:016x}", fnv1a(spec.dump()));
}

std::string network_family(const std::vector<AnalyzedLayer>& layers) {
  if (has_type(layers, {"multihead_attention", "transformer_encoder_layer"})) return "attention";
  if (has_type(layers, {"lstm", "gru"})) return "recurrent";
  if (has_type(layers, {"conv1d", "conv2d"})) return "convolutional";
  return "dense";
}

std::string whole_network_key(const std::string& signature, std::int64_t batch_size, const std::string& optimizer,
                              const KnobSetting* setting) {
  std::string key = fmt::format("{}/{}/{}", signature, batch_size, optimizer.empty() ? "sgd" : optimizer);
  if (setting) key += "@" + setting->key();
  return key;
}

std::string whole_network_key(const WholeNetworkSample& sample) {
  return whole_network_key(sample.signature, sample.batch_size, sample.optimizer,
                           sample.setting ? &*sample.setting : nullptr);
}

json to_json(const WholeNetworkSample& sample) {
  json out = {{"signature", sample.signature},
              {"family", sample.family},
              {"model", to_json(sample.model)},
              {"batch_size", sample.batch_size},
              {"optimizer", sample.optimizer},
              {"joules_per_step", sample.joules_per_step},
              {"seconds_per_step", sample.seconds_per_step},
              {"joules_spread", sample.joules_spread},
              {"seconds_spread", sample.seconds_spread},
              {"measured_ms", sample.measured_ms}};
  if (sample.setting) out["setting"] = to_json(*sample.setting);
  return out;
}

Result<WholeNetworkSample> whole_network_sample_from_json(const json& in, const std::string& pointer) {
  if (!in.is_object()) return make_error(ErrorCode::invalid_argument, "not an object", pointer);
  WholeNetworkSample out;
  auto model = parse_model_spec(in.value("model", json()), pointer + "/model");
  if (!model) return model.error();
  out.model = std::move(model).value();
  out.signature = network_signature(out.model);
  try {
    out.batch_size = in.at("batch_size").get<std::int64_t>();
    out.optimizer = in.value("optimizer", "sgd");
    out.joules_per_step = in.at("joules_per_step").get<double>();
    out.seconds_per_step = in.at("seconds_per_step").get<double>();
    out.joules_spread = in.value("joules_spread", 0.0);
    out.seconds_spread = in.value("seconds_spread", 0.0);
    out.measured_ms = in.value("measured_ms", std::int64_t{0});
  } catch (const json::exception& error) {
    return make_error(ErrorCode::invalid_argument, fmt::format("not a whole-network sample: {}", error.what()),
                      pointer);
  }
  if (out.batch_size < 1) return make_error(ErrorCode::invalid_argument, "must be at least 1", pointer + "/batch_size");
  if (const auto setting = in.find("setting"); setting != in.end() && !setting->is_null()) {
    auto parsed = knob_setting_from_json(*setting, pointer + "/setting");
    if (!parsed) return parsed.error();
    out.setting = std::move(parsed).value();
  }
  if (!(out.joules_per_step > 0.0) || !std::isfinite(out.joules_per_step))
    return make_error(ErrorCode::invalid_argument, "must be a positive number", pointer + "/joules_per_step");
  if (!(out.seconds_per_step > 0.0) || !std::isfinite(out.seconds_per_step))
    return make_error(ErrorCode::invalid_argument, "must be a positive number", pointer + "/seconds_per_step");
  auto layers = analyze_model(out.model, out.batch_size, pointer + "/model");
  if (!layers) return layers.error();
  out.family = network_family(*layers);
  return out;
}

std::vector<std::pair<std::string, WholeNetworkGap>> learn_gaps(const std::vector<GapReading>& readings) {
  std::vector<std::string> families;
  for (const auto& reading : readings)
    if (std::find(families.begin(), families.end(), reading.family) == families.end())
      families.push_back(reading.family);
  std::sort(families.begin(), families.end());
  std::vector<std::pair<std::string, WholeNetworkGap>> out;
  for (const auto& family : families) {
    std::vector<double> joules, seconds;
    for (const auto& reading : readings) {
      if (reading.family != family) continue;
      joules.push_back(reading.log_joules_ratio);
      seconds.push_back(reading.log_seconds_ratio);
    }
    if (joules.size() < kGapMinSamples) continue;
    WholeNetworkGap gap;
    gap.samples = joules.size();
    gap.log_joules_mean = mean_of(joules);
    gap.log_joules_std = std_of(joules, gap.log_joules_mean);
    gap.log_seconds_mean = mean_of(seconds);
    gap.log_seconds_std = std_of(seconds, gap.log_seconds_mean);
    out.emplace_back(family, gap);
  }
  return out;
}

std::optional<PlannedWholeNetwork> plan_whole_network(const std::vector<WholeNetworkCandidate>& candidates,
                                                      const std::vector<std::string>& done, int measuring_steps,
                                                      double max_seconds) {
  constexpr double kFlopsPerReading = 2e9;  // as plan_cost counts a probe network
  constexpr double kWorkerStart = 0.5;
  std::optional<PlannedWholeNetwork> best;
  double best_score = 0.0;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const auto& candidate = candidates[i];
    const std::string key = whole_network_key(candidate.signature, candidate.batch_size, candidate.optimizer,
                                              candidate.setting ? &*candidate.setting : nullptr);
    if (std::find(done.begin(), done.end(), key) != done.end()) continue;
    if (candidate.seconds_per_step * measuring_steps > max_seconds) continue;
    const double reduction = candidate.share * (candidate.relative_std - candidate.measured_std);
    if (!(reduction > 0.0)) continue;
    const double cost = kWorkerStart + std::max(1.0, candidate.flops_per_step / kFlopsPerReading);
    const double score = reduction / std::sqrt(cost);
    if (!best || score > best_score) {
      best = PlannedWholeNetwork{i, reduction, cost};
      best_score = score;
    }
  }
  return best;
}

}  // namespace joule::estimator
