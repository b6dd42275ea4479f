#include "joule/cluster/sync.hpp"

#include <fmt/format.h>

#include <regex>

namespace joule::cluster {

using nlohmann::json;

namespace {

Error bad(const std::string& pointer, const std::string& message) {
  return make_error(ErrorCode::invalid_argument, message, pointer);
}

// Reads one object's fields, remembering the first problem with its JSON pointer.
class Fields {
 public:
  Fields(const json& object, std::string pointer, std::optional<Error>& problem)
      : object_(object), pointer_(std::move(pointer)), problem_(problem) {
    if (!object_.is_object() && !problem_) problem_ = bad(pointer_.empty() ? "" : pointer_, "must be a JSON object");
  }

  std::string text(const char* key, bool required = true) {
    const json* value = find(key, required);
    if (!value) return {};
    if (!value->is_string()) return fail(key, "must be a string"), std::string();
    return value->get<std::string>();
  }
  std::int64_t integer(const char* key, bool required = true) {
    const json* value = find(key, required);
    if (!value) return 0;
    if (!value->is_number_integer()) return fail(key, "must be an integer"), 0;
    return value->get<std::int64_t>();
  }
  double number(const char* key, bool required = true) {
    const json* value = find(key, required);
    if (!value) return 0.0;
    if (!value->is_number()) return fail(key, "must be a number"), 0.0;
    return value->get<double>();
  }
  bool boolean(const char* key, bool fallback) {
    const json* value = find(key, false);
    if (!value) return fallback;
    if (!value->is_boolean()) return fail(key, "must be true or false"), fallback;
    return value->get<bool>();
  }
  template <class T>
  std::optional<T> optional(const char* key) {
    const json* value = find(key, false);
    if (!value || value->is_null()) return std::nullopt;
    if constexpr (std::is_same_v<T, std::string>) {
      if (!value->is_string()) return fail(key, "must be a string or null"), std::nullopt;
    } else if constexpr (std::is_integral_v<T>) {
      if (!value->is_number_integer()) return fail(key, "must be an integer or null"), std::nullopt;
    } else {
      if (!value->is_number()) return fail(key, "must be a number or null"), std::nullopt;
    }
    return value->get<T>();
  }
  const json* array(const char* key) {
    const json* value = find(key, false);
    if (!value) return nullptr;
    if (!value->is_array()) return fail(key, "must be an array"), nullptr;
    return value;
  }
  std::string at(const char* key) const { return pointer_ + "/" + key; }
  void fail(const char* key, const std::string& message) {
    if (!problem_) problem_ = bad(at(key), message);
  }

 private:
  const json* find(const char* key, bool required) {
    if (problem_ || !object_.is_object()) return nullptr;
    const auto it = object_.find(key);
    if (it == object_.end()) {
      if (required) fail(key, "is missing");
      return nullptr;
    }
    return &*it;
  }

