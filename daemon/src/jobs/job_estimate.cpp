#include "joule/daemon/job_estimate.hpp"

#include "joule/estimator/thread_count.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <string_view>

#include <fmt/format.h>

namespace joule::daemon {

using nlohmann::json;

namespace {

// {"mean": m, "std": s} of a row, or nothing.
std::optional<std::pair<double, double>> figure(const json& row, const char* key) {
  const auto it = row.find(key);
  if (it == row.end() || !it->is_object()) return std::nullopt;
  const auto number = [&](const char* name) {
    const auto value = it->find(name);
    return value != it->end() && value->is_number() ? value->get<double>() : 0.0;
  };
  return std::pair{number("mean"), number("std")};
}

// A number to 6 significant digits, as a job keeps its estimates: the shortest text that reads
// back the same is then a few characters, not 17 digits.
double rounded(double number) {
  return std::isfinite(number) ? std::strtod(fmt::format("{:.6g}", number).c_str(), nullptr) : number;
}

json uncertain_json(const estimator::Uncertain& figure) { return {{"mean", figure.mean}, {"std", figure.std}}; }

}  // namespace

double flops_per_step(const estimator::Estimate& estimate) {
  double flops = 0.0;
  for (const auto& layer : estimate.layers) flops += layer.flops_per_step;
  return flops;
}

std::optional<estimator::WorkMix> work_mix_of(const estimator::Estimate& estimate) {
  std::vector<std::pair<std::string, double>> joules_by_key;
  joules_by_key.reserve(estimate.layers.size());
  for (const auto& layer : estimate.layers) joules_by_key.emplace_back(layer.key, layer.joules_per_step.mean);
  return estimator::work_mix(joules_by_key);
}

DeviceEstimate DeviceEstimate::of(const EstimateRow& row) {
  DeviceEstimate out;
  out.device = row.device;
  out.ok = row.ok();
  if (!row.estimate) return out;
  const estimator::Estimate& estimate = *row.estimate;
  out.source = energy_source_from_string(estimate.source);
  out.environment = estimate.environment;
  out.joules_mean = rounded(estimate.joules.mean);
  out.joules_std = rounded(estimate.joules.std);
  const auto& model = row.correction ? row.correction->model_joules : estimate.joules;
  out.model_joules_mean = rounded(model.mean);
  out.model_joules_std = rounded(model.std);
  out.seconds_mean = rounded(estimate.seconds.mean);
  out.model_seconds_mean = rounded(row.correction && row.correction->model_seconds ? row.correction->model_seconds->mean
                                                                                   : estimate.seconds.mean);
  if (estimate.flops_baseline_joules > 0.0) out.baseline_joules = rounded(estimate.flops_baseline_joules);
  out.flops_per_step = rounded(daemon::flops_per_step(estimate));
  out.steps = estimate.steps;
  out.epochs = std::max<std::int64_t>(1, estimate.epochs);
  out.mix = work_mix_of(estimate);
  out.warnings_digest = digest_of_warnings(estimate.warnings);
  for (const auto& line : estimate.settings)
    out.settings.push_back({line.setting, line.basis, rounded(line.joules_ratio), rounded(line.joules_log_std),
                            rounded(line.seconds_ratio), rounded(line.seconds_log_std)});
  if (const auto& line = estimate.data_parallel) {
    out.data_parallel = *line;
    for (auto* figure : {&out.data_parallel->one_gpu_joules, &out.data_parallel->one_gpu_seconds,
                         &out.data_parallel->joules_overhead, &out.data_parallel->seconds_overhead})
      *figure = {rounded(figure->mean), rounded(figure->std)};
  }
  return out;
}

std::vector<schedulers::SettingOption> DeviceEstimate::setting_options() const {
  std::vector<schedulers::SettingOption> out;
  if (!ok || !(joules_mean > 0.0) || !(seconds_mean > 0.0)) return out;
  const double relative = joules_std / joules_mean;
  for (const auto& line : settings) {
    const double joules = joules_mean * line.joules_ratio;
    out.push_back({line.setting.knob, line.setting.value, line.setting.label,
                   schedulers::Estimate{joules, joules * std::hypot(relative, line.joules_log_std),
                                        seconds_mean * line.seconds_ratio},
                   line.seconds_log_std, line.joules_log_std});
  }
  return out;
}

std::optional<DeviceEstimate> DeviceEstimate::at(const estimator::KnobSetting& setting) const {
  const auto line =
      std::find_if(settings.begin(), settings.end(), [&](const Setting& s) { return s.setting == setting; });
  if (line == settings.end()) return std::nullopt;
  DeviceEstimate out = *this;
  out.settings.clear();
  const auto scale = [&](double& mean, double& std) {
    std = mean > 0.0 ? mean * line->joules_ratio * std::hypot(std / mean, line->joules_log_std) : 0.0;
    mean *= line->joules_ratio;
  };
  scale(out.joules_mean, out.joules_std);
  scale(out.model_joules_mean, out.model_joules_std);
  out.seconds_mean *= line->seconds_ratio;
  out.model_seconds_mean *= line->seconds_ratio;
  if (out.baseline_joules) *out.baseline_joules *= line->joules_ratio;
  if (out.data_parallel) {
    // On several GPUs, each at the setting: what a job teaches of the overhead is against one
    // GPU's run at it, not at the defaults.
    scale(out.data_parallel->one_gpu_joules.mean, out.data_parallel->one_gpu_joules.std);
    out.data_parallel->one_gpu_seconds.mean *= line->seconds_ratio;
    out.data_parallel->one_gpu_seconds.std *= line->seconds_ratio;
  }
  return out;
}

bool DeviceEstimate::same_figures(const DeviceEstimate& other) const {
  return device == other.device && ok == other.ok && source == other.source && environment == other.environment &&
         joules_mean == other.joules_mean && joules_std == other.joules_std &&
         model_joules_mean == other.model_joules_mean && model_joules_std == other.model_joules_std &&
         seconds_mean == other.seconds_mean && model_seconds_mean == other.model_seconds_mean &&
         baseline_joules == other.baseline_joules && flops_per_step == other.flops_per_step && steps == other.steps &&
         epochs == other.epochs && warnings_digest == other.warnings_digest && settings == other.settings &&
         data_parallel == other.data_parallel;
}

std::size_t digest_of_warnings(const std::vector<std::string>& warnings) {
  if (warnings.empty()) return 0;
  std::size_t digest = warnings.size();
  for (const auto& warning : warnings)  // boost::hash_combine's mixing
    digest ^= std::hash<std::string>{}(warning) + 0x9e3779b97f4a7c15ULL + (digest << 6) + (digest >> 2);
  return digest;
}

std::vector<DeviceEstimate> figures_of(const std::vector<EstimateRow>& rows) {
  std::vector<DeviceEstimate> out;
  out.reserve(rows.size());
  for (const auto& row : rows) out.push_back(DeviceEstimate::of(row));
  return out;
}

json estimate_row_json(const EstimateRow& row) { return estimate_row_json(row, true); }

json estimate_row_json(const EstimateRow& row, bool with_layers) {
  if (!row.estimate) return {{"device", row.device}, {"status", "no-model"}, {"detail", row.detail}};
  json out = estimator::to_json(*row.estimate, with_layers);
  out["device"] = row.device;  // an agent's model names its own device; here it is "node/device"
  out["status"] = "ok";
  if (const auto& correction = row.correction) {
    out["raw_joules"] = uncertain_json(correction->model_joules);
    if (correction->model_seconds) out["raw_seconds"] = uncertain_json(*correction->model_seconds);
    if (const auto& overhead = correction->overhead)
      out["overhead"] = {{"joules", overhead->joules},
                         {"seconds", overhead->seconds},
                         {"per_job_joules", overhead->per_job_joules},
                         {"per_epoch_joules", overhead->per_epoch_joules},
                         {"learnt_from", overhead->learnt_from}};
    out["calibration"] = {{"method", correction->method},
                          {"rows", correction->rows},
                          {"mean_factor", correction->mean_factor},
                          {"sigma_scale", correction->sigma_scale}};
    if (!correction->note.empty()) out["calibration"]["note"] = correction->note;
  }
  return out;
}

namespace {

// The JSON text of stored rows, written directly: at 1,500 devices, building an nlohmann object
// per row, rounding it and dumping it was half of a coordinator's submission. Keys are written
// in the order nlohmann's objects dump them (sorted), so the text reads as estimate_row_json's.
class StoredRowText {
 public:
  explicit StoredRowText(std::string& out) : out_(out) {}

