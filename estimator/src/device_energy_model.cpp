#include "joule/estimator/device_energy_model.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "joule/estimator/layer_analysis.hpp"

namespace joule::estimator {
namespace {

using nlohmann::json;

Uncertain log_normal(double mu, double variance) {
  // Far from the data the latent variance is large and the log-normal mean exp(μ + σ²/2) runs
  // away; there the median exp(μ) is the point estimate and the std says how unsure it is.
  const double mean = std::sqrt(variance) > kExtrapolationSigma ? std::exp(mu) : std::exp(mu + variance / 2.0);
  // Past σ = 3 (a factor of 20 either way) the spread says only "unknown"; capping it keeps
  // sums finite, and such layers are flagged as extrapolated.
  const double capped = std::min(variance, 9.0);
  const double var = std::expm1(capped) * std::exp(2.0 * mu + capped);
  return Uncertain{mean, std::sqrt(std::max(var, 0.0))};
}

json to_json(const Uncertain& value) { return {{"mean", value.mean}, {"std", value.std}}; }

// Channel-like features that hardware processes in blocks.
constexpr const char* kBlockedFeatures[] = {"in_channels", "out_channels", "in_features", "out_features",
                                            "hidden_size", "embed_dim", "d_model"};

// How strongly the prior's slope is pulled towards 1, in units of Σ(log work − mean)²: with
// two or three samples a few-fold apart the slope stays near proportional; many samples spread
// over orders of magnitude decide it themselves.
constexpr double kSlopePrior = 1.0;

}  // namespace

double layer_work(const LayerCost& cost) {
  return cost.forward_flops + cost.backward_flops + kFlopsPerByte * (cost.activation_bytes + cost.parameter_bytes);
}

json to_json(const Estimate& estimate) { return to_json(estimate, true); }

json to_json(const Estimate& estimate, bool with_layers) {
  static const std::vector<LayerEstimate> none;
  json layers = json::array();
  for (const auto& layer : with_layers ? estimate.layers : none) {
    layers.push_back({{"index", layer.index},
                      {"type", layer.type},
                      {"model", layer.key},
                      {"joules_per_step", to_json(layer.joules_per_step)},
                      {"seconds_per_step", to_json(layer.seconds_per_step)},
                      {"flops_per_step", layer.flops_per_step},
                      {"extrapolated", layer.extrapolated},
                      {"sparse", layer.sparse}});
  }
  json out = {{"device", estimate.device},
              {"method", estimate.method},
              {"source", estimate.source},
              {"steps", estimate.steps},
              {"epochs", estimate.epochs},
              {"joules", to_json(estimate.joules)},
              {"seconds", to_json(estimate.seconds)},
              {"joules_per_step", to_json(estimate.joules_per_step)},
              {"layers", layers},
              {"baseline",
               {{"method", "flops"},
                {"joules", estimate.flops_baseline_joules},
                {"joules_per_flop", estimate.joules_per_flop}}},
              {"warnings", estimate.warnings}};
  if (!estimate.environment.empty()) out["environment"] = estimate.environment;
  if (estimate.runtime) {
    const auto& r = *estimate.runtime;
    out["runtime"] = {{"runtime", r.runtime},
                      {"modules", r.modules},
                      {"kinds_read", r.kinds_read},
                      {"start_joules", to_json(r.start_joules)},
                      {"start_seconds", to_json(r.start_seconds)},
                      {"step_joules", to_json(r.step_joules)},
                      {"step_seconds", to_json(r.step_seconds)}};
  }
  if (estimate.whole) {
    const auto& w = *estimate.whole;
    out["whole"] = {{"basis", w.basis},
                    {"family", w.family},
                    {"layers_joules_per_step", w.layers_joules_per_step},
                    {"layers_seconds_per_step", w.layers_seconds_per_step},
                    {"joules_ratio", w.joules_ratio},
                    {"seconds_ratio", w.seconds_ratio},
                    {"samples", w.samples}};
    if (w.basis == "measured") out["whole"]["measured_ms"] = w.measured_ms;
  }
  if (estimate.data_parallel) {
    const auto& d = *estimate.data_parallel;
    out["data_parallel"] = {{"gpus", d.gpus},
                            {"one_gpu_joules", to_json(d.one_gpu_joules)},
                            {"one_gpu_seconds", to_json(d.one_gpu_seconds)},
                            {"joules_overhead", to_json(d.joules_overhead)},
                            {"seconds_overhead", to_json(d.seconds_overhead)},
                            {"jobs", d.jobs},
                            {"basis", d.basis}};
  }
  if (!estimate.settings.empty()) {
    json settings = json::array();
    for (const auto& line : estimate.settings)
      settings.push_back({{"knob", line.setting.knob},
                          {"value", line.setting.value},
                          {"label", line.setting.label},
                          {"basis", line.basis},
                          {"joules_ratio", line.joules_ratio},
                          {"joules_log_std", line.joules_log_std},
                          {"seconds_ratio", line.seconds_ratio},
                          {"seconds_log_std", line.seconds_log_std},
                          {"samples", line.samples},
                          {"joules", to_json(line.joules)},
                          {"seconds", to_json(line.seconds)}});
    out["settings"] = std::move(settings);
  }
  return out;
}

DeviceEnergyModel::DeviceEnergyModel(std::string device, std::string source)
    : device_(std::move(device)), source_(std::move(source)) {}

std::map<std::string, double> DeviceEnergyModel::with_padding(const std::map<std::string, double>& features) {
  std::map<std::string, double> out = features;
  for (const char* name : kBlockedFeatures) {
    const auto it = features.find(name);
    if (it == features.end()) continue;
    out[std::string(name) + "_pad8"] = std::ceil(it->second / 8.0) * 8.0;
    out[std::string(name) + "_pad16"] = std::ceil(it->second / 16.0) * 16.0;
  }
  return out;
}

std::vector<std::string> DeviceEnergyModel::feature_names(const std::map<std::string, double>& features) {
  std::vector<std::string> names;
  for (const auto& [name, value] : with_padding(features)) names.push_back(name);
  return names;
}

Eigen::VectorXd DeviceEnergyModel::feature_vector(const std::map<std::string, double>& features,
                                                  const std::vector<std::string>& names) {
  return feature_vector(features, names, std::nullopt);
}

// The hot path of estimate(): no map is copied. A name is a feature, "batch_size", or a feature
// with a "_pad8"/"_pad16" suffix (the value rounded up to that block).
Eigen::VectorXd DeviceEnergyModel::feature_vector(const std::map<std::string, double>& features,
                                                  const std::vector<std::string>& names,
                                                  std::optional<double> batch_size) {
  Eigen::VectorXd x(static_cast<Eigen::Index>(names.size()));
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    double value = 0.0;
    if (batch_size && name == "batch_size") {
      value = *batch_size;
    } else if (auto it = features.find(name); it != features.end()) {
      value = it->second;
    } else {
      for (const double block : {8.0, 16.0}) {
        const std::string suffix = block == 8.0 ? "_pad8" : "_pad16";
        if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
          if (auto base = features.find(name.substr(0, name.size() - suffix.size())); base != features.end())
            value = std::ceil(base->second / block) * block;
        }
      }
    }
    x[static_cast<Eigen::Index>(i)] = std::log1p(std::max(value, 0.0));
  }
  return x;
}