  const json& object_;
  std::string pointer_;
  std::optional<Error>& problem_;
};

template <class T, class Parse>
std::vector<T> each(Fields& fields, const char* key, Parse parse) {
  std::vector<T> out;
  if (const json* items = fields.array(key)) {
    for (std::size_t i = 0; i < items->size(); ++i) out.push_back(parse((*items)[i], fields.at(key) + "/" + std::to_string(i)));
  }
  return out;
}

json optional_json(const auto& value) { return value ? json(*value) : json(nullptr); }

}  // namespace

bool is_valid_node_name(const std::string& name) {
  static const std::regex pattern("[A-Za-z0-9._-]{1,64}");
  return std::regex_match(name, pattern);
}

namespace {

// A reported signal: {"points": [[ms, value], ...], "end": ms, "label", "currency"}; errors name
// `at` (its JSON pointer).
Result<ReportedSignal> parse_signal(const json& item, const std::string& at) {
  auto fail = [&](const std::string& what) {
    return make_error(ErrorCode::invalid_argument, fmt::format("{}: {}", at, what), at);
  };
  if (!item.is_object() || !item.contains("points") || !item["points"].is_array())
    return fail("must be an object with points [[ms, value], ...]");
  std::vector<schedulers::SignalPoint> points;
  for (std::size_t i = 0; i < item["points"].size(); ++i) {
    const json& point = item["points"][i];
    if (!point.is_array() || point.size() != 2 || !point[0].is_number_integer() || !point[1].is_number())
      return fail(fmt::format("points/{} must be [milliseconds, value]", i));
    points.push_back({point[0].get<schedulers::UnixMillis>(), point[1].get<double>()});
  }
  const schedulers::UnixMillis end =
      item.contains("end") && item["end"].is_number_integer() ? item["end"].get<schedulers::UnixMillis>() : 0;
  auto signal = schedulers::GridSignal::from_points(std::move(points), end);
  if (!signal) return fail(signal.error().message);
  ReportedSignal out{std::move(signal).value(), item.value("label", std::string()),
                     item.value("currency", std::string())};
  return out;
}

json signal_json(const ReportedSignal& reported) {
  json points = json::array();
  for (const auto& point : reported.signal.points()) points.push_back({point.at, point.value});
  return {{"points", std::move(points)},
          {"end", reported.signal.end()},
          {"label", reported.label},
          {"currency", reported.currency}};
}

}  // namespace

Result<SyncRequest> parse_sync_request(const json& body) {
  std::optional<Error> problem;
  Fields top(body, "", problem);
  SyncRequest request;
  request.node = top.text("node");
  if (!problem && !is_valid_node_name(request.node))
    top.fail("node", fmt::format("\"{}\" is not a node name (1-64 of letters, digits, '.', '_', '-')", request.node));
  request.incarnation = top.text("incarnation");
  request.version = top.text("version", false);
  request.wait_seconds = top.number("wait_seconds", false);
  if (!problem && (request.wait_seconds < 0 || request.wait_seconds > 60))
    top.fail("wait_seconds", "must be between 0 and 60");
  request.digest = top.text("digest", false);
  request.devices = each<ReportedDevice>(top, "devices", [&](const json& item, const std::string& at) {
    Fields f(item, at, problem);
    ReportedDevice device;
    device.name = f.text("name");
    device.source = f.text("source");
    device.energy_joules = f.number("energy_joules");
    device.power_watts = f.number("power_watts", false);
    device.runs_jobs = f.boolean("runs_jobs", true);
    device.busy = f.boolean("busy", false);
    device.battery_percent = f.optional<double>("battery_percent");
    device.meter_error = f.optional<std::string>("meter_error");
    device.model_version = f.integer("model_version", false);
    device.cores = static_cast<int>(f.integer("cores", false));
    if (!problem && (device.cores < 0 || device.cores > 4096)) f.fail("cores", "must be 0-4096");
    device.gpu_group = f.text("gpu_group", false);
    if (!problem && device.gpu_group.size() > 256) f.fail("gpu_group", "must be at most 256 characters");
    if (!problem && (device.name.empty() || device.name.find('/') != std::string::npos))
      f.fail("name", "must be a device name without '/'");
    return device;
  });
  request.jobs = each<ReportedJob>(top, "jobs", [&](const json& item, const std::string& at) {
    Fields f(item, at, problem);
    ReportedJob job;
    job.id = f.text("id");
    job.epoch = f.integer("epoch");
    job.state = f.text("state");
    job.reason = f.text("reason", false);
    job.exit_code = f.optional<int>("exit_code");
    job.started_ms = f.optional<std::int64_t>("started_ms");
    job.finished_ms = f.optional<std::int64_t>("finished_ms");
    job.energy_joules = f.optional<double>("energy_joules");
    job.energy_source = f.text("energy_source", false);
    job.energy_partial = f.boolean("energy_partial", false);
    job.fenced = f.boolean("fenced", false);
    if (!problem && job.epoch < 1) f.fail("epoch", "must be >= 1");
    return job;
  });
  request.signals_digest = top.text("signals_digest", false);
  if (!problem && body.contains("signals")) {
    const json& signals = body["signals"];
    if (!signals.is_object()) top.fail("signals", "must be an object of carbon and price");
    request.signals_sent = true;
    for (const char* kind : {"carbon", "price"}) {
      if (problem || !signals.is_object() || !signals.contains(kind) || signals[kind].is_null()) continue;
      auto parsed = parse_signal(signals[kind], fmt::format("/signals/{}", kind));
      if (!parsed) {
        problem = parsed.error();
        break;
      }
      (std::string_view(kind) == "carbon" ? request.carbon : request.price) = std::move(parsed).value();
    }
  }
  request.models = each<ModelUpload>(top, "models", [&](const json& item, const std::string& at) {
    Fields f(item, at, problem);
    ModelUpload model;
    model.device = f.text("device");
    model.version = f.integer("version");
    if (!problem && (!item.contains("snapshot") || !item["snapshot"].is_object()))
      f.fail("snapshot", "must be an energy model snapshot (a JSON object)");
    if (!problem) model.snapshot = item["snapshot"];
    return model;
  });
  if (problem) return *problem;
  return request;
}

json to_json(const SyncRequest& request) {
  json signals = nullptr;
  if (request.signals_sent)
    signals = {{"carbon", request.carbon ? signal_json(*request.carbon) : json(nullptr)},
               {"price", request.price ? signal_json(*request.price) : json(nullptr)}};
  json devices = json::array();
  for (const auto& d : request.devices)
    devices.push_back({{"name", d.name},
                       {"source", d.source},
                       {"energy_joules", d.energy_joules},
                       {"power_watts", d.power_watts},
                       {"runs_jobs", d.runs_jobs},
                       {"busy", d.busy},
                       {"battery_percent", optional_json(d.battery_percent)},
                       {"meter_error", optional_json(d.meter_error)},
                       {"model_version", d.model_version},
                       {"cores", d.cores},
                       {"gpu_group", d.gpu_group}});
  json jobs = json::array();
  for (const auto& j : request.jobs)
    jobs.push_back({{"id", j.id},
                    {"epoch", j.epoch},
                    {"state", j.state},
                    {"reason", j.reason},
                    {"exit_code", optional_json(j.exit_code)},
                    {"started_ms", optional_json(j.started_ms)},
                    {"finished_ms", optional_json(j.finished_ms)},
                    {"energy_joules", optional_json(j.energy_joules)},
                    {"energy_source", j.energy_source},
                    {"energy_partial", j.energy_partial},
                    {"fenced", j.fenced}});
  json models = json::array();
  for (const auto& m : request.models)
    models.push_back({{"device", m.device}, {"version", m.version}, {"snapshot", m.snapshot}});
  json out = {{"node", request.node},
              {"incarnation", request.incarnation},
              {"version", request.version},
              {"devices", devices},
              {"jobs", jobs},
              {"models", models},
              {"wait_seconds", request.wait_seconds},
              {"digest", request.digest},
              {"signals_digest", request.signals_digest}};
  if (request.signals_sent) out["signals"] = std::move(signals);
  return out;
}

Result<SyncReply> parse_sync_reply(const json& body) {
  std::optional<Error> problem;
  Fields top(body, "", problem);
  SyncReply reply;
  reply.lease_seconds = top.number("lease_seconds");
  reply.heartbeat_seconds = top.number("heartbeat_seconds");
  reply.digest = top.text("digest");
  reply.coordinator = top.text("coordinator", false);
  reply.revision = top.integer("revision", false);
  reply.signals_digest = top.text("signals_digest", false);
  reply.jobs = each<Assignment>(top, "jobs", [&](const json& item, const std::string& at) {
    Fields f(item, at, problem);
    Assignment job;
    job.id = f.text("id");
    job.epoch = f.integer("epoch");
    job.device = f.text("device");
    job.name = f.text("name", false);
    job.priority = static_cast<int>(f.integer("priority", false));
    job.paused = f.boolean("paused", false);
    job.stop = f.boolean("stop", false);
    if (const json* companions = f.array("companions")) {
      for (std::size_t i = 0; i < companions->size() && !problem; ++i) {
        const json& name = (*companions)[i];
        if (!name.is_string() || name.get<std::string>().empty() ||
            name.get<std::string>().find('/') != std::string::npos)
          f.fail("companions", fmt::format("entry {} must be a device name without '/'", i));
        else
          job.companions.push_back(name.get<std::string>());
      }
    }
    if (!problem && (!item.contains("spec") || !item["spec"].is_object())) f.fail("spec", "must be the job's spec object");
    if (!problem) job.spec = item["spec"];
    return job;
  });
  if (const json* recorded = top.array("recorded")) {
    for (std::size_t i = 0; i < recorded->size() && !problem; ++i) {
      const json& pair = (*recorded)[i];
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !pair[1].is_number_integer())
        top.fail("recorded", fmt::format("entry {} must be [id, epoch]", i));
      else
        reply.recorded.emplace_back(pair[0].get<std::string>(), pair[1].get<std::int64_t>());
    }
  }
  if (!problem && body.contains("model_versions")) {
    const json& versions = body["model_versions"];
    if (!versions.is_object()) top.fail("model_versions", "must be an object of device: version");
    for (auto it = versions.begin(); !problem && it != versions.end(); ++it) {
      if (!it->is_number_integer()) top.fail("model_versions", fmt::format("{} must be an integer", it.key()));
      else reply.model_versions[it.key()] = it->get<std::int64_t>();
    }
  }
  if (!problem && (reply.lease_seconds <= 0 || reply.heartbeat_seconds <= 0))
    top.fail("lease_seconds", "lease and heartbeat must be positive");
  if (problem) return *problem;
  return reply;
}