  void begin_object() { open('{'); }
  void end_object() { close('}'); }
  void begin_array() { open('['); }
  void end_array() { close(']'); }
  void key(std::string_view name) {
    separate();
    quoted(name);
    out_ += ':';
    after_key_ = true;
  }
  /// A figure to 6 significant digits, as rounded(): the text reads back as that double, and
  /// as a floating-point number (never an integer); null where it is not finite, as nlohmann.
  void number(double value) {
    separate();
    if (!std::isfinite(value)) {
      out_ += "null";
      return;
    }
    const std::size_t start = out_.size();
    fmt::format_to(std::back_inserter(out_), "{:.6g}", value);
    if (out_.find_first_of(".e", start) == std::string::npos) out_ += ".0";
  }
  void integer(std::int64_t value) {
    separate();
    fmt::format_to(std::back_inserter(out_), "{}", value);
  }
  void boolean(bool value) {
    separate();
    out_ += value ? "true" : "false";
  }
  void string(std::string_view text) {
    separate();
    quoted(text);
  }
  // A key and its value, in one call.
  void text_field(std::string_view name, std::string_view value) {
    key(name);
    string(value);
  }
  void number_field(std::string_view name, double value) {
    key(name);
    number(value);
  }
  void integer_field(std::string_view name, std::int64_t value) {
    key(name);
    integer(value);
  }
  void bool_field(std::string_view name, bool value) {
    key(name);
    boolean(value);
  }
  void uncertain(std::string_view name, const estimator::Uncertain& figure) {
    key(name);
    begin_object();
    key("mean");
    number(figure.mean);
    key("std");
    number(figure.std);
    end_object();
  }