std::uint64_t DeviceEnergyModel::next_revision() {
  // Atomic: a refit fits a copy of the model on a thread of its own.
  static std::atomic<std::uint64_t> counter{0};
  return ++counter;
}

bool DeviceEnergyModel::add_sample(const LayerSample& sample) {
  revision_ = next_revision();
  if (!(sample.joules_per_step > 0.0) || !(sample.seconds_per_step > 0.0)) {
    ++dropped_;
    const auto it = models_.find(sample.key.name());
    if (it == models_.end() || it->second.x.empty()) ++unresolved_[sample.key.name()];
    return false;
  }
  unresolved_.erase(sample.key.name());
  KeyModel& model = models_[sample.key.name()];
  if (model.names.empty()) model.names = feature_names(sample.features);
  const bool work_known = model.x.empty() || model.work_known();
  model.x.push_back(feature_vector(sample.features, model.names));
  model.log_joules.push_back(std::log(sample.joules_per_step));
  model.log_seconds.push_back(std::log(sample.seconds_per_step));
  const double work = layer_work(sample.cost);
  if (work_known && work > 0.0) {
    model.log_work.push_back(std::log(work));
  } else {
    model.log_work.clear();  // one sample without its work: no prior for this key
    model.energy_prior.reset();
    model.time_prior.reset();
  }
  return true;
}

DeviceEnergyModel::LogLinear DeviceEnergyModel::fit_prior(const std::vector<double>& log_work,
                                                          const std::vector<double>& log_y) {
  // min Σ (y − a − b u)² + λ (b − 1)²: centring u separates a from b.
  const auto n = static_cast<double>(log_work.size());
  double u_mean = 0.0, y_mean = 0.0;
  for (std::size_t i = 0; i < log_work.size(); ++i) {
    u_mean += log_work[i] / n;
    y_mean += log_y[i] / n;
  }
  double suu = 0.0, suy = 0.0;
  for (std::size_t i = 0; i < log_work.size(); ++i) {
    suu += (log_work[i] - u_mean) * (log_work[i] - u_mean);
    suy += (log_work[i] - u_mean) * (log_y[i] - y_mean);
  }
  LogLinear prior;
  // A layer never costs less for more work, nor more than quadratically.
  prior.slope = std::clamp((suy + kSlopePrior) / (suu + kSlopePrior), 0.0, 2.0);
  prior.intercept = y_mean - prior.slope * u_mean;
  for (std::size_t i = 0; i < log_work.size(); ++i) {
    const double r = log_y[i] - prior(log_work[i]);
    prior.residual_variance += r * r / n;
  }
  return prior;
}

namespace {

// The spread of a prior used alone: kSparseSigma, or more where its samples already disagree.
double sparse_variance(double residual_variance) { return kSparseSigma * kSparseSigma + residual_variance; }

}  // namespace

DeviceEnergyModel::LogPrediction DeviceEnergyModel::predict(const std::optional<LogLinear>& prior,
                                                            const std::optional<GaussianProcess>& gp,
                                                            const Eigen::VectorXd& x, double log_work) {
  const double mean = prior ? (*prior)(log_work) : 0.0;
  if (gp) {
    const auto p = gp->predict(x);
    return {mean + p.mean, p.variance, p.variance_with_noise, false};
  }
  const double variance = sparse_variance(prior->residual_variance);
  return {mean, variance, variance, true};
}

void DeviceEnergyModel::add_network(double flops_per_step, double joules_per_step) {
  if (!(flops_per_step > 0.0) || !(joules_per_step > 0.0)) return;
  revision_ = next_revision();
  flops_sum_xx_ += flops_per_step * flops_per_step;
  flops_sum_xy_ += flops_per_step * joules_per_step;
}

