#include "joule/simulator/trace.hpp"

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

namespace joule::simulator {
namespace {

using nlohmann::json;

Error at_line(const std::string& file, int line, const std::string& pointer, const std::string& message) {
  return make_error(ErrorCode::invalid_argument,
                    fmt::format("{}:{}: {}{}", file, line, pointer.empty() ? "" : pointer + ": ", message),
                    fmt::format("{}:{}", file, line));
}

std::optional<double> positive_number(const json& value) {
  if (!value.is_number()) return std::nullopt;
  const double number = value.get<double>();
  if (!std::isfinite(number) || number <= 0.0) return std::nullopt;
  return number;
}

}  // namespace

Result<Trace> parse_trace(const std::string& text, const std::string& file_name, const ModelReader& read_model) {
  Trace trace;
  trace.source = file_name;
  std::map<std::string, json> models;  // by path, each read once
  std::istringstream in(text);
  std::string line_text;
  int line = 0;
  static const std::set<std::string> kFields = {"at",       "name",  "model",   "training", "constraints",
                                                "priority", "owner", "project", "resources"};
  static const std::set<std::string> kConstraints = {"devices", "deadline_seconds", "not_before_seconds",
                                                     "max_energy_joules", "max_slowdown"};
  while (std::getline(in, line_text)) {
    ++line;
    if (line_text.find_first_not_of(" \t\r") == std::string::npos) continue;
    json entry;
    try {
      entry = json::parse(line_text);
    } catch (const json::parse_error& error) {
      return at_line(file_name, line, "", fmt::format("not JSON (byte {}): {}", error.byte, error.what()));
    }
    if (!entry.is_object()) return at_line(file_name, line, "", "each line must be one JSON object (a job)");
    for (const auto& [key, value] : entry.items())
      if (!kFields.contains(key))
        return at_line(file_name, line, "/" + key,
                       "unknown field (known: at, name, model, training, constraints, priority, owner, project, "
                       "resources)");

    TraceJob job;
    job.line = line;
    if (!entry.contains("at")) return at_line(file_name, line, "/at", "required: seconds after the start");
    if (!entry["at"].is_number() || !std::isfinite(entry["at"].get<double>()) || entry["at"].get<double>() < 0.0)
      return at_line(file_name, line, "/at", "must be a number of seconds >= 0");
    job.at_seconds = entry["at"].get<double>();
    if (entry.contains("name")) {
      if (!entry["name"].is_string() || entry["name"].get<std::string>().empty())
        return at_line(file_name, line, "/name", "must be a non-empty string");
      job.name = entry["name"].get<std::string>();
    } else {
      job.name = fmt::format("job-{}", line);
    }

    if (!entry.contains("model"))
      return at_line(file_name, line, "/model", "required: a model spec or the path of one");
    json model = entry["model"];
    std::string model_origin;
    if (model.is_string()) {
      const std::string path = model.get<std::string>();
      auto it = models.find(path);
      if (it == models.end()) {
        auto read = read_model(path);
        if (!read) return at_line(file_name, line, "/model", read.error().message);
        it = models.emplace(path, std::move(read).value()).first;
      }
      model = it->second;
      model_origin = fmt::format(" (in {})", path);
    }
    auto spec = estimator::parse_model_spec(model, "/model");
    if (!spec) return at_line(file_name, line, spec.error().where, spec.error().message + model_origin);
    job.model = std::move(spec).value();
    job.model_key = estimator::to_json(job.model).dump();

    if (!entry.contains("training"))
      return at_line(file_name, line, "/training", "required: batch_size, epochs, samples_per_epoch");
    auto training = estimator::parse_training_config(entry["training"], "/training");
    if (!training) return at_line(file_name, line, training.error().where, training.error().message);
    job.training = *training;

    if (entry.contains("constraints")) {
      const json& constraints = entry["constraints"];
      if (!constraints.is_object()) return at_line(file_name, line, "/constraints", "must be an object");
      for (const auto& [key, value] : constraints.items()) {
        const std::string pointer = "/constraints/" + key;
        if (!kConstraints.contains(key))
          return at_line(file_name, line, pointer,
                         "unknown field (known: devices, deadline_seconds, not_before_seconds, max_energy_joules, "
                         "max_slowdown)");
        if (key == "devices") {
          if (!value.is_array()) return at_line(file_name, line, pointer, "must be an array of device name patterns");
          for (std::size_t i = 0; i < value.size(); ++i) {
            if (!value[i].is_string() || value[i].get<std::string>().empty())
              return at_line(file_name, line, fmt::format("{}/{}", pointer, i), "must be a non-empty string");
            job.devices.push_back(value[i].get<std::string>());
          }
        } else if (key == "deadline_seconds") {
          job.deadline_seconds = positive_number(value);
          if (!job.deadline_seconds) return at_line(file_name, line, pointer, "must be a number of seconds > 0");
        } else if (key == "not_before_seconds") {
          job.not_before_seconds = positive_number(value);
          if (!job.not_before_seconds) return at_line(file_name, line, pointer, "must be a number of seconds > 0");
        } else if (key == "max_slowdown") {
          job.max_slowdown = positive_number(value);
          if (!job.max_slowdown || *job.max_slowdown > 10.0)
            return at_line(file_name, line, pointer,
                           "must be a fraction > 0 and at most 10 (0.1: at most 10 % slower at a knob setting)");
        } else {
          job.max_energy_joules = positive_number(value);
          if (!job.max_energy_joules) return at_line(file_name, line, pointer, "must be a number of joules > 0");
        }
      }
      if (job.not_before_seconds && job.deadline_seconds && *job.not_before_seconds >= *job.deadline_seconds)
        return at_line(file_name, line, "/constraints/not_before_seconds", "must be less than deadline_seconds");
    }
    if (entry.contains("priority")) {
      if (!entry["priority"].is_number_integer() || std::abs(entry["priority"].get<std::int64_t>()) > 1000000)
        return at_line(file_name, line, "/priority", "must be an integer from -1000000 to 1000000");
      job.priority = static_cast<int>(entry["priority"].get<std::int64_t>());
    }
    if (entry.contains("resources")) {
      const json& resources = entry["resources"];
      if (!resources.is_object()) return at_line(file_name, line, "/resources", "must be an object: {\"cores\": N}");
      for (const auto& [key, value] : resources.items()) {
        auto count = [](const json& number) {
          return number.is_number_integer() && number.get<std::int64_t>() >= 1 && number.get<std::int64_t>() <= 4096;
        };
        if (key == "cores" && value.is_object()) {
          if (!value.contains("min") || !value.contains("max") || value.size() != 2 || !count(value["min"]) ||
              !count(value["max"]) || value["max"].get<std::int64_t>() < value["min"].get<std::int64_t>())
            return at_line(file_name, line, "/resources/cores",
                           "a range must be {\"min\": a, \"max\": b}, whole numbers of cores with 1 <= a <= b <= 4096");
          job.cores = static_cast<int>(value["min"].get<std::int64_t>());
          job.cores_max = static_cast<int>(value["max"].get<std::int64_t>());
        } else if (key == "cores") {
          if (!count(value))
            return at_line(file_name, line, "/resources/cores", "must be a whole number of cores from 1 to 4096");
          job.cores = static_cast<int>(value.get<std::int64_t>());
        } else if (key == "gpus") {
          if (!value.is_number_integer() || value.get<std::int64_t>() < 1 || value.get<std::int64_t>() > 64)
            return at_line(file_name, line, "/resources/gpus", "must be a whole number of GPUs from 1 to 64");
          job.gpus = static_cast<int>(value.get<std::int64_t>());
        } else {
          return at_line(file_name, line, "/resources/" + key, "unknown field (known: cores, gpus)");
        }
      }
      if (job.cores > 0 && job.gpus > 0)
        return at_line(file_name, line, "/resources/gpus", "cores and gpus together: cores are a CPU's, gpus GPUs'");
    }
    for (const auto& [key, slot] : {std::pair{"owner", &job.owner}, std::pair{"project", &job.project}}) {
      if (!entry.contains(key)) continue;
      if (!entry[key].is_string() || entry[key].get<std::string>().empty())
        return at_line(file_name, line, fmt::format("/{}", key), "must be a non-empty string");
      *slot = entry[key].get<std::string>();
    }
    trace.jobs.push_back(std::move(job));
  }
  return trace;
}

Result<Trace> load_trace(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return make_error(ErrorCode::not_found, fmt::format("{}: cannot read the trace", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  const std::filesystem::path dir = path.parent_path();
  const ModelReader reader = [&dir](const std::string& relative) -> Result<nlohmann::json> {
    const std::filesystem::path file = dir / relative;
    std::ifstream model(file);
    if (!model) return make_error(ErrorCode::not_found, fmt::format("cannot read model spec {}", file.string()));
    try {
      return nlohmann::json::parse(model);
    } catch (const nlohmann::json::parse_error& error) {
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("model spec {} is not JSON: {}", file.string(), error.what()));
    }
  };
  return parse_trace(text.str(), path.string(), reader);
}

}  // namespace joule::simulator