 private:
  void quoted(std::string_view text) {
    const bool plain =
        std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; });
    if (plain) {
      out_ += '"';
      out_ += text;
      out_ += '"';
    } else {
      out_ += json(std::string(text)).dump();  // escapes as the dump of the whole would
    }
  }
  void open(char bracket) {
    separate();
    out_ += bracket;
    empty_.push_back(true);
  }
  void close(char bracket) {
    out_ += bracket;
    empty_.pop_back();
  }
  // The comma before every item of an object or array but its first (a key's value has none).
  void separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (empty_.empty()) return;
    if (!empty_.back()) out_ += ',';
    empty_.back() = false;
  }

  std::string& out_;
  std::vector<bool> empty_;
  bool after_key_ = false;
};

// One stored row: estimate_row_json's keys with every figure rounded, the summed FLOPs, and the
// layers only where `with_layers`.
void write_stored_row(StoredRowText& text, const EstimateRow& row, bool with_layers) {
  text.begin_object();
  if (!row.estimate) {
    text.text_field("detail", row.detail);
    text.text_field("device", row.device);
    text.text_field("status", "no-model");
    text.end_object();
    return;
  }
  const estimator::Estimate& estimate = *row.estimate;
  const auto& correction = row.correction;
  text.key("baseline");
  text.begin_object();
  text.number_field("joules", estimate.flops_baseline_joules);
  text.number_field("joules_per_flop", estimate.joules_per_flop);
  text.text_field("method", "flops");
  text.end_object();
  if (correction) {
    text.key("calibration");
    text.begin_object();
    text.number_field("mean_factor", correction->mean_factor);
    text.text_field("method", correction->method);
    if (!correction->note.empty()) {
      text.text_field("note", correction->note);
    }
    text.integer_field("rows", static_cast<std::int64_t>(correction->rows));
    text.number_field("sigma_scale", correction->sigma_scale);
    text.end_object();
  }
  if (const auto& line = estimate.data_parallel) {
    text.key("data_parallel");
    text.begin_object();
    text.text_field("basis", line->basis);
    text.integer_field("gpus", line->gpus);
    text.integer_field("jobs", static_cast<std::int64_t>(line->jobs));
    text.uncertain("joules_overhead", line->joules_overhead);
    text.uncertain("one_gpu_joules", line->one_gpu_joules);
    text.uncertain("one_gpu_seconds", line->one_gpu_seconds);
    text.uncertain("seconds_overhead", line->seconds_overhead);
    text.end_object();
  }
  text.text_field("device", row.device);  // an agent's model names its own device; here it is "node/device"
  if (!estimate.environment.empty()) {
    text.text_field("environment", estimate.environment);
  }
  text.integer_field("epochs", estimate.epochs);
  text.number_field("flops_per_step", flops_per_step(estimate));
  text.uncertain("joules", estimate.joules);
  text.uncertain("joules_per_step", estimate.joules_per_step);
  text.key("layers");
  text.begin_array();
  if (with_layers) {
    for (const auto& layer : estimate.layers) {
      text.begin_object();
      text.bool_field("extrapolated", layer.extrapolated);
      text.number_field("flops_per_step", layer.flops_per_step);
      text.integer_field("index", static_cast<std::int64_t>(layer.index));
      text.uncertain("joules_per_step", layer.joules_per_step);
      text.text_field("model", layer.key);
      text.uncertain("seconds_per_step", layer.seconds_per_step);
      text.bool_field("sparse", layer.sparse);
      text.text_field("type", layer.type);
      text.end_object();
    }
  }
  text.end_array();
  if (!with_layers) {
    text.bool_field("layers_left_out", true);
  }
  text.text_field("method", estimate.method);
  if (correction && correction->overhead) {
    const auto& overhead = *correction->overhead;
    text.key("overhead");
    text.begin_object();
    text.number_field("joules", overhead.joules);
    text.integer_field("learnt_from", static_cast<std::int64_t>(overhead.learnt_from));
    text.number_field("per_epoch_joules", overhead.per_epoch_joules);
    text.number_field("per_job_joules", overhead.per_job_joules);
    text.number_field("seconds", overhead.seconds);
    text.end_object();
  }
  if (correction) {
    text.uncertain("raw_joules", correction->model_joules);
    if (correction->model_seconds) text.uncertain("raw_seconds", *correction->model_seconds);
  }
  if (const auto& runtime = estimate.runtime) {
    text.key("runtime");
    text.begin_object();
    text.key("kinds_read");
    text.begin_array();
    for (const auto& kind : runtime->kinds_read) text.string(kind);
    text.end_array();
    text.integer_field("modules", runtime->modules);
    text.text_field("runtime", runtime->runtime);
    text.uncertain("start_joules", runtime->start_joules);
    text.uncertain("start_seconds", runtime->start_seconds);
    text.uncertain("step_joules", runtime->step_joules);
    text.uncertain("step_seconds", runtime->step_seconds);
    text.end_object();
  }
  text.uncertain("seconds", estimate.seconds);
  // What each knob setting and thread count would do: placement and the finished job's feedback
  // read them back (a job at a chosen setting or core count teaches at that setting's figures).
  if (!estimate.settings.empty()) {
    text.key("settings");
    text.begin_array();
    for (const auto& line : estimate.settings) {
      text.begin_object();
      text.text_field("basis", line.basis);
      text.uncertain("joules", line.joules);
      text.number_field("joules_log_std", line.joules_log_std);
      text.number_field("joules_ratio", line.joules_ratio);
      text.text_field("knob", line.setting.knob);
      text.text_field("label", line.setting.label);
      text.integer_field("samples", static_cast<std::int64_t>(line.samples));
      text.uncertain("seconds", line.seconds);
      text.number_field("seconds_log_std", line.seconds_log_std);
      text.number_field("seconds_ratio", line.seconds_ratio);
      text.number_field("value", line.setting.value);
      text.end_object();
    }
    text.end_array();
  }
  text.text_field("source", estimate.source);
  text.text_field("status", "ok");
  text.integer_field("steps", estimate.steps);
  text.key("warnings");
  text.begin_array();
  for (const auto& warning : estimate.warnings) text.string(warning);
  text.end_array();
  if (const auto& whole = estimate.whole) {
    text.key("whole");
    text.begin_object();
    text.text_field("basis", whole->basis);
    text.text_field("family", whole->family);
    text.number_field("joules_ratio", whole->joules_ratio);
    text.number_field("layers_joules_per_step", whole->layers_joules_per_step);
    text.number_field("layers_seconds_per_step", whole->layers_seconds_per_step);
    if (whole->basis == "measured") text.integer_field("measured_ms", whole->measured_ms);
    text.integer_field("samples", static_cast<std::int64_t>(whole->samples));
    text.number_field("seconds_ratio", whole->seconds_ratio);
    text.end_object();
  }
  text.end_object();
}

}  // namespace

