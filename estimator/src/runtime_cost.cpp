#include "joule/estimator/runtime_cost.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include <fmt/format.h>

namespace joule::estimator {
namespace {

using nlohmann::json;

bool positive(double x) { return std::isfinite(x) && x > 0.0; }

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

struct Line {
  double base = 0.0;
  double slope = 0.0;
  double relative_rms = 0.0;  ///< RMS of the residuals over the mean of the fitted values
};

// Least squares of y on x, then both terms held at 0 or above: a runtime never makes a step
// cheaper, and a small negative difference is the worker's and the runtime's noise.
Line fit_line(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    sy += y[i];
    sxx += x[i] * x[i];
    sxy += x[i] * y[i];
  }
  Line line;
  const double denominator = n * sxx - sx * sx;
  line.slope = denominator > 0 ? (n * sxy - sx * sy) / denominator : 0.0;
  line.base = (sy - line.slope * sx) / n;
  if (line.slope < 0) {  // flat: the mean
    line.slope = 0;
    line.base = sy / n;
  }
  if (line.base < 0) {  // through the origin
    line.base = 0;
    line.slope = sxx > 0 ? std::max(0.0, sxy / sxx) : 0.0;
  }
  double squares = 0, fitted_sum = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double fitted = line.base + line.slope * x[i];
    squares += (y[i] - fitted) * (y[i] - fitted);
    fitted_sum += fitted;
  }
  const double fitted_mean = fitted_sum / n;
  line.relative_rms = fitted_mean > 0 ? std::sqrt(squares / n) / fitted_mean : 0.0;
  return line;
}

// A reading's run (its measured_ms); 0 for readings saved before runs were pooled.
std::int64_t stamp_of(const json& reading) {
  const auto it = reading.find("measured_ms");
  return it != reading.end() && it->is_number_integer() ? it->get<std::int64_t>() : 0;
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool is_python(const std::string& program) {
  const std::string name = base_name(program);
  if (name == "torchrun") return true;  // a Python console script: the loop it runs is Python
  if (name.rfind("python", 0) != 0) return false;
  // python, python3, python3.11, python3.11d, python3-dbg: a version and a build tag may follow.
  return std::all_of(name.begin() + 6, name.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == 'd' || c == 'b' || c == 'g' ||
           c == 'm';
  });
}

}  // namespace

std::int64_t RuntimeCost::runs() const {
  std::set<std::int64_t> stamps;
  for (const auto& r : steps) stamps.insert(r.measured_ms);
  for (const auto& s : starts) stamps.insert(s.measured_ms);
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(stamps.size()));
}

double RuntimeCost::step_joules(std::int64_t modules) const {
  return step_joules_base + step_joules_per_module * static_cast<double>(std::max<std::int64_t>(modules, 0));
}

double RuntimeCost::step_seconds(std::int64_t modules) const {
  return step_seconds_base + step_seconds_per_module * static_cast<double>(std::max<std::int64_t>(modules, 0));
}

RuntimeStepCost RuntimeCost::step_cost(const std::vector<std::string>& layer_types) const {
  RuntimeStepCost out;
  std::set<std::string> read;
  for (const auto& type : layer_types) {
    const std::int64_t calls = python_module_calls(type);
    out.modules += calls;
    if (const auto it = kinds.find(type); it != kinds.end()) {
      out.joules += it->second.joules_per_layer;
      out.seconds += it->second.seconds_per_layer;
      read.insert(type);
    } else {
      out.modules_on_line += calls;
    }
  }
  out.joules += step_joules(out.modules_on_line);
  out.seconds += step_seconds(out.modules_on_line);
  out.kinds_read.assign(read.begin(), read.end());
  return out;
}