Status DeviceEnergyModel::fit(const GpFitOptions& options, std::size_t min_samples) {
  revision_ = next_revision();
  for (auto& [name, model] : models_) {
    if (model.work_known()) {
      model.energy_prior = fit_prior(model.log_work, model.log_joules);
      model.time_prior = fit_prior(model.log_work, model.log_seconds);
    }
    if (model.x.size() < min_samples) continue;
    const auto n = static_cast<Eigen::Index>(model.x.size());
    Eigen::MatrixXd X(n, static_cast<Eigen::Index>(model.names.size()));
    for (Eigen::Index i = 0; i < n; ++i) X.row(i) = model.x[static_cast<std::size_t>(i)].transpose();
    Eigen::VectorXd energy = Eigen::Map<const Eigen::VectorXd>(model.log_joules.data(), n);
    Eigen::VectorXd time = Eigen::Map<const Eigen::VectorXd>(model.log_seconds.data(), n);
    if (model.energy_prior) {
      for (Eigen::Index i = 0; i < n; ++i) {
        const double u = model.log_work[static_cast<std::size_t>(i)];
        energy[i] -= (*model.energy_prior)(u);
        time[i] -= (*model.time_prior)(u);
      }
    }
    GaussianProcess energy_gp;
    if (auto s = energy_gp.fit(X, energy, options); !s)
      return make_error(s.error().code, fmt::format("{}: energy model: {}", name, s.error().message));
    GaussianProcess time_gp;
    if (auto s = time_gp.fit(X, time, options); !s)
      return make_error(s.error().code, fmt::format("{}: time model: {}", name, s.error().message));
    model.energy = std::move(energy_gp);
    model.time = std::move(time_gp);
  }
  learn_whole_network_gaps();
  return {};
}

bool DeviceEnergyModel::add_whole_network(WholeNetworkSample sample) {
  if (!(sample.joules_per_step > 0.0) || !(sample.seconds_per_step > 0.0) || sample.signature.empty()) return false;
  revision_ = next_revision();
  const std::string key = whole_network_key(sample);
  const bool at_setting = sample.setting.has_value();
  bool replaced = false;
  for (auto& kept : wholes_) {
    if (whole_network_key(kept) == key) {
      kept = std::move(sample);
      replaced = true;
      break;
    }
  }
  if (!replaced) {
    const std::string group = sample.setting ? sample.setting->key() : "";
    wholes_.push_back(std::move(sample));
    // Bounded: a long campaign meets ever new networks, and the snapshot (stored, sent by agents)
    // carries every one with its spec. The oldest measurement of its setting goes first.
    auto in_group = [&](const WholeNetworkSample& s) { return (s.setting ? s.setting->key() : "") == group; };
    if (static_cast<std::size_t>(std::count_if(wholes_.begin(), wholes_.end(), in_group)) > kMaxWholeNetworks) {
      auto oldest = wholes_.end();
      for (auto it = wholes_.begin(); it != wholes_.end(); ++it)
        if (in_group(*it) && (oldest == wholes_.end() || it->measured_ms < oldest->measured_ms)) oldest = it;
      wholes_.erase(oldest);
    }
  }
  // A setting's ratios rest on the measurement at the defaults too: either kind moves them.
  if (at_setting || !settings_.empty()) learn_settings();
  return true;
}

void DeviceEnergyModel::learn_settings() {
  settings_.clear();
  std::map<std::string, std::vector<KnobSample>> samples;
  // Each network is analysed once, however many settings it was measured at (on the loop, at
  // every whole measurement added).
  std::map<std::string, std::optional<NetworkFeatures>> features_of;
  for (const auto& at : wholes_) {
    if (!at.setting) continue;
    SettingModel& model = settings_[at.setting->key()];
    model.setting = *at.setting;
    const WholeNetworkSample* base = whole_network(at.signature, at.batch_size, at.optimizer);
    if (!base) continue;
    auto [features, fresh] = features_of.try_emplace(whole_network_key(at.signature, at.batch_size, at.optimizer));
    if (fresh)
      if (auto layers = analyze_model(at.model, at.batch_size)) features->second = network_features(*layers);
    if (!features->second) continue;
    KnobSample sample;
    sample.features = *features->second;
    sample.features.watts = base->joules_per_step / base->seconds_per_step;
    sample.time_ratio = at.seconds_per_step / base->seconds_per_step;
    sample.energy_ratio = at.joules_per_step / base->joules_per_step;
    samples[at.setting->key()].push_back(sample);
    ++model.networks;
  }
  for (auto& [key, model] : settings_) {
    const auto& measured = samples[key];
    if (measured.size() < kMinResponseNetworks) continue;
    auto response = KnobResponse::fit(
        measured, model.setting.is_power_limit() ? std::optional<double>(model.setting.value) : std::nullopt);
    if (response) model.response = std::move(response).value();
  }
}

void DeviceEnergyModel::estimate_settings(const PreparedNetwork& network, const TrainingConfig& training,
                                          Estimate& out) const {
  if (settings_.empty() || !(out.joules.mean > 0.0) || !(out.seconds.mean > 0.0) || out.steps <= 0) return;
  const WholeNetworkSample* base = whole_network(network.signature(), training.batch_size, training.optimizer);
  std::optional<NetworkFeatures> features;
  for (const auto& [key, model] : settings_) {
    SettingLine line;
    line.setting = model.setting;
    const WholeNetworkSample* at =
        base ? whole_network(network.signature(), training.batch_size, training.optimizer, &model.setting) : nullptr;
    if (at) {
      // Both readings' own spreads, and the device's drift between two readings of one network
      // (each moved by it): the ratio is of readings taken minutes apart.
      line.basis = "measured";
      line.samples = 1;
      line.joules_ratio = at->joules_per_step / base->joules_per_step;
      line.seconds_ratio = at->seconds_per_step / base->seconds_per_step;
      const double drift = std::sqrt(2.0) * speed_spread_;
      line.joules_log_std = std::hypot(at->joules_spread / 2.0, base->joules_spread / 2.0, drift);
      line.seconds_log_std = std::hypot(at->seconds_spread / 2.0, base->seconds_spread / 2.0, drift);
    } else if (model.response) {
      if (!features) {
        // Its power at the defaults, as the responses were fitted: joules over seconds.
        features = network_features(network.layers());
        features->watts = out.joules.mean / out.seconds.mean;
      }
      const RatioPrediction ratio = model.response->predict(*features);
      line.basis = "response";
      line.samples = model.response->samples();
      line.joules_ratio = ratio.energy_ratio;
      line.seconds_ratio = ratio.time_ratio;
      line.joules_log_std = std::max(kResponseFloorSigma, std::hypot(ratio.energy_log_std, speed_spread_));
      line.seconds_log_std = std::max(kResponseFloorSigma, std::hypot(ratio.time_log_std, speed_spread_));
    } else {
      continue;
    }
    line.joules_log_std = std::max(kSettingFloorSigma, line.joules_log_std);
    line.seconds_log_std = std::max(kSettingFloorSigma, line.seconds_log_std);
    // The estimate's own spread stays (the job's cost at the defaults is as unsure as it was),
    // beside the ratio's.
    const double joules = out.joules.mean * line.joules_ratio;
    const double seconds = out.seconds.mean * line.seconds_ratio;
    line.joules = {joules, joules * std::hypot(out.joules.std / out.joules.mean, line.joules_log_std)};
    line.seconds = {seconds, seconds * std::hypot(out.seconds.std / out.seconds.mean, line.seconds_log_std)};
    out.settings.push_back(std::move(line));
  }
}