std::string stored_estimates(const std::vector<EstimateRow>& rows) {
  if (rows.empty()) return {};
  // The cheapest rows keep their breakdown (where the job will likely run); the others' are not
  // written at all.
  std::vector<std::pair<double, std::size_t>> cost;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].estimate) cost.emplace_back(rows[i].estimate->joules.mean, i);
  const std::size_t detailed = std::min<std::size_t>(kDetailedRows, cost.size());
  std::partial_sort(cost.begin(), cost.begin() + static_cast<std::ptrdiff_t>(detailed), cost.end());
  std::vector<bool> keep(rows.size(), false);
  for (std::size_t k = 0; k < detailed; ++k) keep[cost[k].second] = true;
  std::string out;
  out.reserve(rows.size() * 640);
  StoredRowText text(out);
  text.begin_array();
  for (std::size_t i = 0; i < rows.size(); ++i) write_stored_row(text, rows[i], keep[i]);
  text.end_array();
  return out;
}

double flops_per_step(const json& row) {
  if (const auto flops = row.find("flops_per_step"); flops != row.end() && flops->is_number())
    return flops->get<double>();
  double flops = 0.0;
  if (const auto layers = row.find("layers"); layers != row.end() && layers->is_array())
    for (const auto& layer : *layers)
      if (layer.is_object()) flops += layer.value("flops_per_step", 0.0);
  return flops;
}