json to_json(const SyncReply& reply) {
  json jobs = json::array();
  for (const auto& j : reply.jobs)
    jobs.push_back({{"id", j.id},
                    {"epoch", j.epoch},
                    {"device", j.device},
                    {"name", j.name},
                    {"priority", j.priority},
                    {"spec", j.spec},
                    {"paused", j.paused},
                    {"stop", j.stop},
                    {"companions", j.companions}});
  json recorded = json::array();
  for (const auto& [id, epoch] : reply.recorded) recorded.push_back({id, epoch});
  json versions = json::object();
  for (const auto& [device, version] : reply.model_versions) versions[device] = version;
  return {{"lease_seconds", reply.lease_seconds},
          {"heartbeat_seconds", reply.heartbeat_seconds},
          {"jobs", jobs},
          {"digest", reply.digest},
          {"recorded", recorded},
          {"model_versions", versions},
          {"coordinator", reply.coordinator},
          {"revision", reply.revision},
          {"signals_digest", reply.signals_digest}};
}

std::string digest_of_signals(const std::optional<ReportedSignal>& carbon, const std::optional<ReportedSignal>& price) {
  if (!carbon && !price) return {};
  std::uint64_t hash = 1469598103934665603ull;
  auto mix = [&](const std::string& text) {
    for (const unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
    hash = (hash ^ 0xff) * 1099511628211ull;
  };
  for (const auto* signal : {&carbon, &price}) {
    if (!*signal) {
      mix("-");
      continue;
    }
    mix((*signal)->label + ":" + (*signal)->currency + ":" + std::to_string((*signal)->signal.end()));
    for (const auto& point : (*signal)->signal.points()) mix(fmt::format("{}={:.17g}", point.at, point.value));
  }
  return fmt::format("{:016x}", hash);
}

std::string digest_of(const std::vector<Assignment>& jobs) {
  // FNV-1a over what the agent acts on (not the spec: it never changes for an id and epoch).
  std::uint64_t hash = 1469598103934665603ull;
  auto mix = [&](const std::string& text) {
    for (const unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
    hash = (hash ^ 0xff) * 1099511628211ull;
  };
  for (const auto& job : jobs)
    mix(fmt::format("{}:{}:{}:{}:{}", job.id, job.epoch, job.device, job.paused, job.stop));
  return fmt::format("{:016x}", hash);
}

}  // namespace joule::cluster