void DeviceEnergyModel::set_speed_spread(double log_sigma) {
  const double spread = std::isfinite(log_sigma) ? std::clamp(log_sigma, 0.0, 5.0) : 0.0;
  if (spread == speed_spread_) return;
  speed_spread_ = spread;
  revision_ = next_revision();
}

const WholeNetworkSample* DeviceEnergyModel::whole_network(const std::string& signature, std::int64_t batch_size,
                                                           const std::string& optimizer,
                                                           const KnobSetting* setting) const {
  if (signature.empty()) return nullptr;
  const std::string wanted = optimizer.empty() ? "sgd" : optimizer;
  for (const auto& sample : wholes_)
    if (sample.signature == signature && sample.batch_size == batch_size && sample.optimizer == wanted &&
        sample.setting.has_value() == (setting != nullptr) && (!setting || *sample.setting == *setting))
      return &sample;
  return nullptr;
}

void DeviceEnergyModel::learn_whole_network_gaps() {
  // Each network measured whole against what its layers sum to under the layer models just
  // fitted: the gap moves as the layer models learn, so it is learnt again at every fit.
  std::vector<GapReading> readings;
  for (const auto& sample : wholes_) {
    if (sample.setting) continue;  // what a setting does is not what the network costs
    auto layers = analyze_model(sample.model, sample.batch_size);
    if (!layers) continue;
    const TrainingConfig one_step{sample.batch_size, 1, sample.batch_size, sample.optimizer, std::nullopt};
    auto raw = estimate_with(PreparedNetwork(*layers, sample.batch_size), one_step, "", false);
    if (!raw || !(raw->joules_per_step.mean > 0.0) || !(raw->seconds.mean > 0.0)) continue;
    readings.push_back({network_family(*layers), std::log(sample.joules_per_step / raw->joules_per_step.mean),
                        std::log(sample.seconds_per_step / raw->seconds.mean)});
  }
  gaps_.clear();
  for (auto& [family, gap] : learn_gaps(readings)) gaps_.emplace(family, gap);
}

bool DeviceEnergyModel::stands_in(const std::string& key) const {
  const auto it = unresolved_.find(key);
  return it != unresolved_.end() && it->second >= kUnresolvedProbes;
}

std::optional<DeviceEnergyModel::LogPrediction> DeviceEnergyModel::pooled_prediction(bool energy,
                                                                                     double log_work) const {
  std::vector<double> work, y;
  for (const auto& [name, model] : models_) {
    if (!model.work_known()) continue;
    work.insert(work.end(), model.log_work.begin(), model.log_work.end());
    const auto& values = energy ? model.log_joules : model.log_seconds;
    y.insert(y.end(), values.begin(), values.end());
  }
  if (work.empty()) return std::nullopt;
  const LogLinear prior = fit_prior(work, y);
  const double variance = sparse_variance(prior.residual_variance);
  return LogPrediction{prior(log_work), variance, variance, true};
}

double DeviceEnergyModel::uncertainty(const LayerKey& key, const AnalyzedLayer& layer, std::int64_t batch_size) const {
  const auto it = models_.find(key.name());
  if (it == models_.end() || !it->second.usable()) {
    // Probed enough that more of the same would be dropped too: as sure as the pooled prior.
    if (stands_in(key.name()))
      if (const auto pooled = pooled_prediction(true, std::log(std::max(layer_work(layer.cost), 1.0))))
        return std::sqrt(pooled->variance);
    return std::numeric_limits<double>::infinity();
  }
  auto features = layer.features;
  features["batch_size"] = static_cast<double>(batch_size);
  const auto x = feature_vector(features, it->second.names);
  const auto& km = it->second;
  return std::sqrt(predict(km.energy_prior, km.energy, x, std::log(std::max(layer_work(layer.cost), 1.0))).variance);
}

Result<Estimate> DeviceEnergyModel::estimate(const ModelSpec& model, const TrainingConfig& training,
                                             const std::string& runtime) const {
  auto layers = analyze_model(model, training.batch_size);
  if (!layers) return layers.error();
  return estimate(PreparedNetwork(*layers, training.batch_size, network_signature(model)), training, runtime);
}

void DeviceEnergyModel::set_runtime(RuntimeCost cost) {
  const std::string name = cost.runtime;
  runtimes_[name] = std::move(cost);
  revision_ = next_revision();
}

PreparedNetwork::PreparedNetwork(const std::vector<AnalyzedLayer>& layers, std::int64_t batch_size,
                                 std::string signature)
    : layers_(layers),
      batch_size_(batch_size),
      signature_(std::move(signature)),
      family_(network_family(layers)),
      keys_(layer_keys(layers)),
      features_(layers.size()) {
  key_names_.reserve(keys_.size());
  for (std::size_t i = 0; i < layers.size(); ++i) {
    key_names_.push_back(keys_[i].name());
    free_.push_back(keys_[i].position != LayerPosition::output && is_free_layer(layers[i]));
    log_work_.push_back(std::log(std::max(layer_work(layers[i].cost), 1.0)));
  }
}

