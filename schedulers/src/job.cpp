#include "joule/schedulers/job.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <array>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "joule/common/text.hpp"
#include "joule/estimator/layer_analysis.hpp"

namespace joule::schedulers {
namespace {

using nlohmann::json;

Error invalid(std::string message, std::string where) {
  return make_error(ErrorCode::invalid_argument, std::move(message), std::move(where));
}

// A member name as one reference token of a JSON pointer (RFC 6901: '~' is ~0, '/' is ~1).
std::string pointer_token(std::string_view name) {
  std::string out;
  for (const char c : name) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out.push_back(c);
  }
  return out;
}

// A POSIX portable environment name: letters, digits and '_', not starting with a digit.
bool is_portable_env_name(std::string_view name) {
  if (name.empty() || (name.front() >= '0' && name.front() <= '9')) return false;
  for (const char c : name) {
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

// Why a job may not set this variable, or nothing. These change how a program starts rather
// than what it computes: the dynamic loader's (code injected into every process of the job,
// the job runner included), the shells' start-up hooks, and jouled's own.
std::optional<std::string> reserved_env_name(std::string_view name) {
  if (name.rfind("LD_", 0) == 0 && name != "LD_LIBRARY_PATH")
    return "the dynamic loader's variables (LD_PRELOAD, LD_AUDIT, ...) are not accepted; LD_LIBRARY_PATH is";
  static constexpr std::string_view kShell[] = {"BASH_ENV",    "ENV",     "SHELLOPTS",  "BASHOPTS",        "PS4",
                                                "IFS",         "CDPATH",  "GLOBIGNORE", "PROMPT_COMMAND",  "GCONV_PATH",
                                                "HOSTALIASES", "NLSPATH", "LOCPATH",    "RESOLV_HOST_CONF"};
  for (const auto reserved : kShell) {
    if (name == reserved) return fmt::format("{} changes how programs and shells start; it is not accepted", name);
  }
  if (name.rfind("BASH_FUNC_", 0) == 0) return "exported shell functions are not accepted";
  if (name.rfind("JOULE_", 0) == 0) return "names starting with JOULE_ are set by jouled";
  return std::nullopt;
}

Result<BuiltinRun> parse_builtin(const json& input) {
  if (!input.is_object())
    return invalid("run.builtin must be an object: {\"dataset\": {...}, \"checkpoint\": true}", "/run/builtin");
  BuiltinRun builtin;
  for (const auto& [key, value] : input.items()) {
    const std::string where = "/run/builtin/" + pointer_token(key);
    if (key == "dataset") {
      if (!value.is_object())
        return invalid("run.builtin.dataset must be an object with a \"format\" (mnist-idx, cifar10, csv, synthetic)",
                       where);
      builtin.dataset = value;
    } else if (key == "checkpoint") {
      if (value.is_boolean()) {
        builtin.checkpoints = value.get<bool>();
      } else if (value.is_string() && !value.get<std::string>().empty() && value.get<std::string>()[0] == '/' &&
                 value.get<std::string>().find('\0') == std::string::npos) {
        builtin.checkpoint_directory = value.get<std::string>();
      } else {
        return invalid("run.builtin.checkpoint must be true, false or an absolute directory", where);
      }
    } else {
      return invalid(fmt::format("run.builtin: unknown field \"{}\" (dataset, checkpoint)", printable(key, 100)),
                     where);
    }
  }
  return builtin;
}

Result<RunCommand> parse_run(const json& run, const JobLimits& limits) {
  if (!run.is_object()) return invalid("run must be an object with a \"command\" or a \"builtin\"", "/run");
  RunCommand command;
  for (const auto& [key, value] : run.items()) {
    if (key != "command" && key != "builtin" && key != "workdir" && key != "env")
      return invalid(fmt::format("run: unknown field \"{}\"", key), "/run/" + key);
  }
  const auto argv = run.find("command");
  if (const auto builtin = run.find("builtin"); builtin != run.end()) {
    if (argv != run.end())
      return invalid("run has both a command and builtin: give one (builtin trains the job's model itself)",
                     "/run/builtin");
    auto parsed = parse_builtin(*builtin);
    if (!parsed) return parsed.error();
    command.builtin = std::move(parsed).value();
  } else {
    if (argv == run.end()) return invalid("run.command (or run.builtin) is required", "/run/command");
    if (!argv->is_array()) return invalid("run.command must be an array of strings (argv)", "/run/command");
    if (argv->empty()) return invalid("run.command is empty; give at least the program", "/run/command");
    if (argv->size() > limits.max_argv)
      return invalid(fmt::format("run.command has more than {} arguments", limits.max_argv), "/run/command");
    for (std::size_t i = 0; i < argv->size(); ++i) {
      const auto& arg = (*argv)[i];
      const std::string where = fmt::format("/run/command/{}", i);
      if (!arg.is_string()) return invalid("run.command entries must be strings", where);
      const auto text = arg.get<std::string>();
      if (text.find('\0') != std::string::npos) return invalid("argument contains a NUL byte", where);
      if (i == 0 && text.empty()) return invalid("the program name is empty", where);
      command.argv.push_back(text);
    }
  }
  if (auto it = run.find("workdir"); it != run.end()) {
    if (!it->is_string() || it->get<std::string>().empty() || it->get<std::string>()[0] != '/' ||
        it->get<std::string>().find('\0') != std::string::npos)
      return invalid("run.workdir must be an absolute path (without NUL bytes)", "/run/workdir");
    command.workdir = it->get<std::string>();
  }
  if (auto it = run.find("env"); it != run.end()) {
    if (!it->is_object()) return invalid("run.env must be an object of strings", "/run/env");
    if (it->size() > limits.max_env)
      return invalid(fmt::format("run.env has more than {} entries", limits.max_env), "/run/env");
    for (const auto& [key, value] : it->items()) {
      const std::string where = "/run/env/" + pointer_token(key);
      if (!is_portable_env_name(key))
        return invalid(fmt::format("\"{}\" is not an environment name: use letters, digits and '_', not starting "
                                   "with a digit",
                                   printable(key, 100)),
                       where);
      if (auto why = reserved_env_name(key)) return invalid(*why, where);
      if (!value.is_string()) return invalid("environment values must be strings", where);
      const auto text = value.get<std::string>();
      if (text.find('\0') != std::string::npos) return invalid("value contains a NUL byte", where);
      command.env[key] = text;
    }
  }
  return command;
}

// At most this many cores a job may ask for (beyond any node's: the node's own count is checked
// where the job runs).
constexpr int kMaxCores = 4096;
// At most this many GPUs (beyond any single node's; the node's own count is checked where it runs).
constexpr int kMaxGpus = 64;

Result<Resources> parse_resources(const json& input) {
  if (!input.is_object()) return invalid("resources must be an object, e.g. {\"cores\": 4}", "/resources");
  Resources resources;
  for (const auto& [key, value] : input.items()) {
    const std::string where = "/resources/" + key;
    if (key == "cores") {
      auto count = [&](const json& number) -> std::optional<int> {
        const bool whole = number.is_number_unsigned() || number.is_number_integer();
        if (!whole || number.get<std::int64_t>() < 1 || number.get<std::int64_t>() > kMaxCores) return std::nullopt;
        return static_cast<int>(number.get<std::int64_t>());
      };
      if (value.is_object()) {
        // A range: placement chooses the count.
        for (const auto& [bound, number] : value.items()) {
          if (bound != "min" && bound != "max")
            return invalid(fmt::format("resources.cores: unknown field \"{}\" (known: min, max)", bound),
                           where + "/" + bound);
          if (!count(number))
            return invalid(
                fmt::format("resources.cores.{} must be a whole number of cores from 1 to {}", bound, kMaxCores),
                where + "/" + bound);
        }
        if (!value.contains("min") || !value.contains("max"))
          return invalid("resources.cores as a range needs both min and max: {\"min\": 2, \"max\": 8}", where);
        resources.cores = count(value["min"]);
        resources.cores_max = count(value["max"]);
        if (*resources.cores_max < *resources.cores)
          return invalid("resources.cores.max must be at least its min", where + "/max");
        continue;
      }
      if (!count(value))
        return invalid(fmt::format("resources.cores must be a whole number of cores from 1 to {}, or {{\"min\": a, "
                                   "\"max\": b}}",
                                   kMaxCores),
                       where);
      resources.cores = count(value);
    } else if (key == "gpus") {
      const bool whole = value.is_number_unsigned() || value.is_number_integer();
      if (!whole || value.get<std::int64_t>() < 1 || value.get<std::int64_t>() > kMaxGpus)
        return invalid(fmt::format("resources.gpus must be a whole number of GPUs from 1 to {}", kMaxGpus), where);
      resources.gpus = static_cast<int>(value.get<std::int64_t>());
    } else {
      return invalid(fmt::format("resources: unknown field \"{}\" (known: cores, gpus)", key), where);
    }
  }
  // Cores are a CPU's, shared side by side; GPUs are held whole, each by one job.
  if (resources.cores && resources.gpus)
    return invalid("resources asks for both cores and gpus: cores are for jobs on the CPU, gpus for jobs on GPUs",
                   "/resources/gpus");
  return resources;
}

Result<Constraints> parse_constraints(const json& input) {
  if (!input.is_object()) return invalid("constraints must be an object", "/constraints");
  Constraints constraints;
  for (const auto& [key, value] : input.items()) {
    const std::string where = "/constraints/" + key;
    if (key == "devices") {
      if (!value.is_array()) return invalid("constraints.devices must be an array of patterns", where);
      for (std::size_t i = 0; i < value.size(); ++i) {
        if (!value[i].is_string() || value[i].get<std::string>().empty())
          return invalid("device patterns must be non-empty strings", fmt::format("{}/{}", where, i));
        constraints.devices.push_back(value[i].get<std::string>());
      }
    } else if (key == "deadline") {
      if (!value.is_string()) return invalid("deadline must be an RFC 3339 time string", where);
      auto parsed = parse_rfc3339(value.get<std::string>());
      if (!parsed) return invalid("deadline is not an RFC 3339 time such as 2026-12-01T18:00:00Z", where);
      constraints.deadline = *parsed;
    } else if (key == "not_before") {
      if (!value.is_string()) return invalid("not_before must be an RFC 3339 time string", where);
      auto parsed = parse_rfc3339(value.get<std::string>());
      if (!parsed) return invalid("not_before is not an RFC 3339 time such as 2026-12-01T08:00:00Z", where);
      constraints.not_before = *parsed;
    } else if (key == "max_energy_joules") {
      if (!value.is_number() || value.get<double>() <= 0.0)
        return invalid("max_energy_joules must be a number > 0", where);
      constraints.max_energy_joules = value.get<double>();
    } else if (key == "max_slowdown") {
      if (!value.is_number() || !(value.get<double>() > 0.0) || value.get<double>() > 10.0)
        return invalid("max_slowdown must be a number above 0 and at most 10 (0.1: 10 % slower)", where);
      constraints.max_slowdown = value.get<double>();
    } else {
      return invalid(fmt::format("constraints: unknown field \"{}\"", key), where);
    }
  }
  if (constraints.not_before && constraints.deadline && *constraints.not_before >= *constraints.deadline)
    return invalid(fmt::format("constraints.not_before ({}) must be before constraints.deadline ({})",
                               format_rfc3339(*constraints.not_before), format_rfc3339(*constraints.deadline)),
                   "/constraints/not_before");
  return constraints;
}

// The energy preferences the kernel's drivers know (intel_pstate, amd-pstate-epp); whether the
// node's driver takes one is the daemon's check.
constexpr std::array<std::string_view, 5> kEnergyPreferences = {"default", "performance", "balance_performance",
                                                                "balance_power", "power"};

Result<Knobs> parse_knobs(const json& input) {
  if (!input.is_object()) return invalid("knobs must be an object", "/knobs");
  Knobs knobs;
  // Ranges no hardware leaves: the device's own range is checked where the job is submitted.
  const auto number = [&](const std::string& key, const json& value, double most) -> Result<double> {
    if (!value.is_number() || !(value.get<double>() > 0.0) || value.get<double>() > most)
      return invalid(fmt::format("knobs.{} must be a number > 0 and <= {:g}", key, most), "/knobs/" + key);
    return value.get<double>();
  };
  for (const auto& [key, value] : input.items()) {
    if (key == "cpu_max_frequency_mhz") {
      auto mhz = number(key, value, 100000.0);
      if (!mhz) return mhz.error();
      knobs.cpu_max_frequency_mhz = *mhz;
    } else if (key == "gpu_max_frequency_mhz") {
      auto mhz = number(key, value, 100000.0);
      if (!mhz) return mhz.error();
      knobs.gpu_max_frequency_mhz = *mhz;
    } else if (key == "gpu_power_limit_watts") {
      auto watts = number(key, value, 100000.0);
      if (!watts) return watts.error();
      knobs.gpu_power_limit_watts = *watts;
    } else if (key == "power_mode") {
      // A name ("15W", "MAXN") or an id; which modes exist is the node's nvpmodel.conf's to say.
      if (value.is_number_integer() && value.get<std::int64_t>() >= 0 && value.get<std::int64_t>() < 1000)
        knobs.power_mode = std::to_string(value.get<std::int64_t>());
      else if (value.is_string() && !value.get<std::string>().empty() && value.get<std::string>().size() <= 64 &&
               !has_control_character(value.get<std::string>()))
        knobs.power_mode = value.get<std::string>();
      else
        return invalid("knobs.power_mode must be a power mode's name or id (nvpmodel -q shows them)", "/knobs/" + key);
    } else if (key == "cpu_energy_preference") {
      if (!value.is_string() || std::find(kEnergyPreferences.begin(), kEnergyPreferences.end(),
                                          value.get<std::string>()) == kEnergyPreferences.end())
        return invalid(
            fmt::format("knobs.cpu_energy_preference must be one of {}", fmt::join(kEnergyPreferences, ", ")),
            "/knobs/" + key);
      knobs.cpu_energy_preference = value.get<std::string>();
    } else {
      return invalid(fmt::format("knobs: unknown field \"{}\" (cpu_max_frequency_mhz, cpu_energy_preference, "
                                 "gpu_power_limit_watts, gpu_max_frequency_mhz, power_mode)",
                                 printable(key, 100)),
                     "/knobs/" + printable(key, 100));
    }
  }
  if (knobs.wants_cpu() && knobs.wants_gpu())
    return invalid("knobs: a job runs on one device, so it may ask for CPU knobs or GPU knobs, not both",
                   knobs.gpu_power_limit_watts ? "/knobs/gpu_power_limit_watts" : "/knobs/gpu_max_frequency_mhz");
  return knobs;
}

constexpr std::array<std::string_view, 7> kStateNames = {"queued",    "placed", "running",  "throttled",
                                                         "succeeded", "failed", "cancelled"};

}  // namespace

Result<JobSpec> parse_job_spec(const json& body, const JobLimits& limits) {
  if (!body.is_object()) return invalid("the job must be a JSON object", "");
  JobSpec spec;
  for (const auto& [key, value] : body.items()) {
    if (key == "name") {
      if (!value.is_string()) return invalid("name must be a string", "/name");
      spec.name = value.get<std::string>();
      if (spec.name.size() > limits.max_name_length)
        return invalid(fmt::format("name is longer than {} characters", limits.max_name_length), "/name");
      // A newline or escape sequence in a name would forge lines in logs and on terminals.
      if (has_control_character(spec.name))
        return invalid("name must not contain control characters (newlines, tabs, escapes)", "/name");
    } else if (key == "project") {
      if (!value.is_string()) return invalid("project must be a string", "/project");
      spec.project = value.get<std::string>();
      const bool named = !spec.project.empty() && spec.project.size() <= 64 &&
                         std::all_of(spec.project.begin(), spec.project.end(), [](char c) {
                           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                                  c == '_' || c == '.' || c == '-';
                         });
      if (!named)
        return invalid("project must be a project's name: 1 to 64 letters, digits, '_', '.' or '-'", "/project");
    } else if (key == "model") {
      auto model = estimator::parse_model_spec(value, "/model");
      if (!model) return model.error();
      spec.model = std::move(model).value();
    } else if (key == "training") {
      auto training = estimator::parse_training_config(value, "/training");
      if (!training) return training.error();
      spec.training = std::move(training).value();
    } else if (key == "run") {
      auto run = parse_run(value, limits);
      if (!run) return run.error();
      spec.run = std::move(run).value();
    } else if (key == "constraints") {
      auto constraints = parse_constraints(value);
      if (!constraints) return constraints.error();
      spec.constraints = std::move(constraints).value();
    } else if (key == "knobs") {
      auto knobs = parse_knobs(value);
      if (!knobs) return knobs.error();
      spec.knobs = std::move(knobs).value();
    } else if (key == "resources") {
      auto resources = parse_resources(value);
      if (!resources) return resources.error();
      spec.resources = std::move(resources).value();
    } else if (key == "priority") {
      // An unsigned JSON number above INT64_MAX read as int64 wraps negative (2^64-1 became
      // -1): the range is checked on the number as it was written.
      const bool in_range = value.is_number_unsigned()
                                ? value.get<std::uint64_t>() <= static_cast<std::uint64_t>(limits.max_abs_priority)
                                : value.is_number_integer() && value.get<std::int64_t>() <= limits.max_abs_priority &&
                                      value.get<std::int64_t>() >= -limits.max_abs_priority;
      if (!in_range)
        return invalid(fmt::format("priority must be an integer within ±{}", limits.max_abs_priority), "/priority");
      spec.priority = static_cast<int>(value.get<std::int64_t>());
    } else if (key == "restart") {
      if (!value.is_string() || (value != "requeue" && value != "fail"))
        return invalid("restart must be \"requeue\" (run it again elsewhere when its node is lost; the default) or "
                       "\"fail\"",
                       "/restart");
      spec.restart = value == "requeue" ? RestartPolicy::requeue : RestartPolicy::fail;
    } else {
      return invalid(fmt::format("unknown field \"{}\"", key), "/" + key);
    }
  }
  if (!body.contains("run")) return invalid("run is required: {\"command\": [\"program\", ...]}", "/run");
  if (spec.training && !spec.model) return invalid("training is given without a model to train", "/model");
  if (spec.run.builtin && !spec.model)
    return invalid("run.builtin trains the job's model spec: give \"model\" (and \"training\")", "/model");
  if (spec.run.builtin && !spec.training)
    return invalid("run.builtin needs \"training\" (epochs, batch size, optimizer) to train the model with",
                   "/training");
  if (spec.device_count() > 1 && spec.run.builtin)
    return invalid("run.builtin trains on one device; a job on several GPUs runs a command of its own (torchrun ...)",
                   "/resources/gpus");
  if (spec.model) {
    // Shapes must fit layer by layer (the error names the layer, its pointer and a fix).
    auto analyzed = estimator::analyze_model(*spec.model, spec.training ? spec.training->batch_size : 1, "/model");
    if (!analyzed) return analyzed.error();
  }
  return spec;
}

json to_json(const JobSpec& spec) {
  json run = json::object();
  if (spec.run.builtin) {
    json checkpoint = spec.run.builtin->checkpoint_directory.empty() ? json(spec.run.builtin->checkpoints)
                                                                     : json(spec.run.builtin->checkpoint_directory);
    run["builtin"] = {{"dataset", spec.run.builtin->dataset}, {"checkpoint", checkpoint}};
  } else {
    run["command"] = spec.run.argv;
  }
  if (!spec.run.workdir.empty()) run["workdir"] = spec.run.workdir;
  if (!spec.run.env.empty()) run["env"] = spec.run.env;
  json constraints = json::object();
  if (!spec.constraints.devices.empty()) constraints["devices"] = spec.constraints.devices;
  if (spec.constraints.deadline) constraints["deadline"] = format_rfc3339(*spec.constraints.deadline);
  if (spec.constraints.not_before) constraints["not_before"] = format_rfc3339(*spec.constraints.not_before);
  if (spec.constraints.max_energy_joules) constraints["max_energy_joules"] = *spec.constraints.max_energy_joules;
  if (spec.constraints.max_slowdown) constraints["max_slowdown"] = *spec.constraints.max_slowdown;
  json out = {{"name", spec.name},
              {"run", run},
              {"constraints", constraints},
              {"priority", spec.priority},
              {"restart", spec.restart == RestartPolicy::requeue ? "requeue" : "fail"}};
  if (spec.model) out["model"] = estimator::to_json(*spec.model);
  if (spec.training) out["training"] = estimator::to_json(*spec.training);
  if (!spec.knobs.empty()) out["knobs"] = to_json(spec.knobs);
  if (spec.resources.cores && spec.resources.cores_max)
    out["resources"]["cores"] = {{"min", *spec.resources.cores}, {"max", *spec.resources.cores_max}};
  else if (spec.resources.cores)
    out["resources"]["cores"] = *spec.resources.cores;
  if (spec.resources.gpus) out["resources"]["gpus"] = *spec.resources.gpus;
  if (!spec.project.empty()) out["project"] = spec.project;
  return out;
}

json to_json(const Knobs& knobs) {
  json out = json::object();
  if (knobs.cpu_max_frequency_mhz) out["cpu_max_frequency_mhz"] = *knobs.cpu_max_frequency_mhz;
  if (knobs.cpu_energy_preference) out["cpu_energy_preference"] = *knobs.cpu_energy_preference;
  if (knobs.gpu_power_limit_watts) out["gpu_power_limit_watts"] = *knobs.gpu_power_limit_watts;
  if (knobs.gpu_max_frequency_mhz) out["gpu_max_frequency_mhz"] = *knobs.gpu_max_frequency_mhz;
  if (knobs.power_mode) out["power_mode"] = *knobs.power_mode;
  return out;
}

bool device_allowed(const Constraints& constraints, std::string_view device) {
  if (constraints.devices.empty()) return true;
  const std::string name(device);
  // An agent's device, "node/device", matches a pattern for the whole name or for the device.
  const auto slash = name.find('/');
  const std::string bare = slash == std::string::npos ? name : name.substr(slash + 1);
  for (const auto& pattern : constraints.devices) {
    if (::fnmatch(pattern.c_str(), name.c_str(), 0) == 0) return true;
    if (pattern.find('/') == std::string::npos && ::fnmatch(pattern.c_str(), bare.c_str(), 0) == 0) return true;
  }
  return false;
}

std::string_view to_string(JobState state) { return kStateNames[static_cast<std::size_t>(state)]; }

std::optional<JobState> job_state_from_string(std::string_view text) {
  for (std::size_t i = 0; i < kStateNames.size(); ++i) {
    if (kStateNames[i] == text) return static_cast<JobState>(i);
  }
  return std::nullopt;
}

bool is_terminal(JobState state) {
  return state == JobState::succeeded || state == JobState::failed || state == JobState::cancelled;
}

bool can_transition(JobState from, JobState to) {
  using S = JobState;
  if (is_terminal(from)) return false;
  switch (to) {
    case S::queued:
      return from == S::placed || from == S::running || from == S::throttled;
    case S::placed:
      return from == S::queued;
    case S::running:
      return from == S::placed || from == S::throttled;
    case S::throttled:
      return from == S::running;
    case S::succeeded:
      return from == S::running || from == S::throttled;
    case S::failed:
      return true;  // any live job can fail (spawn error, lost process)
    case S::cancelled:
      return true;  // any live job can be cancelled
  }
  return false;
}

}  // namespace joule::schedulers