estimator::DataParallelLine data_parallel_line(const json& line) {
  const auto uncertain = [&](const char* key) {
    const auto value = figure(line, key).value_or(std::pair{0.0, 0.0});
    return estimator::Uncertain{value.first, value.second};
  };
  estimator::DataParallelLine out;
  if (const auto gpus = line.find("gpus"); gpus != line.end() && gpus->is_number_integer()) out.gpus = gpus->get<int>();
  out.one_gpu_joules = uncertain("one_gpu_joules");
  out.one_gpu_seconds = uncertain("one_gpu_seconds");
  out.joules_overhead = uncertain("joules_overhead");
  out.seconds_overhead = uncertain("seconds_overhead");
  if (const auto jobs = line.find("jobs"); jobs != line.end() && jobs->is_number_unsigned())
    out.jobs = jobs->get<std::size_t>();
  if (const auto basis = line.find("basis"); basis != line.end() && basis->is_string())
    out.basis = basis->get<std::string>();
  return out;
}

std::optional<estimator::WorkMix> work_mix_of(const json& row) {
  const auto layers = row.find("layers");
  if (layers == row.end() || !layers->is_array()) return std::nullopt;
  std::vector<std::pair<std::string, double>> joules_by_key;
  for (const auto& layer : *layers) {
    if (!layer.is_object()) continue;
    const auto key = layer.find("model");
    if (key == layer.end() || !key->is_string()) continue;
    joules_by_key.emplace_back(key->get<std::string>(),
                               figure(layer, "joules_per_step").value_or(std::pair{0.0, 0.0}).first);
  }
  return estimator::work_mix(joules_by_key);
}