const Eigen::VectorXd& PreparedNetwork::features(std::size_t i, const std::vector<std::string>& names) const {
  auto& made = features_[i];
  for (const auto& [seen, x] : made)
    if (seen == names) return x;
  made.emplace_back(names,
                    DeviceEnergyModel::feature_vector(layers_[i].features, names, static_cast<double>(batch_size_)));
  return made.back().second;
}

Result<Estimate> DeviceEnergyModel::estimate(const std::vector<AnalyzedLayer>& analyzed, const TrainingConfig& training,
                                             const std::string& runtime) const {
  return estimate(PreparedNetwork(analyzed, training.batch_size), training, runtime);
}

Result<Estimate> DeviceEnergyModel::estimate(const PreparedNetwork& network, const TrainingConfig& training,
                                             const std::string& runtime) const {
  return estimate_with(network, training, runtime, true);
}

Result<Estimate> DeviceEnergyModel::estimate_with(const PreparedNetwork& network, const TrainingConfig& training,
                                                  const std::string& runtime, bool whole) const {
  if (network.batch_size() != training.batch_size)  // prepared for another batch: its features are not these
    return estimate_with(PreparedNetwork(network.layers(), training.batch_size, network.signature()), training, runtime,
                         whole);
  const auto* layers = &network.layers();
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < layers->size(); ++i) {
    if (network.free(i)) continue;
    const std::string& name = network.key_name(i);
    const auto it = models_.find(name);
    if ((it == models_.end() || !it->second.usable()) && !(stands_in(name) && !models_.empty()) &&
        std::find(missing.begin(), missing.end(), name) == missing.end())
      missing.push_back(name);
  }
  // Probes train with sgd: another optimizer adds its own line, from its own model.
  const bool other_optimizer = !training.optimizer.empty() && training.optimizer != "sgd";
  const std::string optimizer_key =
      other_optimizer ? LayerKey{optimizer_kind(training.optimizer), LayerPosition::output}.name() : "";
  if (other_optimizer) {
    const auto it = models_.find(optimizer_key);
    if (it == models_.end() || !it->second.usable()) missing.push_back(optimizer_key);
  }
  if (!missing.empty()) {
    std::string names;
    for (const auto& name : missing) names += (names.empty() ? "" : ", ") + name;
    return make_error(ErrorCode::unavailable,
                      fmt::format("device {} has no energy model yet for {}; probe it (POST /v1/probes) or wait for "
                                  "background probing to cover these layers",
                                  device_, names));
  }
  Estimate out;
  out.device = device_;
  out.source = source_;
  out.environment = environment_;
  out.steps = steps_of(training);
  out.epochs = training.epochs;
  double step_var = 0.0, seconds_var = 0.0, seconds_mean = 0.0, flops = 0.0;
  struct Predicted {
    const KeyModel* model;
    Eigen::VectorXd x;
    double log_work;
    LogPrediction energy;
    LogPrediction time;
  };
  std::vector<std::string> sparse_keys;
  std::vector<std::string> unresolved_keys;
  std::vector<Predicted> predictions;  // distinct layers of this network: a handful
  // A line's share of the step from its predictions; the lines' means and variances add up.
  auto add_line = [&](LayerEstimate line, const LogPrediction& energy, const LogPrediction& time) -> LayerEstimate& {
    // A job's step is a new observation, not the latent mean: the noise a probe sees (run to
    // run, process to process) belongs in its spread. Without it, kinds whose noise fit sits
    // at its lower bound claimed ±0.1 % and 2σ held for 44 % of jobs (bench/probe_accuracy).
    line.joules_per_step = log_normal(energy.mean, energy.variance_with_noise);
    line.seconds_per_step = log_normal(time.mean, time.variance_with_noise);
    line.extrapolated = std::sqrt(energy.variance) > kExtrapolationSigma;
    line.sparse = energy.sparse;
    if (line.sparse && std::find(sparse_keys.begin(), sparse_keys.end(), line.key) == sparse_keys.end())
      sparse_keys.push_back(line.key);
    out.joules_per_step.mean += line.joules_per_step.mean;
    step_var += line.joules_per_step.std * line.joules_per_step.std;
    seconds_mean += line.seconds_per_step.mean;
    seconds_var += line.seconds_per_step.std * line.seconds_per_step.std;
    flops += line.flops_per_step;
    out.layers.push_back(std::move(line));
    return out.layers.back();
  };
  for (std::size_t i = 0; i < layers->size(); ++i) {
    const auto& layer = (*layers)[i];
    if (network.free(i)) {
      LayerEstimate free;
      free.index = layer.index;
      free.type = layer.type;
      free.key = network.key_name(i);
      out.layers.push_back(std::move(free));  // a view: no work of its own
      continue;
    }
    std::string key_name = network.key_name(i);
    const double log_work = network.log_work(i);
    const auto own = models_.find(key_name);
    if (own == models_.end() || !own->second.usable()) {
      // An unresolved kind (stands_in): its cost from its work at the device's pooled rate.
      const auto energy = pooled_prediction(true, log_work);
      const auto time = pooled_prediction(false, log_work);
      if (!energy || !time) return make_error(ErrorCode::unavailable, fmt::format("no model for {}", key_name));
      if (std::find(unresolved_keys.begin(), unresolved_keys.end(), key_name) == unresolved_keys.end())
        unresolved_keys.push_back(key_name);
      LayerEstimate line;
      line.index = layer.index;
      line.type = layer.type;
      line.key = std::move(key_name);
      line.flops_per_step = layer.cost.forward_flops + layer.cost.backward_flops;
      add_line(std::move(line), *energy, *time);
      continue;
    }
    const auto& km = own->second;
    const Eigen::VectorXd& x = network.features(i, km.names);
    // Deep networks repeat the same block: predict each distinct (model, input) once.
    auto cached = std::find_if(predictions.begin(), predictions.end(), [&](const Predicted& p) {
      return p.model == &km && p.x == x && p.log_work == log_work;
    });
    if (cached == predictions.end()) {
      predictions.push_back(Predicted{&km, x, log_work, predict(km.energy_prior, km.energy, x, log_work),
                                      predict(km.time_prior, km.time, x, log_work)});
      cached = std::prev(predictions.end());
    }
    LayerEstimate line;
    line.index = layer.index;
    line.type = layer.type;
    line.key = std::move(key_name);
    line.flops_per_step = layer.cost.forward_flops + layer.cost.backward_flops;
    if (add_line(std::move(line), cached->energy, cached->time).extrapolated) {
      out.warnings.push_back(fmt::format("layer {} {}: far from every probed configuration; its share is uncertain",
                                         layer.index, layer.type));
    }
  }
  if (other_optimizer) {
    const AnalyzedLayer step = optimizer_step(total_cost(*layers).parameters);
    const auto& km = models_.at(optimizer_key);
    const Eigen::VectorXd x = feature_vector(step.features, km.names, std::nullopt);
    const double log_work = std::log(std::max(layer_work(step.cost), 1.0));
    LayerEstimate line;
    line.index = layers->size();  // after the layers: the step's update, not a layer
    line.type = "optimizer";
    line.key = optimizer_key;
    add_line(std::move(line), predict(km.energy_prior, km.energy, x, log_work),
             predict(km.time_prior, km.time, x, log_work));
  }
  for (const auto& key : unresolved_keys) {
    out.warnings.push_back(
        fmt::format("{}: its {} probes all came out at or below zero after subtraction (it costs less than "
                    "the meter resolves beside the rest of the probe); estimated from its work at the device's "
                    "joules per unit of work over every probed kind, ±{:.0f} % or more at one σ",
                    key, unresolved_.at(key), 100.0 * std::expm1(kSparseSigma)));
  }
  for (const auto& key : sparse_keys) {
    if (std::find(unresolved_keys.begin(), unresolved_keys.end(), key) != unresolved_keys.end())
      continue;  // said above
    out.warnings.push_back(
        fmt::format("{}: {} probe sample(s), too few for its GP; estimated from the layers' work "
                    "(FLOPs and bytes) scaled by them, ±{:.0f} % at one σ",
                    key, models_.at(key).x.size(), 100.0 * std::expm1(kSparseSigma)));
  }
  // The layers' spreads are independent and shrink in the sum; what the sum itself misses (a
  // real job's step is not exactly its probed layers') is shared by every layer: one more term.
  double structural_joules = kStructuralSigma;
  double structural_seconds = kStructuralSigma;
  if (whole && out.joules_per_step.mean > 0.0 && seconds_mean > 0.0) {
    // The network measured whole is its own best estimate; else its family's gap scales the sum.
    WholeNetworkLine line;
    line.family = network.family();
    line.layers_joules_per_step = out.joules_per_step.mean;
    line.layers_seconds_per_step = seconds_mean;
    std::optional<double> joules_sigma, seconds_sigma;
    if (const auto* measured = whole_network(network.signature(), training.batch_size, training.optimizer)) {
      line.basis = "measured";
      line.joules_ratio = measured->joules_per_step / out.joules_per_step.mean;
      line.seconds_ratio = measured->seconds_per_step / seconds_mean;
      line.samples = 1;
      line.measured_ms = measured->measured_ms;
      // Its own readings' spread (half the range about the median), and never less than the
      // machine's drift between the measurement and the job.
      joules_sigma = std::max(kMeasuredWholeSigma, measured->joules_spread / 2.0);
      seconds_sigma = std::max(kMeasuredWholeSigma, measured->seconds_spread / 2.0);
    } else if (const auto gap = gaps_.find(network.family()); gap != gaps_.end()) {
      const WholeNetworkGap& g = gap->second;
      line.basis = "family-gap";
      line.joules_ratio = std::exp(g.log_joules_mean);
      line.seconds_ratio = std::exp(g.log_seconds_mean);
      line.samples = g.samples;
      // A new network of the family lies about the family's mean as its measured ones did,
      // and the mean of a few is itself uncertain: σ·√(1 + 1/n). The sum's own structural
      // term stays the floor: a gap learnt from few networks cannot claim more.
      const double inflate = std::sqrt(1.0 + 1.0 / static_cast<double>(g.samples));
      structural_joules = std::max(kStructuralSigma, std::max(kGapFloorSigma, g.log_joules_std) * inflate);
      structural_seconds = std::max(kStructuralSigma, std::max(kGapFloorSigma, g.log_seconds_std) * inflate);
    }
    if (!line.basis.empty()) {
      for (auto& layer : out.layers) {
        layer.joules_per_step.mean *= line.joules_ratio;
        layer.joules_per_step.std *= line.joules_ratio;
        layer.seconds_per_step.mean *= line.seconds_ratio;
        layer.seconds_per_step.std *= line.seconds_ratio;
      }
      out.joules_per_step.mean *= line.joules_ratio;
      step_var *= line.joules_ratio * line.joules_ratio;
      seconds_mean *= line.seconds_ratio;
      seconds_var *= line.seconds_ratio * line.seconds_ratio;
      if (joules_sigma) {
        // The measurement replaces the layers' sum and its spreads.
        step_var = 0.0;
        seconds_var = 0.0;
        structural_joules = *joules_sigma;
        structural_seconds = *seconds_sigma;
        // The layers' caveats (sparse, extrapolated) are about the sum it replaced.
        out.warnings.clear();
      }
      out.whole = std::move(line);
    }
  }
  // However sure the model, the device itself moves this much between readings of one network.
  structural_joules = std::max(structural_joules, speed_spread_);
  structural_seconds = std::max(structural_seconds, speed_spread_);
  step_var += (structural_joules * out.joules_per_step.mean) * (structural_joules * out.joules_per_step.mean);
  seconds_var += (structural_seconds * seconds_mean) * (structural_seconds * seconds_mean);
  // The runtime's own work per step (Python's module calls, its optimizer loop) is a line of
  // the step; its start-up is paid once. Their errors are the runtime probe's, apart from the
  // layers'.
  if (!runtime.empty()) {
    if (const auto it = runtimes_.find(runtime); it != runtimes_.end()) {
      const RuntimeCost& cost = it->second;
      RuntimeLines lines;
      lines.runtime = runtime;
      std::vector<std::string> types;
      for (const auto& layer : *layers) types.push_back(layer.type);
      RuntimeStepCost step = cost.step_cost(types);
      lines.modules = step.modules;
      lines.kinds_read = std::move(step.kinds_read);
      const double step_joules = step.joules;
      const double step_seconds = step.seconds;
      lines.step_joules = {step_joules, cost.step_sigma * step_joules};
      lines.step_seconds = {step_seconds, cost.step_sigma * step_seconds};
      lines.start_joules = {cost.start_joules, cost.start_sigma * cost.start_joules};
      lines.start_seconds = {cost.start_seconds, cost.start_sigma * cost.start_seconds};
      out.joules_per_step.mean += step_joules;
      step_var += lines.step_joules.std * lines.step_joules.std;
      seconds_mean += step_seconds;
      seconds_var += lines.step_seconds.std * lines.step_seconds.std;
      out.runtime = std::move(lines);
    } else if (source_ != "simulated") {
      // A simulated device's steps are the simulator's: no interpreter runs on it to be measured.
      out.warnings.push_back(fmt::format(
          "{} has not been measured on device {} yet (joule-worker runtime, run by probing): its start-up and "
          "its per-step work beyond the layers are not in this estimate",
          runtime, device_));
    }
  }
  out.joules_per_step.std = std::sqrt(step_var);
  const double steps = static_cast<double>(out.steps);
  // The same per-step error repeats every step (a bias, not independent noise): std scales
  // with the number of steps, not with its square root.
  // The runtime's start-up is paid once per job, beside the steps.
  const Uncertain start_joules = out.runtime ? out.runtime->start_joules : Uncertain{};
  const Uncertain start_seconds = out.runtime ? out.runtime->start_seconds : Uncertain{};
  out.joules = Uncertain{out.joules_per_step.mean * steps + start_joules.mean,
                         std::hypot(out.joules_per_step.std * steps, start_joules.std)};
  out.seconds = Uncertain{seconds_mean * steps + start_seconds.mean,
                          std::hypot(std::sqrt(seconds_var) * steps, start_seconds.std)};
  out.joules_per_flop = flops_sum_xx_ > 0 ? flops_sum_xy_ / flops_sum_xx_ : 0.0;
  out.flops_baseline_joules = out.joules_per_flop * flops * steps;
  if (whole) estimate_settings(network, training, out);
  return out;
}