Result<RuntimeCost> fit_runtime_cost(std::string runtime, std::vector<RuntimeStepReading> steps,
                                     std::vector<RuntimeStartReading> starts) {
  if (starts.empty())
    return make_error(ErrorCode::invalid_argument, "no start-up reading: the runtime never imported torch", "starts");
  for (std::size_t i = 0; i < starts.size(); ++i)
    if (!positive(starts[i].joules) || !positive(starts[i].seconds))
      return make_error(
          ErrorCode::invalid_argument,
          fmt::format("start-up reading {}: {} J in {} s is not a measurement", i, starts[i].joules, starts[i].seconds),
          fmt::format("starts/{}", i));
  std::set<std::int64_t> module_counts;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const auto& r = steps[i];
    if (r.modules < 1 || !positive(r.runtime_joules) || !positive(r.runtime_seconds) || !positive(r.worker_joules) ||
        !positive(r.worker_seconds) || !std::isfinite(r.extra_joules()) || !std::isfinite(r.extra_seconds()))
      return make_error(
          ErrorCode::invalid_argument,
          fmt::format("step reading {} ({} modules): every figure must be positive and finite", i, r.modules),
          fmt::format("steps/{}", i));
    if (!r.kind.empty() && (r.kind_layers < 1 || r.kind_layers * python_module_calls(r.kind) > r.modules))
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("step reading {} ({}): {} layers of its kind in a network of {} modules", i, r.kind,
                                    r.kind_layers, r.modules),
                        fmt::format("steps/{}", i));
    if (r.kind.empty()) module_counts.insert(r.modules);
  }
  if (module_counts.size() < 2)
    return make_error(ErrorCode::invalid_argument,
                      "step readings at two module counts at least are needed to tell the per-module cost from the "
                      "per-step one",
                      "steps");

  RuntimeCost cost;
  cost.runtime = std::move(runtime);
  std::vector<double> x, joules, seconds;
  for (const auto& r : steps) {
    if (!r.kind.empty()) continue;
    x.push_back(static_cast<double>(r.modules));
    joules.push_back(r.extra_joules());
    seconds.push_back(r.extra_seconds());
  }
  const Line joule_line = fit_line(x, joules);
  const Line second_line = fit_line(x, seconds);
  cost.step_joules_base = joule_line.base;
  cost.step_joules_per_module = joule_line.slope;
  cost.step_seconds_base = second_line.base;
  cost.step_seconds_per_module = second_line.slope;
  // What the line leaves over, and how much the machine moved while it was read: a difference of
  // two noisy readings is as unsure as their spreads together.
  double spread = 0.0;
  for (const auto& r : steps) spread = std::max(spread, r.spread);
  cost.step_sigma = std::max({kRuntimeStepSigmaFloor, std::hypot(joule_line.relative_rms, spread)});

  // Each kind: what its network costs beyond the line's price of its other modules, per layer.
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> per_layer;
  for (const auto& r : steps) {
    if (r.kind.empty()) continue;
    const double layers = static_cast<double>(r.kind_layers);
    const std::int64_t others = r.modules - r.kind_layers * python_module_calls(r.kind);
    auto& [j, s] = per_layer[r.kind];
    j.push_back((r.extra_joules() - cost.step_joules(others)) / layers);
    s.push_back((r.extra_seconds() - cost.step_seconds(others)) / layers);
  }
  for (const auto& [kind, values] : per_layer)
    cost.kinds[kind] = RuntimeKindCost{std::max(0.0, median(values.first)), std::max(0.0, median(values.second)),
                                       static_cast<std::int64_t>(values.first.size())};

  std::vector<double> start_joules, start_seconds;
  for (const auto& s : starts) {
    start_joules.push_back(s.joules);
    start_seconds.push_back(s.seconds);
  }
  cost.start_joules = median(start_joules);
  cost.start_seconds = median(start_seconds);
  const auto [low, high] = std::minmax_element(start_joules.begin(), start_joules.end());
  // (max − min) / 2 is about one σ of a handful of readings.
  cost.start_sigma = std::max(kRuntimeStartSigmaFloor, (*high - *low) / 2.0 / cost.start_joules);
  cost.steps = std::move(steps);
  cost.starts = std::move(starts);
  return cost;
}

Result<RuntimeCost> pool_runtime_runs(const RuntimeCost& earlier, const RuntimeCost& latest, int runs) {
  const bool same = earlier.runtime == latest.runtime && earlier.interpreter == latest.interpreter &&
                    earlier.version == latest.version && earlier.source == latest.source;
  std::vector<RuntimeStepReading> steps;
  std::vector<RuntimeStartReading> starts;
  if (same && runs > 1) {
    // The earlier runs' stamps, newest first; readings of the runs - 1 newest (older than the
    // latest run) are kept.
    std::set<std::int64_t, std::greater<>> stamps;
    for (const auto& r : earlier.steps)
      if (r.measured_ms < latest.measured_ms || latest.measured_ms == 0) stamps.insert(r.measured_ms);
    for (const auto& s : earlier.starts)
      if (s.measured_ms < latest.measured_ms || latest.measured_ms == 0) stamps.insert(s.measured_ms);
    std::set<std::int64_t> kept;
    for (const std::int64_t stamp : stamps) {
      if (static_cast<int>(kept.size()) >= runs - 1) break;
      kept.insert(stamp);
    }
    for (const auto& r : earlier.steps)
      if (kept.contains(r.measured_ms)) steps.push_back(r);
    for (const auto& s : earlier.starts)
      if (kept.contains(s.measured_ms)) starts.push_back(s);
  }
  steps.insert(steps.end(), latest.steps.begin(), latest.steps.end());
  starts.insert(starts.end(), latest.starts.begin(), latest.starts.end());
  auto pooled = fit_runtime_cost(latest.runtime, std::move(steps), std::move(starts));
  if (!pooled) return pooled.error();
  pooled->interpreter = latest.interpreter;
  pooled->version = latest.version;
  pooled->source = latest.source;
  pooled->measured_ms = latest.measured_ms;
  return pooled;
}

