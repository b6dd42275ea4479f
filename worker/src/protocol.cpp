#include "joule/worker/protocol.hpp"

#include "joule/common/energy_source.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <regex>

#include <fmt/format.h>

#include "joule/estimator/layer_analysis.hpp"

namespace joule::worker {
namespace {

using nlohmann::json;

Error invalid(std::string message, std::string where) {
  return make_error(ErrorCode::invalid_argument, std::move(message), std::move(where));
}

// Reads the fields of one JSON object, each checked and named by its pointer; unknown fields
// are rejected so a typo ("repetition") does not silently fall back to a default.
class ObjectReader {
 public:
  ObjectReader(const json& object, std::string pointer) : object_(object), pointer_(std::move(pointer)) {}

  std::string where(std::string_view key) const { return fmt::format("{}/{}", pointer_, key); }

  const json* find(const char* key) {
    seen_.emplace_back(key);
    const auto it = object_.find(key);
    return it == object_.end() ? nullptr : &*it;
  }

  std::optional<Error> integer(const char* key, std::int64_t& out, std::int64_t low, std::int64_t high) {
    const json* value = find(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_number_integer() || (value->is_number_unsigned() && value->get<std::uint64_t>() > 1ULL << 62) ||
        value->get<std::int64_t>() < low || value->get<std::int64_t>() > high)
      return invalid(fmt::format("{} must be an integer in [{}, {}]", key, low, high), where(key));
    out = value->get<std::int64_t>();
    return std::nullopt;
  }

  std::optional<Error> integer(const char* key, int& out, int low, int high) {
    std::int64_t wide = out;
    if (auto error = integer(key, wide, low, high)) return error;
    out = static_cast<int>(wide);
    return std::nullopt;
  }

  std::optional<Error> number(const char* key, double& out, double low) {
    const json* value = find(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_number() || !std::isfinite(value->get<double>()) || value->get<double>() < low)
      return invalid(fmt::format("{} must be a finite number >= {}", key, low), where(key));
    out = value->get<double>();
    return std::nullopt;
  }

  std::optional<Error> string(const char* key, std::string& out) {
    const json* value = find(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_string()) return invalid(fmt::format("{} must be a string", key), where(key));
    out = value->get<std::string>();
    return std::nullopt;
  }

  std::optional<Error> boolean(const char* key, bool& out) {
    const json* value = find(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_boolean()) return invalid(fmt::format("{} must be true or false", key), where(key));
    out = value->get<bool>();
    return std::nullopt;
  }

  std::optional<Error> required(const char* key) const {
    if (!object_.contains(key)) return invalid(fmt::format("{} is required", key), where(key));
    return std::nullopt;
  }

  /// Call after every field was read: fails on the first field nobody asked for.
  std::optional<Error> no_unknown_fields() const {
    for (const auto& [key, value] : object_.items()) {
      if (std::find(seen_.begin(), seen_.end(), key) == seen_.end())
        return invalid(fmt::format("unknown field \"{}\"", key), where(key));
    }
    return std::nullopt;
  }