std::map<std::string, std::size_t> DeviceEnergyModel::sample_counts() const {
  std::map<std::string, std::size_t> counts;
  for (const auto& [name, model] : models_) counts[name] = model.x.size();
  return counts;
}

json DeviceEnergyModel::save() const {
  json models = json::object();
  for (const auto& [name, model] : models_) {
    json x = json::array();
    for (const auto& row : model.x) x.push_back(std::vector<double>(row.data(), row.data() + row.size()));
    json entry = {{"names", model.names}, {"x", x}, {"log_joules", model.log_joules}, {"log_seconds", model.log_seconds}};
    if (model.work_known()) entry["log_work"] = model.log_work;
    auto prior_json = [](const LogLinear& p) {
      return json{{"intercept", p.intercept}, {"slope", p.slope}, {"residual_variance", p.residual_variance}};
    };
    if (model.energy_prior && model.time_prior)
      entry["prior"] = {{"energy", prior_json(*model.energy_prior)}, {"time", prior_json(*model.time_prior)}};
    if (model.energy) entry["energy"] = model.energy->save();
    if (model.time) entry["time"] = model.time->save();
    models[name] = entry;
  }
  json out = {{"device", device_},
              {"source", source_},
              {"models", models},
              {"flops_sum_xx", flops_sum_xx_},
              {"flops_sum_xy", flops_sum_xy_},
              {"dropped", dropped_},
              {"unresolved", unresolved_}};
  if (!environment_.empty()) out["environment"] = environment_;
  if (!runtimes_.empty()) {
    json runtimes = json::object();
    for (const auto& [name, cost] : runtimes_) runtimes[name] = to_json(cost);
    out["runtimes"] = runtimes;
  }
  if (!wholes_.empty()) {
    json wholes = json::array();
    for (const auto& sample : wholes_) wholes.push_back(to_json(sample));
    out["whole_networks"] = wholes;
    json gaps = json::object();
    for (const auto& [family, gap] : gaps_)
      gaps[family] = {{"samples", gap.samples},
                      {"log_joules_mean", gap.log_joules_mean},
                      {"log_joules_std", gap.log_joules_std},
                      {"log_seconds_mean", gap.log_seconds_mean},
                      {"log_seconds_std", gap.log_seconds_std}};
    out["whole_network_gaps"] = gaps;
  }
  if (speed_spread_ > 0.0) out["speed_spread"] = speed_spread_;
  return out;
}