std::vector<DeviceEstimate> read_estimates(const json& rows) {
  std::vector<DeviceEstimate> out;
  if (!rows.is_array()) return out;
  for (const auto& row : rows) {
    if (!row.is_object() || !row.contains("device") || !row["device"].is_string()) continue;
    DeviceEstimate estimate;
    estimate.device = row["device"].get<std::string>();
    estimate.ok = row.value("status", "") == "ok";
    if (estimate.ok) {
      estimate.source = energy_source_from_string(row.value("source", ""));
      estimate.environment = row.value("environment", "");
      const auto joules = figure(row, "joules").value_or(std::pair{0.0, 0.0});
      estimate.joules_mean = joules.first;
      estimate.joules_std = joules.second;
      const auto model = figure(row, "raw_joules").value_or(joules);
      estimate.model_joules_mean = model.first;
      estimate.model_joules_std = model.second;
      const auto seconds = figure(row, "seconds").value_or(std::pair{0.0, 0.0});
      estimate.seconds_mean = seconds.first;
      estimate.model_seconds_mean = figure(row, "raw_seconds").value_or(seconds).first;
      // A baseline of no joules is none (a model without the figure).
      if (const auto baseline = row.find("baseline"); baseline != row.end() && baseline->is_object())
        if (const double joules = baseline->value("joules", 0.0); joules > 0.0) estimate.baseline_joules = joules;
      estimate.flops_per_step = flops_per_step(row);
      if (const auto steps = row.find("steps"); steps != row.end() && steps->is_number_integer())
        estimate.steps = steps->get<std::int64_t>();
      // Estimates stored before they named their epochs: one.
      if (const auto epochs = row.find("epochs"); epochs != row.end() && epochs->is_number_integer())
        estimate.epochs = std::max<std::int64_t>(1, epochs->get<std::int64_t>());
      estimate.mix = work_mix_of(row);
      std::vector<std::string> warnings;
      if (const auto listed = row.find("warnings"); listed != row.end() && listed->is_array())
        for (const auto& warning : *listed)
          if (warning.is_string()) warnings.push_back(warning.get<std::string>());
      estimate.warnings_digest = digest_of_warnings(warnings);
      if (const auto settings = row.find("settings"); settings != row.end() && settings->is_array()) {
        for (const auto& line : *settings) {
          auto setting = estimator::knob_setting_from_json(line);
          if (!setting || !line.is_object()) continue;
          estimate.settings.push_back({std::move(setting).value(), line.value("basis", ""),
                                       line.value("joules_ratio", 1.0), line.value("joules_log_std", 0.0),
                                       line.value("seconds_ratio", 1.0), line.value("seconds_log_std", 0.0)});
        }
      }
      if (const auto line = row.find("data_parallel"); line != row.end() && line->is_object())
        estimate.data_parallel = data_parallel_line(*line);
    }
    out.push_back(std::move(estimate));
  }
  return out;
}

std::vector<DeviceEstimate> read_estimates(const std::string& stored) {
  if (stored.empty()) return {};
  return read_estimates(json::parse(stored, nullptr, false));
}

const DeviceEstimate* find_estimate(const std::vector<DeviceEstimate>& estimates, const std::string& device) {
  for (const auto& estimate : estimates)
    if (estimate.device == device) return &estimate;
  return nullptr;
}

std::optional<DeviceEstimate> at_chosen_cores(const DeviceEstimate& estimate, int chosen_cores, int device_threads) {
  if (chosen_cores <= 0 || chosen_cores == device_threads) return estimate;
  return estimate.at(estimator::threads_setting(chosen_cores));
}

}  // namespace joule::daemon