 private:
  const json& object_;
  std::string pointer_;
  std::vector<std::string> seen_;
};

const std::vector<std::string>& known_meters() {
  static const std::vector<std::string> meters = {"auto", "rapl", "nvml", "ina3221", "hwmon", "battery", "modelled"};
  return meters;
}

bool valid_device(const std::string& device) {
  static const std::regex pattern("cpu|cuda:(0|[1-9][0-9]{0,3})|mig:(0|[1-9][0-9]{0,2})\\.(0|[1-9][0-9]?)");
  return std::regex_match(device, pattern);
}

std::optional<Error> check_optimizer(const std::string& optimizer, const std::string& where) {
  if (!estimator::is_known_optimizer(optimizer))
    return invalid(fmt::format("optimizer must be one of {}", estimator::known_optimizer_list()), where);
  return std::nullopt;
}

Result<Repetition> parse_repetition(const json& value, const std::string& pointer) {
  if (!value.is_object()) return invalid("a repetition must be an object", pointer);
  ObjectReader reader(value, pointer);
  Repetition repetition;
  if (auto e = reader.number("joules_per_step", repetition.joules_per_step, 0.0)) return *e;
  if (auto e = reader.number("seconds_per_step", repetition.seconds_per_step, 0.0)) return *e;
  if (auto e = reader.integer("steps", repetition.steps, 0, 100000000)) return *e;
  if (auto e = reader.required("joules_per_step")) return *e;
  if (auto e = reader.required("seconds_per_step")) return *e;
  if (auto e = reader.no_unknown_fields()) return *e;
  return repetition;
}

Result<NetworkResult> parse_network_result(const json& value, const std::string& pointer) {
  if (!value.is_object()) return invalid("a network result must be an object", pointer);
  ObjectReader reader(value, pointer);
  NetworkResult network;
  if (auto e = reader.string("name", network.name)) return *e;
  if (auto e = reader.number("joules_per_step", network.joules_per_step, 0.0)) return *e;
  if (auto e = reader.number("seconds_per_step", network.seconds_per_step, 0.0)) return *e;
  if (auto e = reader.number("joules_spread", network.joules_spread, 0.0)) return *e;
  if (auto e = reader.number("seconds_spread", network.seconds_spread, 0.0)) return *e;
  if (auto e = reader.number("final_loss", network.final_loss, -std::numeric_limits<double>::infinity())) return *e;
  // 0: not said (results written before readings were lengthened per meter).
  if (auto e = reader.integer("steps_per_repetition", network.steps_per_repetition, 0, 100000000)) return *e;
  if (auto e = reader.required("joules_per_step")) return *e;
  if (auto e = reader.required("seconds_per_step")) return *e;
  if (const json* reps = reader.find("repetitions")) {
    if (!reps->is_array()) return invalid("repetitions must be an array", reader.where("repetitions"));
    for (std::size_t i = 0; i < reps->size(); ++i) {
      auto repetition = parse_repetition((*reps)[i], fmt::format("{}/repetitions/{}", pointer, i));
      if (!repetition) return repetition.error();
      network.repetitions.push_back(*repetition);
    }
  }
  if (auto e = reader.no_unknown_fields()) return *e;
  return network;
}

Result<WorkerEnvironment> parse_environment(const json& value, const std::string& pointer) {
  if (!value.is_object()) return invalid("environment must be an object", pointer);
  ObjectReader reader(value, pointer);
  WorkerEnvironment environment;
  if (auto e = reader.string("torch_version", environment.torch_version)) return *e;
  if (auto e = reader.string("blas", environment.blas)) return *e;
  if (auto e = reader.integer("threads", environment.threads, 1, 4096)) return *e;
  if (auto e = reader.string("device", environment.device)) return *e;
  if (auto e = reader.string("device_name", environment.device_name)) return *e;
  if (auto e = reader.string("cuda", environment.cuda)) return *e;  // absent from older workers
  std::string fingerprint;
  if (auto e = reader.string("fingerprint", fingerprint)) return *e;  // derived; written for readers only
  if (auto e = reader.no_unknown_fields()) return *e;
  return environment;
}

}  // namespace

std::string WorkerEnvironment::fingerprint() const {
  return fmt::format("torch {}; blas {}; threads {}; device {}; {}", torch_version, blas, threads, device, device_name);
}

json to_json(const ProbeRequest& request) {
  json networks = json::array();
  for (const auto& network : request.networks) networks.push_back(estimator::to_json(network));
  return {{"device", request.device},
          {"threads", request.threads},
          {"batch_size", request.batch_size},
          {"optimizer", request.optimizer},
          {"warmup_steps", request.warmup_steps},
          {"steps_per_repetition", request.steps_per_repetition},
          {"min_reading_seconds", request.min_reading_seconds},
          {"repetitions", request.repetitions},
          {"meter", request.meter},
          {"idle_watts", request.idle_watts},
          {"watts_per_busy_core", request.watts_per_busy_core},
          {"seed", request.seed},
          {"networks", std::move(networks)},
          {"network_optimizers", request.network_optimizers}};
}

Result<ProbeRequest> parse_probe_request(const json& value) {
  if (!value.is_object()) return invalid("a probe request must be a JSON object", "");
  ObjectReader reader(value, "");
  ProbeRequest request;
  if (auto e = reader.string("device", request.device)) return *e;
  if (!valid_device(request.device))
    return invalid(fmt::format("device must be \"cpu\", \"cuda:N\" or \"mig:G.I\", got \"{}\"", request.device),
                   reader.where("device"));
  if (auto e = reader.integer("threads", request.threads, 1, 4096)) return *e;
  if (auto e = reader.integer("batch_size", request.batch_size, 1, 1 << 20)) return *e;
  if (auto e = reader.string("optimizer", request.optimizer)) return *e;
  if (auto e = check_optimizer(request.optimizer, reader.where("optimizer"))) return *e;
  if (auto e = reader.integer("warmup_steps", request.warmup_steps, 0, 1000000)) return *e;
  if (auto e = reader.integer("steps_per_repetition", request.steps_per_repetition, 1, 1000000)) return *e;
  if (auto e = reader.integer("repetitions", request.repetitions, 1, 100000)) return *e;
  if (auto e = reader.number("min_reading_seconds", request.min_reading_seconds, 0.0)) return *e;
  if (auto e = reader.string("meter", request.meter)) return *e;
  if (std::find(known_meters().begin(), known_meters().end(), request.meter) == known_meters().end())
    return invalid(fmt::format("meter \"{}\" is unknown; use auto, rapl, nvml, ina3221, hwmon, battery or modelled",
                               request.meter),
                   reader.where("meter"));
  if (auto e = reader.number("idle_watts", request.idle_watts, 0.0)) return *e;
  if (auto e = reader.number("watts_per_busy_core", request.watts_per_busy_core, 0.0)) return *e;
  if (const json* seed = reader.find("seed")) {
    if (!seed->is_number_unsigned() && !(seed->is_number_integer() && seed->get<std::int64_t>() >= 0))
      return invalid("seed must be an integer >= 0", reader.where("seed"));
    request.seed = seed->get<std::uint64_t>();
  }
  if (auto e = reader.required("networks")) return *e;
  const json* networks = reader.find("networks");
  if (!networks->is_array() || networks->empty())
    return invalid("networks must be a non-empty array of model specs", reader.where("networks"));
  for (std::size_t i = 0; i < networks->size(); ++i) {
    const std::string pointer = fmt::format("/networks/{}", i);
    auto spec = estimator::parse_model_spec((*networks)[i], pointer);
    if (!spec) return spec.error();
    // Shapes are checked here, before any training: the error names the layer and its pointer.
    if (auto analyzed = estimator::analyze_model(*spec, request.batch_size, pointer); !analyzed)
      return analyzed.error();
    request.networks.push_back(std::move(spec).value());
  }
  if (const json* optimizers = reader.find("network_optimizers")) {
    if (!optimizers->is_array() || (!optimizers->empty() && optimizers->size() != request.networks.size()))
      return invalid("network_optimizers must be an array with one optimizer per network (or empty)",
                     reader.where("network_optimizers"));
    for (std::size_t i = 0; i < optimizers->size(); ++i) {
      const std::string where = fmt::format("/network_optimizers/{}", i);
      if (!(*optimizers)[i].is_string()) return invalid("an optimizer must be a string", where);
      if (auto e = check_optimizer((*optimizers)[i].get<std::string>(), where)) return *e;
      request.network_optimizers.push_back((*optimizers)[i].get<std::string>());
    }
  }
  if (auto e = reader.no_unknown_fields()) return *e;
  return request;
}

json to_json(const WorkerEnvironment& environment) {
  return {{"torch_version", environment.torch_version},
          {"blas", environment.blas},
          {"threads", environment.threads},
          {"device", environment.device},
          {"device_name", environment.device_name},
          {"cuda", environment.cuda},
          {"fingerprint", environment.fingerprint()}};
}

json to_json(const ProbeResult& result) {
  json networks = json::array();
  for (const auto& network : result.networks) {
    json repetitions = json::array();
    for (const auto& repetition : network.repetitions)
      repetitions.push_back({{"joules_per_step", repetition.joules_per_step},
                             {"seconds_per_step", repetition.seconds_per_step},
                             {"steps", repetition.steps}});
    networks.push_back({{"name", network.name},
                        {"joules_per_step", network.joules_per_step},
                        {"seconds_per_step", network.seconds_per_step},
                        {"joules_spread", network.joules_spread},
                        {"seconds_spread", network.seconds_spread},
                        {"final_loss", network.final_loss},
                        {"steps_per_repetition", network.steps_per_repetition},
                        {"repetitions", std::move(repetitions)}});
  }
  return {{"environment", to_json(result.environment)},
          {"meter_source", result.meter_source},
          {"measured", result.measured},
          {"batch_size", result.batch_size},
          {"optimizer", result.optimizer},
          {"warmup_steps", result.warmup_steps},
          {"steps_per_repetition", result.steps_per_repetition},
          {"networks", std::move(networks)},
          {"wall_seconds", result.wall_seconds}};
}

Result<ProbeResult> parse_probe_result(const json& value) {
  if (!value.is_object()) return invalid("a probe result must be a JSON object", "");
  ObjectReader reader(value, "");
  ProbeResult result;
  if (auto e = reader.required("environment")) return *e;
  auto environment = parse_environment(*reader.find("environment"), "/environment");
  if (!environment) return environment.error();
  result.environment = std::move(environment).value();
  if (auto e = reader.required("meter_source")) return *e;
  if (auto e = reader.string("meter_source", result.meter_source)) return *e;
  if (auto e = reader.required("measured")) return *e;
  if (auto e = reader.boolean("measured", result.measured)) return *e;
  // A result that calls a model a measurement is refused rather than believed.
  if (result.measured && !joule::is_measurement(result.meter_source))
    return invalid(fmt::format("measured is true but meter_source \"{}\" is not a measurement", result.meter_source),
                   "/measured");
  if (auto e = reader.integer("batch_size", result.batch_size, 1, 1 << 20)) return *e;
  if (auto e = reader.string("optimizer", result.optimizer)) return *e;
  if (auto e = check_optimizer(result.optimizer, "/optimizer")) return *e;
  if (auto e = reader.integer("warmup_steps", result.warmup_steps, 0, 1000000)) return *e;
  if (auto e = reader.integer("steps_per_repetition", result.steps_per_repetition, 1, 1000000)) return *e;
  if (auto e = reader.number("wall_seconds", result.wall_seconds, 0.0)) return *e;
  if (auto e = reader.required("networks")) return *e;
  const json* networks = reader.find("networks");
  if (!networks->is_array()) return invalid("networks must be an array", "/networks");
  for (std::size_t i = 0; i < networks->size(); ++i) {
    auto network = parse_network_result((*networks)[i], fmt::format("/networks/{}", i));
    if (!network) return network.error();
    result.networks.push_back(std::move(network).value());
  }
  if (auto e = reader.no_unknown_fields()) return *e;
  return result;
}

json to_json(const RuntimeProbeResult& result) {
  json steps = json::array();
  for (const auto& r : result.steps) {
    steps.push_back({{"modules", r.modules},
                     {"runtime_joules_per_step", r.runtime_joules},
                     {"runtime_seconds_per_step", r.runtime_seconds},
                     {"worker_joules_per_step", r.worker_joules},
                     {"worker_seconds_per_step", r.worker_seconds},
                     {"difference_joules_per_step", r.extra_joules()},
                     {"difference_seconds_per_step", r.extra_seconds()},
                     {"spread", r.spread}});
    if (!r.kind.empty()) {
      steps.back()["kind"] = r.kind;
      steps.back()["kind_layers"] = r.kind_layers;
    }
  }
  json starts = json::array();
  for (const auto& s : result.starts) starts.push_back({{"joules", s.joules}, {"seconds", s.seconds}});
  return {{"environment", to_json(result.environment)},
          {"runtime", result.runtime},
          {"interpreter", result.interpreter},
          {"version", result.version},
          {"meter_source", result.meter_source},
          {"measured", result.measured},
          {"steps", steps},
          {"starts", starts},
          {"joules", result.joules},
          {"wall_seconds", result.wall_seconds}};
}

Result<RuntimeProbeResult> parse_runtime_probe_result(const json& value) {
  if (!value.is_object()) return invalid("a runtime probe result must be a JSON object", "");
  ObjectReader reader(value, "");
  RuntimeProbeResult result;
  if (auto e = reader.required("environment")) return *e;
  auto environment = parse_environment(*reader.find("environment"), "/environment");
  if (!environment) return environment.error();
  result.environment = std::move(environment).value();
  for (const char* key : {"runtime", "interpreter", "meter_source", "measured", "steps", "starts"})
    if (auto e = reader.required(key)) return *e;
  if (auto e = reader.string("runtime", result.runtime)) return *e;
  if (auto e = reader.string("interpreter", result.interpreter)) return *e;
  if (auto e = reader.string("version", result.version)) return *e;
  if (auto e = reader.string("meter_source", result.meter_source)) return *e;
  if (auto e = reader.boolean("measured", result.measured)) return *e;
  if (result.measured && !joule::is_measurement(result.meter_source))
    return invalid(fmt::format("measured is true but meter_source \"{}\" is not a measurement", result.meter_source),
                   "/measured");
  if (auto e = reader.number("wall_seconds", result.wall_seconds, 0.0)) return *e;
  if (auto e = reader.number("joules", result.joules, 0.0)) return *e;
  const json* steps = reader.find("steps");
  if (!steps->is_array()) return invalid("steps must be an array", "/steps");
  for (std::size_t i = 0; i < steps->size(); ++i) {
    const std::string where = fmt::format("/steps/{}", i);
    if (!(*steps)[i].is_object()) return invalid("a step reading must be an object", where);
    ObjectReader step((*steps)[i], where);
    estimator::RuntimeStepReading reading;
    for (const char* key : {"modules", "runtime_joules_per_step", "runtime_seconds_per_step", "worker_joules_per_step",
                            "worker_seconds_per_step"})
      if (auto e = step.required(key)) return *e;
    if (auto e = step.integer("modules", reading.modules, 1, 1 << 20)) return *e;
    if (auto e = step.number("runtime_joules_per_step", reading.runtime_joules, 0.0)) return *e;
    if (auto e = step.number("runtime_seconds_per_step", reading.runtime_seconds, 0.0)) return *e;
    if (auto e = step.number("worker_joules_per_step", reading.worker_joules, 0.0)) return *e;
    if (auto e = step.number("worker_seconds_per_step", reading.worker_seconds, 0.0)) return *e;
    if (auto e = step.number("spread", reading.spread, 0.0)) return *e;
    // Signed: a runtime step may read a little faster than LibTorch's in noise.
    if (auto e = step.number("difference_joules_per_step", reading.difference_joules, -1.0)) return *e;
    if (auto e = step.number("difference_seconds_per_step", reading.difference_seconds, -1.0)) return *e;
    if (auto e = step.string("kind", reading.kind)) return *e;
    if (!reading.kind.empty()) {
      if (auto e = step.required("kind_layers")) return *e;
      if (auto e = step.integer("kind_layers", reading.kind_layers, 1, reading.modules)) return *e;
    }
    if (auto e = step.no_unknown_fields()) return *e;
    result.steps.push_back(reading);
  }
  const json* starts = reader.find("starts");
  if (!starts->is_array()) return invalid("starts must be an array", "/starts");
  for (std::size_t i = 0; i < starts->size(); ++i) {
    const std::string where = fmt::format("/starts/{}", i);
    if (!(*starts)[i].is_object()) return invalid("a start-up reading must be an object", where);
    ObjectReader start((*starts)[i], where);
    estimator::RuntimeStartReading reading;
    for (const char* key : {"joules", "seconds"})
      if (auto e = start.required(key)) return *e;
    if (auto e = start.number("joules", reading.joules, 0.0)) return *e;
    if (auto e = start.number("seconds", reading.seconds, 0.0)) return *e;
    if (auto e = start.no_unknown_fields()) return *e;
    result.starts.push_back(reading);
  }
  if (auto e = reader.no_unknown_fields()) return *e;
  return result;
}

double median_of(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const std::size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle), values.end());
  const double upper = values[middle];
  if (values.size() % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle));
  return (lower + upper) / 2.0;
}

double spread_of(const std::vector<double>& values) {
  if (values.empty()) return 0.0;
  const auto [low, high] = std::minmax_element(values.begin(), values.end());
  const double median = median_of(values);
  return median > 0.0 ? (*high - *low) / median : 0.0;
}

}  // namespace joule::worker