std::optional<std::string> DeviceEnergyModel::inconsistency(const KeyModel& model) {
  const auto features = static_cast<Eigen::Index>(model.names.size());
  if (model.log_joules.size() != model.x.size() || model.log_seconds.size() != model.x.size())
    return "x, log_joules and log_seconds differ in length";
  for (const auto& x : model.x)
    if (x.size() != features) return fmt::format("a row of x has {} values for {} names", x.size(), features);
  // estimate() checks only the energy GP and then predicts with both.
  if (model.energy.has_value() != model.time.has_value()) return "it has an energy GP or a time GP, not both";
  if (model.energy_prior.has_value() != model.time_prior.has_value()) return "it has one prior, not both";
  if (!model.log_work.empty() && model.log_work.size() != model.x.size()) return "log_work and x differ in length";
  if (model.energy_prior && !model.work_known()) return "it has a prior but not the work of every sample";
  for (const auto* prior : {&model.energy_prior, &model.time_prior}) {
    if (*prior && (!std::isfinite((*prior)->intercept) || !std::isfinite((*prior)->slope) ||
                   !std::isfinite((*prior)->residual_variance) || (*prior)->residual_variance < 0.0))
      return "a prior is not finite";
  }
  for (const auto* gp : {&model.energy, &model.time}) {
    if (*gp && (*gp)->dimensions() != features)
      return fmt::format("a GP has {} inputs for {} names", (*gp)->dimensions(), features);
  }
  return std::nullopt;
}