json to_json(const RuntimeCost& cost) {
  json steps = json::array();
  for (const auto& r : cost.steps) {
    steps.push_back({{"modules", r.modules},
                     {"runtime_joules", r.runtime_joules},
                     {"runtime_seconds", r.runtime_seconds},
                     {"worker_joules", r.worker_joules},
                     {"worker_seconds", r.worker_seconds},
                     {"spread", r.spread},
                     {"difference_joules", r.extra_joules()},
                     {"difference_seconds", r.extra_seconds()},
                     {"measured_ms", r.measured_ms}});
    if (!r.kind.empty()) {
      steps.back()["kind"] = r.kind;
      steps.back()["kind_layers"] = r.kind_layers;
    }
  }
  json starts = json::array();
  for (const auto& s : cost.starts)
    starts.push_back({{"joules", s.joules}, {"seconds", s.seconds}, {"measured_ms", s.measured_ms}});
  json kinds = json::object();
  for (const auto& [kind, k] : cost.kinds)
    kinds[kind] = {
        {"joules_per_layer", k.joules_per_layer}, {"seconds_per_layer", k.seconds_per_layer}, {"readings", k.readings}};
  return {{"runtime", cost.runtime},
          {"interpreter", cost.interpreter},
          {"version", cost.version},
          {"source", cost.source},
          {"measured_ms", cost.measured_ms},
          {"runs", cost.runs()},
          {"start", {{"joules", cost.start_joules}, {"seconds", cost.start_seconds}, {"sigma", cost.start_sigma}}},
          {"step",
           {{"joules_base", cost.step_joules_base},
            {"joules_per_module", cost.step_joules_per_module},
            {"seconds_base", cost.step_seconds_base},
            {"seconds_per_module", cost.step_seconds_per_module},
            {"sigma", cost.step_sigma}}},
          {"kinds", kinds},
          {"step_readings", steps},
          {"start_readings", starts}};
}