Result<DeviceEnergyModel> DeviceEnergyModel::load(const json& in) {
  try {
    DeviceEnergyModel out(in.at("device").get<std::string>(), in.at("source").get<std::string>());
    out.flops_sum_xx_ = in.at("flops_sum_xx").get<double>();
    out.flops_sum_xy_ = in.at("flops_sum_xy").get<double>();
    out.dropped_ = in.at("dropped").get<std::size_t>();
    // Models saved before unresolved kinds were remembered have none.
    if (in.contains("unresolved")) out.unresolved_ = in["unresolved"].get<std::map<std::string, std::size_t>>();
    // Models saved before they named their environment have none.
    if (in.contains("environment")) out.environment_ = in["environment"].get<std::string>();
    // Models saved before runtimes were measured have none.
    if (const auto runtimes = in.find("runtimes"); runtimes != in.end() && runtimes->is_object()) {
      for (const auto& [name, entry] : runtimes->items()) {
        auto cost = runtime_cost_from_json(entry);
        if (!cost)
          return make_error(ErrorCode::invalid_argument,
                            fmt::format("not a saved device energy model: runtimes/{}{}: {}", name, cost.error().where,
                                        cost.error().message));
        out.runtimes_.emplace(name, std::move(cost).value());
      }
    }
    // Models saved before whole networks were measured have none.
    if (const auto wholes = in.find("whole_networks"); wholes != in.end() && wholes->is_array()) {
      for (std::size_t i = 0; i < wholes->size(); ++i) {
        auto sample = whole_network_sample_from_json((*wholes)[i], fmt::format("/whole_networks/{}", i));
        if (!sample)
          return make_error(ErrorCode::invalid_argument, fmt::format("not a saved device energy model: {}: {}",
                                                                     sample.error().where, sample.error().message));
        out.wholes_.push_back(std::move(sample).value());
      }
      out.learn_settings();
    }
    // Models saved before a reference network was read again have none.
    if (in.contains("speed_spread")) out.set_speed_spread(in["speed_spread"].get<double>());
    if (const auto gaps = in.find("whole_network_gaps"); gaps != in.end() && gaps->is_object()) {
      for (const auto& [family, entry] : gaps->items()) {
        WholeNetworkGap gap;
        gap.samples = entry.at("samples").get<std::size_t>();
        gap.log_joules_mean = entry.at("log_joules_mean").get<double>();
        gap.log_joules_std = entry.at("log_joules_std").get<double>();
        gap.log_seconds_mean = entry.at("log_seconds_mean").get<double>();
        gap.log_seconds_std = entry.at("log_seconds_std").get<double>();
        for (const double v : {gap.log_joules_mean, gap.log_joules_std, gap.log_seconds_mean, gap.log_seconds_std})
          if (!std::isfinite(v) || std::abs(v) > 10.0)
            return make_error(
                ErrorCode::invalid_argument,
                fmt::format("not a saved device energy model: whole_network_gaps/{}: not a ratio", family));
        out.gaps_.emplace(family, gap);
      }
    }
    for (const auto& [name, entry] : in.at("models").items()) {
      KeyModel model;
      model.names = entry.at("names").get<std::vector<std::string>>();
      for (const auto& row : entry.at("x")) {
        const auto values = row.get<std::vector<double>>();
        model.x.push_back(Eigen::Map<const Eigen::VectorXd>(values.data(), static_cast<Eigen::Index>(values.size())));
      }
      model.log_joules = entry.at("log_joules").get<std::vector<double>>();
      model.log_seconds = entry.at("log_seconds").get<std::vector<double>>();
      if (entry.contains("log_work")) model.log_work = entry["log_work"].get<std::vector<double>>();
      if (entry.contains("prior")) {
        auto prior = [](const json& p) {
          return LogLinear{p.at("intercept").get<double>(), p.at("slope").get<double>(),
                           p.at("residual_variance").get<double>()};
        };
        model.energy_prior = prior(entry["prior"].at("energy"));
        model.time_prior = prior(entry["prior"].at("time"));
      }
      if (entry.contains("energy")) {
        auto gp = GaussianProcess::load(entry["energy"]);
        if (!gp) return gp.error();
        model.energy = std::move(gp).value();
      }
      if (entry.contains("time")) {
        auto gp = GaussianProcess::load(entry["time"]);
        if (!gp) return gp.error();
        model.time = std::move(gp).value();
      }
      // Snapshots come from SQLite and from agents: the parts must agree before fit() indexes
      // log_joules by x's length and estimate() hands names-long vectors to the GPs (which throw
      // on, or in fit() silently overrun, a mismatch).
      if (auto problem = inconsistency(model)) {
        return make_error(ErrorCode::invalid_argument,
                          fmt::format("not a saved device energy model: {}: {}", name, *problem));
      }
      out.models_.emplace(name, std::move(model));
    }
    return out;
  } catch (const json::exception& error) {
    return make_error(ErrorCode::invalid_argument, fmt::format("not a saved device energy model: {}", error.what()));
  }
}

}  // namespace joule::estimator