Result<RuntimeCost> runtime_cost_from_json(const json& j) {
  if (!j.is_object()) return make_error(ErrorCode::invalid_argument, "a runtime cost must be an object", "");
  auto number = [](const json& object, const char* key, const std::string& where) -> Result<double> {
    const auto it = object.find(key);
    if (it == object.end() || !it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < 0.0)
      return make_error(ErrorCode::invalid_argument, fmt::format("{} must be a number, 0 or more", key),
                        where + "/" + key);
    return it->get<double>();
  };
  auto text = [](const json& object, const char* key) {
    const auto it = object.find(key);
    return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  RuntimeCost cost;
  cost.runtime = text(j, "runtime");
  if (cost.runtime.empty()) return make_error(ErrorCode::invalid_argument, "runtime must name one", "/runtime");
  cost.interpreter = text(j, "interpreter");
  cost.version = text(j, "version");
  cost.source = text(j, "source");
  if (const auto it = j.find("measured_ms"); it != j.end() && it->is_number_integer())
    cost.measured_ms = it->get<std::int64_t>();
  const auto start = j.find("start");
  const auto step = j.find("step");
  if (start == j.end() || !start->is_object())
    return make_error(ErrorCode::invalid_argument, "start must be an object", "/start");
  if (step == j.end() || !step->is_object())
    return make_error(ErrorCode::invalid_argument, "step must be an object", "/step");
  const std::pair<double*, std::pair<const json*, const char*>> fields[] = {
      {&cost.start_joules, {&*start, "joules"}},
      {&cost.start_seconds, {&*start, "seconds"}},
      {&cost.start_sigma, {&*start, "sigma"}},
      {&cost.step_joules_base, {&*step, "joules_base"}},
      {&cost.step_joules_per_module, {&*step, "joules_per_module"}},
      {&cost.step_seconds_base, {&*step, "seconds_base"}},
      {&cost.step_seconds_per_module, {&*step, "seconds_per_module"}},
      {&cost.step_sigma, {&*step, "sigma"}}};
  for (const auto& [target, from] : fields) {
    auto value = number(*from.first, from.second, from.first == &*start ? "/start" : "/step");
    if (!value) return value.error();
    *target = *value;
  }
  if (const auto it = j.find("kinds"); it != j.end()) {
    if (!it->is_object()) return make_error(ErrorCode::invalid_argument, "kinds must be an object", "/kinds");
    for (const auto& [kind, k] : it->items()) {
      const std::string where = "/kinds/" + kind;
      if (!k.is_object()) return make_error(ErrorCode::invalid_argument, "a kind's cost must be an object", where);
      auto joules = number(k, "joules_per_layer", where);
      if (!joules) return joules.error();
      auto seconds = number(k, "seconds_per_layer", where);
      if (!seconds) return seconds.error();
      const auto readings = k.find("readings");
      cost.kinds[kind] = RuntimeKindCost{
          *joules, *seconds, readings != k.end() && readings->is_number_integer() ? readings->get<std::int64_t>() : 0};
    }
  }
  if (const auto it = j.find("step_readings"); it != j.end() && it->is_array()) {
    for (const auto& r : *it) {
      if (!r.is_object()) continue;
      RuntimeStepReading reading;
      reading.modules = r.value("modules", std::int64_t{0});
      reading.runtime_joules = r.value("runtime_joules", 0.0);
      reading.runtime_seconds = r.value("runtime_seconds", 0.0);
      reading.worker_joules = r.value("worker_joules", 0.0);
      reading.worker_seconds = r.value("worker_seconds", 0.0);
      reading.spread = r.value("spread", 0.0);
      if (r.contains("difference_joules") && r["difference_joules"].is_number())
        reading.difference_joules = r["difference_joules"].get<double>();
      if (r.contains("difference_seconds") && r["difference_seconds"].is_number())
        reading.difference_seconds = r["difference_seconds"].get<double>();
      reading.measured_ms = stamp_of(r);
      if (r.contains("kind") && r["kind"].is_string() && r.contains("kind_layers") &&
          r["kind_layers"].is_number_integer()) {
        reading.kind = r["kind"].get<std::string>();
        reading.kind_layers = r["kind_layers"].get<std::int64_t>();
      }
      cost.steps.push_back(reading);
    }
  }
  if (const auto it = j.find("start_readings"); it != j.end() && it->is_array())
    for (const auto& s : *it)
      if (s.is_object()) cost.starts.push_back({s.value("joules", 0.0), s.value("seconds", 0.0), stamp_of(s)});
  return cost;
}

std::int64_t python_module_calls(const std::string& layer_type) {
  if (layer_type == "transformer_encoder_layer") return 9;
  return 1;
}

bool runtime_kind_readable(const std::string& layer_type) {
  static const std::set<std::string> readable = {"linear",
                                                 "conv1d",
                                                 "conv2d",
                                                 "batchnorm1d",
                                                 "batchnorm2d",
                                                 "maxpool2d",
                                                 "avgpool2d",
                                                 "adaptive_avgpool2d",
                                                 "layernorm",
                                                 "dropout",
                                                 "gelu",
                                                 "tanh",
                                                 "sigmoid",
                                                 "silu",
                                                 "relu6",
                                                 "hardswish",
                                                 "leaky_relu",
                                                 "elu",
                                                 "softplus",
                                                 "mish",
                                                 "softmax",
                                                 "identity",
                                                 "flatten",
                                                 "lstm",
                                                 "gru",
                                                 "multihead_attention",
                                                 "transformer_encoder_layer"};
  return readable.contains(layer_type);
}

std::vector<std::string> runtime_readable_kinds(const std::vector<std::string>& layer_types) {
  std::map<std::string, std::int64_t> counts;
  for (const auto& type : layer_types)
    if (runtime_kind_readable(type)) ++counts[type];
  std::vector<std::pair<std::string, std::int64_t>> ranked(counts.begin(), counts.end());
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<std::string> kinds;
  for (const auto& [kind, count] : ranked) kinds.push_back(kind);
  return kinds;
}

std::vector<std::string> runtime_kinds_to_read(const std::vector<std::string>& wanted,
                                               const std::map<std::string, RuntimeKindCost>& read_before,
                                               std::size_t most) {
  std::vector<std::string> kinds;
  auto add = [&](const std::string& kind) {
    if (kinds.size() < most && runtime_kind_readable(kind) &&
        std::find(kinds.begin(), kinds.end(), kind) == kinds.end())
      kinds.push_back(kind);
  };
  for (const auto& kind : wanted)
    if (!read_before.contains(kind)) add(kind);
  for (const auto& kind : wanted)
    if (read_before.contains(kind)) add(kind);
  for (const auto& [kind, cost] : read_before) add(kind);
  return kinds;
}

std::string runtime_of_command(const std::vector<std::string>& argv) {
  std::size_t program = 0;
  // `env [-i] [NAME=value]... python3 train.py`: the program env runs.
  if (!argv.empty() && base_name(argv[0]) == "env") {
    program = 1;
    while (program < argv.size() && (argv[program].find('=') != std::string::npos || argv[program].rfind('-', 0) == 0))
      ++program;
  }
  return program < argv.size() && is_python(argv[program]) ? "python" : "";
}

}  // namespace joule::estimator
