// joulectl: the command-line client of jouled's REST API.

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "joule/cli/command_docs.hpp"
#include "joule/cli/progress_line.hpp"
#include "joule/client/http_client.hpp"
#include "joule/common/sha256.hpp"

namespace {

using joule::cli::joules_text;
using joule::client::HttpClient;
using nlohmann::json;

struct Failure {
  std::string message;
};

std::string hex(const unsigned char* data, std::size_t size) {
  std::string out;
  for (std::size_t i = 0; i < size; ++i) out += fmt::format("{:02x}", data[i]);
  return out;
}

// Turns an HTTP answer into JSON, or a Failure carrying the problem's detail and pointer.
json expect_json(const joule::Result<joule::client::HttpReply>& reply) {
  if (!reply) throw Failure{reply.error().message};
  json body = json::parse(reply->body, nullptr, false);
  if (reply->status >= 400) {
    std::string message = body.is_object() && body.contains("detail") ? body["detail"].get<std::string>()
                                                                      : fmt::format("HTTP {}", reply->status);
    if (body.is_object() && body.contains("errors") && body["errors"].is_array() && !body["errors"].empty()) {
      const auto& first = body["errors"][0];
      if (first.contains("pointer")) message += fmt::format(" (at {})", first["pointer"].get<std::string>());
    }
    if (reply->status == 429 && reply->headers.contains("retry-after"))
      message += fmt::format("; retry after {} s", reply->headers.at("retry-after"));
    throw Failure{message};
  }
  if (body.is_discarded()) throw Failure{"jouled answered with something that is not JSON"};
  return body;
}

std::string text_or(const json& value, const std::string& fallback = "-") {
  if (value.is_null()) return fallback;
  if (value.is_string()) return value.get<std::string>();
  return value.dump();
}

std::string energy_text(const json& energy) {
  if (energy.is_null()) return "-";
  return fmt::format("{:.1f} J ({}{})", energy["joules"].get<double>(), energy["source"].get<std::string>(),
                     energy["measured"].get<bool>() ? "" : ", not measured");
}

// "of which 82.0 J and 4.1 s outside the steps (start-up 80.0 J per job, 0.5 J per epoch; from 12
// finished jobs)": an estimate row's job overhead line.
std::string overhead_text(const json& row) {
  const json& overhead = row["overhead"];
  return fmt::format(
      "of which {:.1f} J and {:.1f} s outside the training steps (start-up {:.1f} J per job, {:.1f} J per "
      "epoch; learnt from {} finished jobs)",
      overhead.value("joules", 0.0), overhead.value("seconds", 0.0), overhead.value("per_job_joules", 0.0),
      overhead.value("per_epoch_joules", 0.0), overhead.value("learnt_from", 0));
}

std::string seconds_text(const json& seconds) {
  return seconds.is_null() ? "-" : fmt::format("{:.1f}", seconds.get<double>());
}

// "v3, 42 samples, last probe 2026-..., held-out error 4.1 %; probing" from GET /v1/devices.
// The jobs on a device: the first, how many more, and on a device that shares its cores how
// many of them are held ("job-1 +2 [3/4 cores]").
std::string device_jobs_text(const json& device) {
  const json jobs = device.value("jobs", json::array());
  std::string text = jobs.empty() ? text_or(device["job"]) : jobs[0]["id"].get<std::string>();
  if (jobs.size() > 1) text += fmt::format(" +{}", jobs.size() - 1);
  if (device.contains("cores") && device["cores"].is_object())
    text += fmt::format(" [{}/{} cores]", device["cores"]["held"].get<int>(), device["cores"]["shared"].get<int>());
  return text;
}

std::string model_summary(const json& model) {
  std::string text = model.value("state", "none");
  if (model.contains("version")) text = fmt::format("v{}", model["version"].get<long long>());
  text += fmt::format(", {} samples", model.value("samples", 0));
  if (model.contains("source") && model["source"].is_string() && !model["source"].get<std::string>().empty())
    text += fmt::format(" ({})", model["source"].get<std::string>());
  if (model.contains("last_probe_ms") && model["last_probe_ms"].is_number()) {
    const auto ms = model["last_probe_ms"].get<long long>();
    const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    text += fmt::format(", last probe {:.0f} s ago", static_cast<double>(now - ms) / 1000.0);
  }
  if (model.contains("heldout_error") && model["heldout_error"].is_object())
    text += fmt::format(", held-out error {:.1f} %",
                        100.0 * model["heldout_error"]["median_abs_relative_error"].get<double>());
  if (model.contains("probing") && model["probing"].is_object()) {
    const auto& probing = model["probing"];
    text += "; " + probing.value("state", "");
    if (probing.contains("waiting")) text += " (" + probing["waiting"].get<std::string>() + ")";
    // Networks measured whole, and each family's whole-to-layers ratio learnt from them.
    if (const auto whole = probing.find("whole_networks");
        whole != probing.end() && whole->is_object() && whole->value("measured", 0) > 0) {
      text += fmt::format("; {} networks measured whole", (*whole)["measured"].get<long long>());
      const json gaps = whole->value("gaps", json::object());  // kept: items() of a temporary dangles
      for (const auto& [family, gap] : gaps.items())
        text += fmt::format(", {} ×{:.2f}", family, gap.value("joules_ratio", 1.0));
      // The knob settings measured (policy knobs.goal), and the one in force for a measurement.
      const json settings = whole->value("settings", json::array());
      for (const auto& setting : settings)
        text += fmt::format("{} {} ({} networks{})", &setting == &settings.front() ? "; at settings" : ",",
                            setting.value("label", ""), setting.value("networks", 0),
                            setting.value("response", false) ? ", response fitted" : "");
      if (const auto at = whole->find("measuring_at"); at != whole->end() && at->is_object())
        text += fmt::format("; measuring at {} now", at->value("label", ""));
    }
  }
  return text;
}

void print_probe_run(const json& run) {
  const auto& energy = run["energy"];
  fmt::print("probe run {} on {} ({}): {}; {} probes, {} pre-empted, {} failed, {:.1f} s in probes, {:.1f} J {}{}\n",
             run["id"].get<std::string>(), run["device"].get<std::string>(), run["reason"].get<std::string>(),
             run["state"].get<std::string>(), run["probes"].get<long long>(), run["preempted"].get<long long>(),
             run["failed"].get<long long>(), run["probe_seconds"].get<double>(), energy["joules"].get<double>(),
             energy["source"].get<std::string>(), energy["measured"].get<bool>() ? "" : " (modelled, not measured)");
  if (!run["message"].get<std::string>().empty()) fmt::print("  {}\n", run["message"].get<std::string>());
}

// One signal of GET /v1/signals: "carbon" (g/kWh) or "price" (its currency per kWh).
void print_signal(const std::string& kind, const json& signal) {
  const std::string state = signal["state"];
  const bool price = kind == "price";
  const std::string label = fmt::format("{}:", kind);
  if (state == "none") {
    fmt::print("{:<10} none ({})\n", label, signal.value("message", "not in jouled.toml"));
    return;
  }
  const std::string unit = price ? signal.value("unit", std::string("/kWh")) : "g/kWh";
  auto value = [&](double v) { return price ? fmt::format("{:.4g} {}", v, unit) : fmt::format("{:.0f} {}", v, unit); };
  fmt::print("{:<10} {} now ({}: {})\n", label, value(signal["value_now"].get<double>()), state,
             signal["in_force"].get<std::string>());
  if (signal.contains("begins"))
    fmt::print("loaded:    {} points, {} to {} (at {})\n", signal["points"].get<int>(),
               signal["begins"].get<std::string>(), signal["ends"].get<std::string>(), text_or(signal["loaded_at"]));
  if (signal.contains("lowest_ahead"))
    fmt::print("{:<10} {} from {}\n",
               price ? "cheapest:" : "cleanest:", value(signal["lowest_ahead"]["value"].get<double>()),
               signal["lowest_ahead"]["at"].get<std::string>());
  if (!signal["last_error"].is_null())
    fmt::print("last error ({} failed loads): {} at {}\n", signal["failures"].get<int>(),
               signal["last_error"].get<std::string>(), text_or(signal["last_error_at"]));
}

// A budget's figure in its unit: joules, grams of CO2e, or money in its currency.
std::string budget_amount(const json& budget, double amount) {
  const std::string unit = budget.value("unit", std::string("joules"));
  if (unit == "grams")
    return std::abs(amount) >= 1000.0 ? fmt::format("{:.3g} kg", amount / 1000.0) : fmt::format("{:.3g} g", amount);
  if (unit == "money")
    return fmt::format("{:.2f}{}", amount,
                       budget["currency"].is_string() ? " " + budget["currency"].get<std::string>() : "");
  return joules_text(amount);
}

// A query value with everything but unreserved characters and ':' percent-encoded (a "+01:00"
// offset would otherwise read back as a space).
std::string query_value(const std::string& text) {
  std::string out;
  for (const unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || c == ':')
      out += static_cast<char>(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

// GET /v1/usage as a table (or CSV): per group its jobs, device-hours, measured joules, joules by
// source, the estimates' mean error and grams of CO2e.
void print_usage(const json& report, bool csv) {
  const std::string group_by = report["group_by"].get<std::string>();
  auto sources = [](const json& row) {
    std::string text;
    for (const auto& [source, joules] : row["joules"]["by_source"].items())
      text += fmt::format("{}{} {}", text.empty() ? "" : ", ", source, joules_text(joules.get<double>()));
    return text.empty() ? std::string("-") : text;
  };
  auto error = [](const json& row) {
    return row["estimate"].is_null()
               ? std::string("-")
               : fmt::format("{:.1f}% ({} jobs)", 100.0 * row["estimate"]["mean_abs_error"].get<double>(),
                             row["estimate"]["jobs"].get<long long>());
  };
  if (csv) {
    fmt::print(
        "{},jobs,device_hours,measured_joules,joules_by_source,estimated_jobs,estimate_mean_abs_error,grams_co2e\n",
        group_by);
    for (const auto& row : report["rows"]) {
      std::string by_source;
      for (const auto& [source, joules] : row["joules"]["by_source"].items())
        by_source += fmt::format("{}{}={}", by_source.empty() ? "" : ";", source, joules.get<double>());
      fmt::print("{},{},{:.6f},{},{},{},{},{}\n", text_or(row[group_by]), row["jobs"].get<long long>(),
                 row["device_hours"].get<double>(), row["joules"]["measured"].get<double>(), by_source,
                 row["estimate"].is_null() ? 0 : row["estimate"]["jobs"].get<long long>(),
                 row["estimate"].is_null() ? std::string()
                                           : fmt::format("{}", row["estimate"]["mean_abs_error"].get<double>()),
                 row["carbon"].is_null() ? std::string() : fmt::format("{}", row["carbon"]["grams"].get<double>()));
    }
    return;
  }
  fmt::print("jobs that ended from {} to {}{}\n", report["from"].get<std::string>(), report["to"].get<std::string>(),
             report["owner"].is_null() ? "" : ", of " + report["owner"].get<std::string>());
  if (report["rows"].empty()) {
    fmt::print("none\n");
    return;
  }
  fmt::print("{:<24}  {:>6}  {:>9}  {:>10}  {:<30}  {:<20}  {}\n", "GROUP (" + group_by + ")", "JOBS", "DEV-HOURS",
             "MEASURED", "JOULES BY SOURCE", "ESTIMATE ERROR", "CO2E");
  for (const auto& row : report["rows"])
    fmt::print(
        "{:<24}  {:>6}  {:>9.2f}  {:>10}  {:<30}  {:<20}  {}\n", text_or(row[group_by]), row["jobs"].get<long long>(),
        row["device_hours"].get<double>(), joules_text(row["joules"]["measured"].get<double>()), sources(row),
        error(row),
        row["carbon"].is_null() ? std::string("-") : fmt::format("{:.1f} g", row["carbon"]["grams"].get<double>()));
}

void print_budgets(const json& view) {
  const auto& policy = view["policy"];
  fmt::print("policy: {} (objective {}, risk {:g})\n", policy["source"].get<std::string>(),
             policy["objective"].get<std::string>(), policy["risk"].get<double>());
  if (view["budgets"].empty()) fmt::print("no energy budgets\n");
  else {
    fmt::print("{:<16}  {:<22}  {:<15}  {:>10}  {:>10}  {:>10}  {:>10}  {}\n", "BUDGET", "SCOPE", "WINDOW", "LIMIT",
               "SPENT", "RESERVED", "REMAINING", "RESETS");
    for (const auto& budget : view["budgets"]) {
      std::string scope = budget["target"].get<std::string>().empty()
                              ? budget["scope"].get<std::string>()
                              : budget["scope"].get<std::string>() + " " + budget["target"].get<std::string>();
      // An owner's or project's budget counts only their jobs there.
      for (const char* whose : {"project", "owner"})
        if (budget.contains(whose) && budget[whose].is_string())
          scope = fmt::format("{} {}, {}", whose, budget[whose].get<std::string>(), scope);
      fmt::print("{:<16}  {:<22}  {:<15}  {:>10}  {:>10}  {:>10}  {:>10}  {}\n", budget["name"].get<std::string>(),
                 scope, budget["window"].get<std::string>(), budget_amount(budget, budget["limit"].get<double>()),
                 budget_amount(budget, budget["spent"].get<double>()),
                 budget_amount(budget, budget["reserved"].get<double>()),
                 budget_amount(budget, budget["remaining"].get<double>()), text_or(budget["resets_at"]));
      if (budget.value("uncounted_joules", 0.0) > 0.0)
        fmt::print("{:<16}  ({} ran with no signal to count it at)\n", "",
                   joules_text(budget["uncounted_joules"].get<double>()));
    }
  }
  for (const auto& cap : view["power_caps"])
    fmt::print("power cap {}: {:.1f} W of {:.1f} W ({} {}, averaged over {:.0f} s)\n", cap["name"].get<std::string>(),
               cap["power_watts"].get<double>(), cap["limit_watts"].get<double>(), cap["scope"].get<std::string>(),
               cap["target"].get<std::string>(), cap["average_seconds"].get<double>());
  for (const auto& floor : view["battery_floors"])
    fmt::print("battery floor {}: {} charge, floor {:.0f} % (+{:.0f} margin)\n", floor["name"].get<std::string>(),
               floor["charge_percent"].is_null() ? std::string("unknown")
                                                  : fmt::format("{:.0f} %", floor["charge_percent"].get<double>()),
               floor["floor_percent"].get<double>(), floor["margin_percent"].get<double>());
  fmt::print("({})\n", view["note"].get<std::string>());
}

void print_slurm(const json& view) {
  if (!view.contains("slurm")) return;
  const auto& slurm = view["slurm"];
  fmt::print("slurm: {} job{} handed over{}\n", slurm["jobs_handed_over"].get<long long>(),
             slurm["jobs_handed_over"] == 1 ? "" : "s",
             slurm["error"].is_null() ? "" : "; last error: " + slurm["error"].get<std::string>());
  for (const auto& type : slurm["node_types"])
    fmt::print("  {:<20} partition {:<10} {} slot{}, model {}\n", type["node"].get<std::string>(),
               type["partition"].get<std::string>().empty() ? "(default)" : type["partition"].get<std::string>(),
               type["slots"].get<int>(), type["slots"] == 1 ? "" : "s", type["model"].get<std::string>());
}

void print_nodes(const json& view) {
  const std::string role = view.value("role", "standalone");
  if (role != "coordinator") {
    fmt::print("this jouled is {}{}\n", role == "agent" ? "an agent of " : "standalone",
               role == "agent" ? view["coordinator"].get<std::string>() : "");
    if (role == "agent")
      fmt::print("last sync: {}{}\n", text_or(view["last_sync"]),
                 view["error"].is_null() ? "" : "; last error: " + view["error"].get<std::string>());
    print_slurm(view);
    return;
  }
  fmt::print("{:<16}  {:<8}  {:>9}  {:>9}  {:>4}  {:<40}  {}\n", "NODE", "STATE", "HEARD", "POWER W", "JOBS", "DEVICES",
             "BUDGETS (remaining)");
  for (const auto& node : view["nodes"]) {
    std::string devices;
    for (const auto& device : node["devices"]) {
      if (!devices.empty()) devices += ", ";
      devices += device["name"].get<std::string>() + " (" + device["source"].get<std::string>() +
                 (device["measured"].get<bool>() ? "" : "*") + ")";
    }
    std::string budgets;
    for (const auto& budget : node["budgets"]) {
      if (!budgets.empty()) budgets += ", ";
      budgets += fmt::format("{} {}", budget["name"].get<std::string>(),
                             budget_amount(budget, budget.value("remaining", 0.0)));
    }
    const std::string heard = node["seconds_since_heartbeat"].is_null()
                                  ? "never"
                                  : fmt::format("{:.1f}s ago", node["seconds_since_heartbeat"].get<double>());
    fmt::print("{:<16}  {:<8}  {:>9}  {:>9.1f}  {:>4}  {:<40}  {}\n", node["name"].get<std::string>(),
               node["state"].get<std::string>(), heard, node["power_watts"].get<double>(),
               node["running_jobs"].get<long long>(), devices, budgets.empty() ? "-" : budgets);
  }
  fmt::print("(a lost node's jobs are queued again, or fail with restart = \"fail\"; * = not a measurement)\n");
  print_slurm(view);
}

void print_jobs_table(const json& jobs) {
  fmt::print("{:<36}  {:<20}  {:<10}  {:<6}  {:>9}  {}\n", "ID", "NAME", "STATE", "DEVICE", "SECONDS", "ENERGY");
  for (const auto& job : jobs) {
    std::string name = job["name"].get<std::string>();
    if (name.size() > 20) name = name.substr(0, 19) + "~";
    fmt::print("{:<36}  {:<20}  {:<10}  {:<6}  {:>9}  {}\n", job["id"].get<std::string>(), name,
               job["state"].get<std::string>(), text_or(job["device"]), seconds_text(job["seconds"]),
               energy_text(job["energy"]));
  }
}

void print_job(const json& job) {
  fmt::print("id:        {}\n", job["id"].get<std::string>());
  fmt::print("name:      {}\n", job["name"].get<std::string>());
  if (job.contains("owner")) fmt::print("owner:     {}\n", job["owner"].get<std::string>());
  if (job.contains("project") && job["project"].is_string())
    fmt::print("project:   {}\n", job["project"].get<std::string>());
  fmt::print("state:     {}{}\n", job["state"].get<std::string>(),
             job["cancel_requested"].get<bool>() && job["state"] != "cancelled" ? " (cancel requested)" : "");
  fmt::print("device:    {}\n", text_or(job["device"]));
  if (job.contains("devices") && job["devices"].is_array())
    fmt::print("gpus:      {}\n", fmt::join(job["devices"].get<std::vector<std::string>>(), ", "));
  if (job.contains("cores") && job["cores"].is_number_integer()) fmt::print("cores:     {}\n", job["cores"].get<int>());
  fmt::print("submitted: {}\n", job["submitted_at"].get<std::string>());
  fmt::print("started:   {}\n", text_or(job["started_at"]));
  fmt::print("finished:  {}\n", text_or(job["finished_at"]));
  fmt::print("seconds:   {}\n", seconds_text(job["seconds"]));
  fmt::print("exit code: {}\n", text_or(job["exit_code"]));
  if (!job["reason"].get<std::string>().empty()) fmt::print("reason:    {}\n", job["reason"].get<std::string>());
  if (job.contains("waiting")) {
    const auto& waiting = job["waiting"];
    fmt::print("waiting:   {}\n", waiting["message"].get<std::string>());
    if (waiting.contains("retry_at")) fmt::print("           expected to fit again at {}\n", waiting["retry_at"].get<std::string>());
  }
  if (job.contains("throttle")) {
    const auto& throttle = job["throttle"];
    fmt::print("throttled: {}{}{}\n", throttle["paused"].get<bool>() ? "paused " : "",
               throttle["cpu_quota"].is_null() ? "" : fmt::format("cpu quota {:.2f} CPUs ", throttle["cpu_quota"].get<double>()),
               throttle["gpu_power_limit_watts"].is_null()
                   ? ""
                   : fmt::format("GPU limit {:.0f} W", throttle["gpu_power_limit_watts"].get<double>()));
  }
  if (job.contains("knobs")) {
    const auto& knobs = job["knobs"];
    std::string asked;
    for (const auto& [name, value] : knobs["requested"].items())
      asked += fmt::format("{}{} {}", asked.empty() ? "" : ", ", name,
                           value.is_string() ? value.get<std::string>() : fmt::format("{:g}", value.get<double>()));
    if (const auto chosen = knobs.find("chosen"); chosen != knobs.end() && chosen->is_object()) {
      const auto& predicted = (*chosen)["predicted"];
      asked = fmt::format("{} {} chosen ({}): predicted {:.0f} % fewer joules, {:.0f} % more time",
                          chosen->value("knob", ""), chosen->value("label", ""), chosen->value("goal", ""),
                          100.0 * predicted.value("energy_saving", 0.0), 100.0 * predicted.value("slowdown", 0.0));
      if (const auto check = chosen->find("check"); check != chosen->end() && check->is_object())
        asked += "; checked: " + check->value("why", "");
      if (const auto measured = chosen->find("measured"); measured != chosen->end() && measured->is_object())
        asked += fmt::format("; used {:.4g} J {}, {:.2f}× predicted", measured->value("joules", 0.0),
                             measured->value("source", ""), measured->value("ratio_to_predicted", 0.0));
    }
    fmt::print("knobs:     {}; in force: {}\n", asked, text_or(knobs["in_force"]));
  }
  if (job.contains("progress")) {
    const auto& progress = job["progress"];
    std::string figures;
    if (progress.contains("loss")) figures += fmt::format(", loss {:.4g}", progress["loss"].get<double>());
    if (progress.contains("accuracy"))
      figures += fmt::format(", held-out accuracy {:.1f} %", 100.0 * progress["accuracy"].get<double>());
    fmt::print("progress:  epoch {} of {}{}\n", progress["epoch"].get<int>(), progress["epochs"].get<int>(), figures);
    if (progress.contains("firing_rates")) {
      std::string rates;
      for (const auto& [layer, rate] : progress["firing_rates"].items())
        rates += fmt::format("{}{} {:.1f} %", rates.empty() ? "" : ", ", layer, 100.0 * rate.get<double>());
      fmt::print("firing:    {}\n", rates);
    }
  }
  if (job.contains("builtin") && job["builtin"].contains("weights")) {
    const auto& builtin = job["builtin"];
    fmt::print("weights:   {}{}{}\n", builtin["weights"].get<std::string>(),
               builtin.contains("node") ? " on " + builtin["node"].get<std::string>() : "",
               builtin.value("weights_saved", true) ? "" : " (none saved yet)");
  }
  if (job.contains("projection")) {
    const auto& projection = job["projection"];
    fmt::print("projected: {:.1f} ± {:.1f} J in all ({}, {} stable epochs after epoch {}; {} joules)\n",
               projection["joules"]["mean"].get<double>(), projection["joules"]["std"].get<double>(),
               projection["method"].get<std::string>(), projection["stable_epochs"].get<int>(),
               projection.value("stable_from_epoch", 0), text_or(projection["source"]));
  }
  fmt::print("energy:    {}\n", energy_text(job["energy"]));
  if (!job["energy"].is_null() && !job["energy"]["measured"].get<bool>())
    fmt::print("           (a model's figure from CPU time, not a meter reading)\n");
  if (job.contains("carbon")) {
    const auto& carbon = job["carbon"];
    fmt::print("carbon:    {:.3g} g CO2e at {:.0f} g/kWh over its run ({}; {} joules)\n", carbon["grams"].get<double>(),
               carbon["intensity"].get<double>(), carbon["signal"].get<std::string>(),
               carbon["joules_source"].get<std::string>());
  }
  if (job.contains("cost")) {
    const auto& cost = job["cost"];
    fmt::print("cost:      {:.4g} {} at {:.4g} per kWh over its run ({}; {} joules)\n", cost["amount"].get<double>(),
               cost["currency"].get<std::string>(),
               cost["price_per_kwh"].is_null() ? 0.0 : cost["price_per_kwh"].get<double>(),
               cost["signal"].get<std::string>(), cost["joules_source"].get<std::string>());
  }
  if (job["estimate"].is_array() && !job["estimate"].empty()) {
    fmt::print("estimate:\n");
    for (const auto& row : job["estimate"]) {
      if (row["status"] != "ok") {
        fmt::print("  {:<20} none: {}\n", row["device"].get<std::string>(), row["detail"].get<std::string>());
        continue;
      }
      fmt::print("  {:<20} {:.1f} ± {:.1f} J, {:.1f} s ({} data; FLOPs baseline {:.1f} J){}\n",
                 row["device"].get<std::string>(), row["joules"]["mean"].get<double>(),
                 row["joules"]["std"].get<double>(), row["seconds"]["mean"].get<double>(),
                 row["source"].get<std::string>(), row["baseline"]["joules"].get<double>(),
                 row["warnings"].empty() ? "" : "  [some layers far from probed ones]");
      if (row.contains("overhead")) fmt::print("  {:<20} {}\n", "", overhead_text(row));
      if (row.contains("carbon"))
        fmt::print("  {:<20} {:.3g} ± {:.2g} g CO2e if it started now ({:.0f} g/kWh)\n", "",
                   row["carbon"]["grams"].get<double>(), row["carbon"]["grams_std"].get<double>(),
                   row["carbon"]["intensity"].get<double>());
      if (row.contains("cost"))
        fmt::print("  {:<20} {:.4g} ± {:.2g} {} if it started now ({:.4g} per kWh)\n", "",
                   row["cost"]["cost"].get<double>(), row["cost"]["cost_std"].get<double>(),
                   row["cost"]["currency"].get<std::string>(), row["cost"]["price_per_kwh"].get<double>());
    }
  } else {
    fmt::print("estimate:  none (the job has no model spec and training config)\n");
  }
  if (job.contains("estimate_error")) {
    const auto& error = job["estimate_error"];
    fmt::print("vs metered: {:.1f} J metered, {:.1f} ± {:.1f} J estimated: {:+.1f} % ({})\n",
               error["metered_joules"].get<double>(), error["estimated_joules"].get<double>(),
               error["estimated_std"].get<double>(), 100.0 * error["relative"].get<double>(),
               error["source"].get<std::string>());
  }
  if (job.contains("events")) {
    fmt::print("events:\n");
    for (const auto& event : job["events"]) {
      fmt::print("  {}  {:<10} {}\n", event["at"].get<std::string>(), event["state"].get<std::string>(),
                 event["message"].get<std::string>());
    }
  }
}

// A built-in job's relative dataset paths mean the job file's directory: it becomes the job's
// run.workdir (jouled reads relative paths from there), unless the job names one. True when set.
bool read_from_job_directory(json& body, const std::filesystem::path& directory) {
  if (!body.is_object() || !body.contains("run") || !body["run"].is_object()) return false;
  json& run = body["run"];
  if (!run.contains("builtin") || run.contains("workdir") || !run["builtin"].is_object()) return false;
  const json dataset = run["builtin"].value("dataset", json::object());
  bool relative = false;
  const auto look = [&](const json& value) {
    if (value.is_string() && !value.get<std::string>().empty() && value.get<std::string>()[0] != '/') relative = true;
  };
  for (const char* key : {"images", "labels", "file"})
    if (dataset.is_object() && dataset.contains(key)) look(dataset[key]);
  if (dataset.is_object() && dataset.contains("files") && dataset["files"].is_array())
    for (const auto& each : dataset["files"]) look(each);
  if (!relative) return false;
  run["workdir"] = directory.lexically_normal().string();
  return true;
}

std::string read_input(const std::string& file) {
  std::stringstream text;
  if (file == "-") {
    text << std::cin.rdbuf();
  } else {
    std::ifstream in(file);
    if (!in) throw Failure{fmt::format("cannot read {}", file)};
    text << in.rdbuf();
  }
  return text.str();
}

bool is_terminal(const std::string& state) { return state == "succeeded" || state == "failed" || state == "cancelled"; }

long long unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// joulectl advise: POST /v1/advise, the layers ranked by their share of the energy with the
// widths the advice gives them, the saving on every device, and the advised spec written out.
int advise_command(const HttpClient& client, const std::string& model_file, double target, std::int64_t batch_size,
                   std::int64_t samples_per_epoch, const std::string& device, double min_multiplier,
                   const std::string& out_file, bool as_json) {
  json model = json::parse(read_input(model_file), nullptr, false);
  if (model.is_discarded()) throw Failure{fmt::format("{} is not valid JSON", model_file)};
  if (model.contains("model")) model = model["model"];  // a job file
  json request = {{"model", model},
                  {"training",
                   {{"batch_size", batch_size},
                    {"samples_per_epoch", samples_per_epoch > 0 ? samples_per_epoch : 100 * batch_size}}},
                  {"target", target},
                  {"min_multiplier", min_multiplier}};
  if (!device.empty()) request["device"] = device;
  const json answer = expect_json(client.request("POST", "/v1/advise", request.dump()));
  if (!out_file.empty()) {
    std::ofstream out(out_file);
    out << answer["model"].dump(2) << "\n";
    if (!out) throw Failure{fmt::format("cannot write {}", out_file)};
  }
  if (as_json) {
    fmt::print("{}\n", answer.dump(2));
    return answer["reached"].get<bool>() ? 0 : 1;
  }
  fmt::print("on {} ({} data): {:.1f} % of {:.1f} J saved (target {:.0f} %), {} -> {} parameters\n",
             answer["device"].get<std::string>(), answer["source"].get<std::string>(),
             100.0 * answer["saving"].get<double>(), answer["original"]["joules"]["mean"].get<double>(),
             100.0 * answer["target"].get<double>(), answer["original"]["parameters"].get<long long>(),
             answer["advised"]["parameters"].get<long long>());
  // The layers by their share of the energy, the costliest first; those under 1 % that keep
  // their width are left out.
  std::vector<json> layers(answer["layers"].begin(), answer["layers"].end());
  std::stable_sort(layers.begin(), layers.end(), [](const json& a, const json& b) {
    return a["energy_share"].get<double>() > b["energy_share"].get<double>();
  });
  fmt::print("{:>3}  {:<30}  {:>7}  {:<14}  {}\n", "#", "LAYER", "ENERGY", "WIDTH", "");
  for (const auto& layer : layers) {
    const bool narrowed = layer.contains("width") && layer["advised_width"] != layer["width"];
    if (!narrowed && layer["energy_share"].get<double>() < 0.01) continue;
    std::string label = layer["type"].get<std::string>();
    if (layer.contains("name")) label += " \"" + layer["name"].get<std::string>() + "\"";
    std::string width = layer.contains("width") ? fmt::format("{} -> {}", layer["width"].get<long long>(),
                                                              layer["advised_width"].get<long long>())
                                                : "-";
    fmt::print("{:>3}  {:<30}  {:>6.1f}%  {:<14}  {}\n", layer["index"].get<int>(), label,
               100.0 * layer["energy_share"].get<double>(), width, layer.value("fixed_because", ""));
  }
  for (const auto& row : answer["devices"]) {
    if (row["status"] != "ok") {
      fmt::print("{}: no estimate ({})\n", row["device"].get<std::string>(), row.value("detail", "no energy model"));
      continue;
    }
    fmt::print("{}: {:.1f} J -> {:.1f} J, {:.1f} % saved ({})\n", row["device"].get<std::string>(),
               row["original_joules"]["mean"].get<double>(), row["advised_joules"]["mean"].get<double>(),
               100.0 * row["saving"].get<double>(), row["source"].get<std::string>());
  }
  for (const auto& warning : answer["advised"]["warnings"]) fmt::print("warning: {}\n", warning.get<std::string>());
  if (!out_file.empty()) fmt::print("advised model spec written to {}\n", out_file);
  if (!answer["reached"].get<bool>()) {
    fmt::print(stderr, "joulectl: {}\n", answer["detail"].get<std::string>());
    return 1;
  }
  return 0;
}

// What `joulectl --man-page` says besides the command tree (packaging/ installs the page).
joule::cli::ManPage man_page() {
  joule::cli::ManPage page;
  page.name = "joulectl";
  page.source = "joule " JOULE_VERSION;
  page.description = {
      "joulectl is the command-line client of jouled, the daemon of Joule, an energy-aware scheduler for "
      "deep-learning training jobs. It submits jobs and shows them with their energy (metered, with the meter it "
      "came from, beside the estimate made at submission), the node's devices and energy models, probe runs, "
      "budgets, power caps and battery floors, and a coordinator's nodes. It speaks jouled's REST API (/v1); "
      "--json prints the API's JSON instead of tables.",
      "While submit --wait and probe --wait wait, a progress line on standard error shows the job's state, "
      "epoch k of N and energy so far (a probe run's time, probes and energy): rewritten in place on a terminal, "
      "otherwise one line per change of state. Standard output keeps the final report (or JSON) alone.",
      "Errors print one line on standard error and exit 1."};
  page.sections = {
      {"ENVIRONMENT",
       {{"JOULE_SERVER", "jouled's URL where --server is not given (default http://127.0.0.1:8571)."},
        {"JOULE_TOKEN",
         "The API bearer token where --token is not given. Without a token, a client on loopback is known by its "
         "local user."},
        {"JOULE_CA_FILE", "CA certificate(s) to verify an https:// server with, where --ca-file is not given."}}},
      {"EXIT STATUS",
       {{"0", "Done; for submit --wait, the job succeeded; for probe --wait, the run did not fail."},
        {"1",
         "An error (jouled's answer, no connection, bad input), or with --wait a job that failed or was "
         "cancelled, or a probe run that failed."},
        {"100 and above", "The command line could not be parsed (CLI11's codes); the message says why."}}},
      {"EXAMPLES",
       {{"joulectl submit --wait job.json", "Submit a job, follow it, and show its state, seconds and joules."},
        {"joulectl job ID", "One job with its event history, and why it waits."},
        {"joulectl probe --device cpu --seconds 120 --wait", "Probe the CPU now and show what it learnt."},
        {"joulectl --json jobs --state running", "The running jobs as the API's JSON."},
        {"joulectl advise model.json --target 0.5 --out narrow.json",
         "Which layers to narrow to save half of the model's estimated energy, and the narrowed spec."},
        {"source <(joulectl completion bash)",
         "Completion in the current shell, where the package's completion file is not installed."}}},
      {"SEE ALSO", {{"", "jouled(1), joule-sim(1); joule-worker --help."}}}};
  return page;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"joulectl: submit and watch training jobs on a jouled node"};
  app.require_subcommand(1);
  std::string server = std::getenv("JOULE_SERVER") ? std::getenv("JOULE_SERVER") : "http://127.0.0.1:8571";
  std::string token = std::getenv("JOULE_TOKEN") ? std::getenv("JOULE_TOKEN") : "";
  bool as_json = false;
  app.add_option("--server", server, "jouled's URL (env JOULE_SERVER; default http://127.0.0.1:8571)")
      ->type_name("URL");
  app.add_option("--token", token, "API bearer token (env JOULE_TOKEN)")->type_name("TOKEN");
  std::string ca_file = std::getenv("JOULE_CA_FILE") ? std::getenv("JOULE_CA_FILE") : "";
  app.add_option("--ca-file", ca_file,
                 "CA certificate(s) to verify an https:// server with (env JOULE_CA_FILE; default: the system's)")
      ->type_name("FILE");
  app.add_flag("--json", as_json, "print the API's JSON instead of tables");
  app.set_version_flag("--version", JOULE_VERSION);
  joule::cli::add_man_page_flag(app, man_page());

  std::string file;
  bool wait = false;
  double wait_timeout = 0;
  auto* submit = app.add_subcommand(
      "submit",
      "submit a job file (JSON; - reads stdin); a run.builtin job's relative dataset paths are read from the "
      "file's directory (its run.workdir, unless it names one)");
  submit->add_option("FILE", file, "job JSON")->required()->type_name("FILE");
  submit->add_flag("--wait", wait,
                   "wait until the job ends and print how it went; meanwhile its state, epoch and energy so far on "
                   "standard error");
  submit->add_option("--timeout", wait_timeout, "with --wait: give up after this many seconds (0: never)")
      ->type_name("SECONDS");
  std::string submit_project;
  submit
      ->add_option("--project", submit_project,
                   "account the job to this project (policies.d [[projects]]; replaces the file's \"project\")")
      ->type_name("NAME");
  int submit_cores = 0;
  submit
      ->add_option("--cores", submit_cores,
                   "give the job this many CPUs of its own (resources.cores; replaces the file's)")
      ->check(CLI::PositiveNumber)
      ->type_name("N");
  int submit_gpus = 0;
  submit
      ->add_option("--gpus", submit_gpus,
                   "run the job on this many GPUs of one model at once (resources.gpus; replaces the file's): a "
                   "data-parallel job, started with the environment torchrun and DDP read")
      ->check(CLI::PositiveNumber)
      ->type_name("N");

  std::string state;
  std::size_t limit = 0;
  auto* jobs = app.add_subcommand("jobs", "list jobs");
  jobs->add_option("--state", state, "only jobs in this state")->type_name("STATE");
  jobs->add_option("--limit", limit, "at most this many")->type_name("N");

  std::string id;
  auto* job = app.add_subcommand("job", "show one job with its history");
  job->add_option("ID", id, "job id")->required();
  auto* cancel = app.add_subcommand("cancel", "cancel a job (running ones get TERM, then KILL)");
  cancel->add_option("ID", id, "job id")->required();
  bool stderr_stream = false;
  std::size_t tail = 0;
  auto* pause_cmd = app.add_subcommand("pause", "pause a running job (SIGSTOP, or scontrol suspend on Slurm)");
  std::string pause_id;
  pause_cmd->add_option("ID", pause_id, "job id")->required();
  auto* resume_cmd = app.add_subcommand("resume", "resume a job paused by hand");
  std::string resume_id;
  resume_cmd->add_option("ID", resume_id, "job id")->required();
  auto* logs = app.add_subcommand("logs", "print a job's output");
  logs->add_option("ID", id, "job id")->required();
  logs->add_flag("--stderr", stderr_stream, "standard error instead of standard output");
  logs->add_option("--tail", tail, "only the last N bytes")->type_name("N");
  auto* devices = app.add_subcommand("devices", "devices of the node, their meters and power");
  std::string model_file, device_pattern;
  std::int64_t batch_size = 32, epochs = 1, samples_per_epoch = 0;
  auto* estimate = app.add_subcommand("estimate", "estimate a model's training energy on this node's devices");
  estimate->add_option("MODEL", model_file, "model spec JSON (- reads stdin)")->required()->type_name("FILE");
  estimate->add_option("--batch-size", batch_size, "training batch size")->check(CLI::PositiveNumber)->type_name("N");
  estimate->add_option("--epochs", epochs, "epochs")->check(CLI::PositiveNumber)->type_name("N");
  estimate->add_option("--samples-per-epoch", samples_per_epoch, "samples per epoch")
      ->required()
      ->check(CLI::PositiveNumber)
      ->type_name("N");
  estimate->add_option("--device", device_pattern, "only devices matching this pattern (e.g. cuda:*)")
      ->type_name("PATTERN");
  std::string estimate_runtime = "none";
  estimate
      ->add_option("--runtime", estimate_runtime,
                   "what the training loop runs in: python adds the device's measured interpreter start-up and "
                   "per-step cost; none (a built-in job) adds nothing")
      ->check(CLI::IsMember({"python", "none"}))
      ->capture_default_str();
  double advise_target = 0.0, min_multiplier = 0.5;
  std::string advise_device, advise_out;
  std::int64_t advise_samples = 0;
  auto* advise = app.add_subcommand(
      "advise", "which layers to narrow to save a share of a model's estimated training energy (pruning advice)");
  advise->add_option("MODEL", model_file, "model spec JSON, or a job file with one (- reads stdin)")
      ->required()
      ->type_name("FILE");
  advise->add_option("--target", advise_target, "share of the estimated energy to save, e.g. 0.5")
      ->required()
      ->check(CLI::Range(0.0, 1.0))
      ->type_name("SHARE");
  advise->add_option("--batch-size", batch_size, "training batch size")->check(CLI::PositiveNumber)->type_name("N");
  advise
      ->add_option("--samples-per-epoch", advise_samples, "samples per epoch (default 100 batches; savings are ratios)")
      ->check(CLI::PositiveNumber)
      ->type_name("N");
  advise->add_option("--device", advise_device, "the device whose model advises (default: the first with one)")
      ->type_name("DEVICE");
  advise
      ->add_option("--min-multiplier", min_multiplier,
                   "narrowest width multiplier, in eighths (default 0.5: narrower is extrapolated)")
      ->check(CLI::Range(0.125, 1.0))
      ->type_name("M");
  advise->add_option("--out", advise_out, "write the advised model spec to this file")->type_name("FILE");
  double probe_seconds = 60.0;
  std::vector<std::string> probe_models;
  auto* probe = app.add_subcommand("probe", "probe a device now to learn its energy model (joule-worker trains small networks)");
  probe->add_option("--device", device_pattern, "device to probe, e.g. cpu or cuda:0")->required()->type_name("DEVICE");
  probe->add_option("--seconds", probe_seconds, "how long to probe (default 60)")
      ->check(CLI::PositiveNumber)
      ->type_name("SECONDS");
  probe->add_option("--model", probe_models, "also learn the layers of this model spec (repeatable)")
      ->type_name("FILE");
  probe->add_option("--batch-size", batch_size, "batch size of the --model specs")
      ->check(CLI::PositiveNumber)
      ->type_name("N");
  probe->add_flag("--wait", wait,
                  "wait until the run ends and print what it learnt; meanwhile its time, probes and energy on "
                  "standard error");
  auto* probes = app.add_subcommand("probes", "list probe runs (background, requested, re-probes)");
  auto* nodes = app.add_subcommand("nodes", "the cluster's nodes: state, last heartbeat, devices, power and budgets");
  auto* budgets = app.add_subcommand("budgets", "energy budgets, power caps and battery floors: limit, spent, reserved, remaining");
  auto* usage_cmd = app.add_subcommand(
      "usage", "what finished jobs used, per owner, project, device, node or day (your own jobs unless admin)");
  std::string usage_from, usage_to, usage_group = "owner", usage_owner;
  bool usage_csv = false;
  usage_cmd->add_option("--from", usage_from, "jobs that ended from then (RFC 3339; default: this month's start, UTC)")
      ->type_name("TIME");
  usage_cmd->add_option("--to", usage_to, "up to then (RFC 3339; default: now)")->type_name("TIME");
  usage_cmd->add_option("--group-by", usage_group, "owner (default), project, device, node or day")
      ->check(CLI::IsMember({"owner", "project", "device", "node", "day"}))
      ->type_name("GROUP");
  usage_cmd->add_option("--owner", usage_owner, "only this owner's jobs (admins)")->type_name("OWNER");
  usage_cmd->add_flag("--csv", usage_csv, "comma-separated values, one row per group");
  auto* signals = app.add_subcommand(
      "signals", "the carbon-intensity and price signals in force ([carbon], [price]) and their last loads");
  auto* token_cmd = app.add_subcommand("token", "API tokens");
  token_cmd->require_subcommand(1);
  auto* token_new = token_cmd->add_subcommand("new", "print a new random token and the config line with its hash");
  auto* token_hash = token_cmd->add_subcommand("hash", "print the SHA-256 of a token read from stdin");
  std::string shell;
  auto* completion = app.add_subcommand(
      "completion", "print a shell completion script for joulectl (bash): source <(joulectl completion bash)");
  completion->add_option("SHELL", shell, "the shell")->required()->check(CLI::IsMember({"bash"}));
  CLI11_PARSE(app, argc, argv);

  try {
    if (completion->parsed()) {
      fmt::print("{}", joule::cli::bash_completion(app, "joulectl"));
      return 0;
    }
    if (token_new->parsed()) {
      unsigned char bytes[32];
      if (RAND_bytes(bytes, sizeof bytes) != 1) throw Failure{"no randomness available"};
      const std::string fresh = hex(bytes, sizeof bytes);
      fmt::print("token:  {}\nconfig: [auth] token_sha256 = [\"{}\"]\n", fresh, joule::sha256_hex(fresh));
      return 0;
    }
    if (token_hash->parsed()) {
      std::string line;
      std::getline(std::cin, line);
      fmt::print("{}\n", joule::sha256_hex(line));
      return 0;
    }
    auto url = joule::client::parse_server_url(server);
    if (!url) throw Failure{url.error().message};
    const HttpClient client(*url, token, std::chrono::seconds(30), joule::client::ClientTls{ca_file});

    if (submit->parsed()) {
      std::string text = read_input(file);
      json body = json::parse(text, nullptr, false);
      if (body.is_discarded()) throw Failure{fmt::format("{} is not valid JSON", file)};
      if (file != "-" && read_from_job_directory(body, std::filesystem::absolute(file).parent_path())) text = body.dump();
      if (!submit_project.empty() && body.is_object()) {
        body["project"] = submit_project;
        text = body.dump();
      }
      // A "resources" that is not an object is left for jouled to refuse, naming it.
      const bool resources_object = body.is_object() && (!body.contains("resources") || body["resources"].is_object());
      if (submit_cores > 0 && resources_object) {
        body["resources"]["cores"] = submit_cores;
        text = body.dump();
      }
      if (submit_gpus > 0 && resources_object) {
        body["resources"]["gpus"] = submit_gpus;
        text = body.dump();
      }
      json accepted = expect_json(client.request("POST", "/v1/jobs", text));
      const std::string job_id = accepted["id"].get<std::string>();
      if (!wait) {
        if (as_json)
          fmt::print("{}\n", accepted.dump(2));
        else
          fmt::print("submitted {} ({}): {}\n", job_id, accepted["name"].get<std::string>(),
                     accepted["state"].get<std::string>());
        return 0;
      }
      const auto started = std::chrono::steady_clock::now();
      json current = accepted;
      auto progress = joule::cli::ProgressLine::for_stderr(std::cerr);
      progress.show(joule::cli::job_progress_key(current), joule::cli::job_progress_text(current));
      while (!is_terminal(current["state"].get<std::string>())) {
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        if (wait_timeout > 0 && waited > wait_timeout)
          throw Failure{
              fmt::format("job {} is still {} after {} s", job_id, current["state"].get<std::string>(), wait_timeout)};
        // Short jobs end promptly; a long one is asked once a second.
        std::this_thread::sleep_for(std::chrono::milliseconds(waited < 5.0 ? 200 : 1000));
        current = expect_json(client.request("GET", "/v1/jobs/" + job_id));
        progress.show(joule::cli::job_progress_key(current), joule::cli::job_progress_text(current));
      }
      progress.finish();
      if (as_json)
        fmt::print("{}\n", current.dump(2));
      else
        print_job(current);
      return current["state"] == "succeeded" ? 0 : 1;
    }
    if (jobs->parsed()) {
      // jouled answers at most 1,000 jobs at a time; the pages are followed up to --limit.
      constexpr std::size_t kPage = 1000;
      json listed = {{"jobs", json::array()}, {"total", 0}};
      std::string after;
      do {
        const std::size_t wanted = limit > 0 ? std::min(kPage, limit - listed["jobs"].size()) : kPage;
        std::string target = "/v1/jobs?limit=" + std::to_string(wanted);
        if (!state.empty()) target += "&state=" + state;
        if (!after.empty()) target += "&after=" + after;
        json page = expect_json(client.request("GET", target));
        for (auto& job : page["jobs"]) listed["jobs"].push_back(std::move(job));
        listed["total"] = page["total"];
        after = page.value("next", json(nullptr)).is_string() ? page["next"].get<std::string>() : "";
      } while (!after.empty() && (limit == 0 || listed["jobs"].size() < limit));
      if (as_json)
        fmt::print("{}\n", listed.dump(2));
      else
        print_jobs_table(listed["jobs"]);
      return 0;
    }
    if (usage_cmd->parsed()) {
      // Up to the next whole second: a job that ended a moment ago is in "now"'s report.
      const auto now = std::chrono::system_clock::now() + std::chrono::seconds(1);
      const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
      std::tm utc{};
      ::gmtime_r(&seconds, &utc);
      if (usage_to.empty()) usage_to = fmt::format("{:%Y-%m-%dT%H:%M:%S}Z", utc);
      if (usage_from.empty()) usage_from = fmt::format("{:04}-{:02}-01T00:00:00Z", utc.tm_year + 1900, utc.tm_mon + 1);
      std::string target = fmt::format("/v1/usage?from={}&to={}&group_by={}", query_value(usage_from),
                                       query_value(usage_to), usage_group);
      if (!usage_owner.empty()) target += "&owner=" + query_value(usage_owner);
      json report = expect_json(client.request("GET", target));
      if (as_json)
        fmt::print("{}\n", report.dump(2));
      else
        print_usage(report, usage_csv);
      return 0;
    }
    if (budgets->parsed()) {
      json view = expect_json(client.request("GET", "/v1/budgets"));
      if (as_json)
        fmt::print("{}\n", view.dump(2));
      else
        print_budgets(view);
      return 0;
    }
    if (signals->parsed()) {
      json view = expect_json(client.request("GET", "/v1/signals"));
      if (as_json)
        fmt::print("{}\n", view.dump(2));
      else
        for (const char* kind : {"carbon", "price"})
          if (view.contains(kind)) print_signal(kind, view[kind]);
      return 0;
    }
    if (job->parsed()) {
      json shown = expect_json(client.request("GET", "/v1/jobs/" + id));
      if (as_json)
        fmt::print("{}\n", shown.dump(2));
      else
        print_job(shown);
      return 0;
    }
    if (cancel->parsed()) {
      json cancelled = expect_json(client.request("DELETE", "/v1/jobs/" + id));
      if (as_json)
        fmt::print("{}\n", cancelled.dump(2));
      else
        fmt::print("{}: {}\n", id, cancelled["state"] == "cancelled" ? "cancelled" : "cancel requested (TERM sent)");
      return 0;
    }
    if (logs->parsed()) {
      // jouled answers a log in windows of at most 1 MiB: page on from each window's end up
      // to the size the log had at the first answer (a growing log is not chased for ever).
      const std::string base = "/v1/jobs/" + id + "/log?stream=" + (stderr_stream ? "stderr" : "stdout");
      std::string target = base + (tail > 0 ? "&tail_bytes=" + std::to_string(tail) : "&offset=0");
      std::optional<std::uint64_t> end;
      for (;;) {
        auto reply = client.request("GET", target);
        if (!reply) throw Failure{reply.error().message};
        if (reply->status >= 400) expect_json(reply);
        std::cout << reply->body << std::flush;
        const auto next = reply->headers.find("joule-log-next-offset");
        const auto size = reply->headers.find("joule-log-size");
        if (next == reply->headers.end() || size == reply->headers.end() || reply->body.empty()) break;
        if (!end) end = std::stoull(size->second);
        if (std::stoull(next->second) >= *end) break;
        target = base + "&offset=" + next->second;
      }
      return 0;
    }
    if (estimate->parsed()) {
      json model = json::parse(read_input(model_file), nullptr, false);
      if (model.is_discarded()) throw Failure{fmt::format("{} is not valid JSON", model_file)};
      json request = {{"model", model},
                      {"training", {{"batch_size", batch_size}, {"epochs", epochs}, {"samples_per_epoch", samples_per_epoch}}}};
      if (!device_pattern.empty()) request["devices"] = json::array({device_pattern});
      request["runtime"] = estimate_runtime;
      json answer = expect_json(client.request("POST", "/v1/estimate", request.dump()));
      if (as_json) {
        fmt::print("{}\n", answer.dump(2));
        return 0;
      }
      fmt::print("{:>3}  {:<26}  {:<16}  {:>12}  {:>14}\n", "#", "LAYER", "OUTPUT", "PARAMETERS", "GFLOP/STEP");
      for (const auto& layer : answer["model"]["layers"]) {
        std::string shape;
        for (const auto& dim : layer["output_shape"]) shape += (shape.empty() ? "" : "x") + std::to_string(dim.get<long long>());
        fmt::print("{:>3}  {:<26}  {:<16}  {:>12}  {:>14.4f}\n", layer["index"].get<int>(), layer["type"].get<std::string>(), shape,
                   layer["parameters"].get<long long>(), layer["flops_per_step"].get<double>() / 1e9);
      }
      fmt::print("total: {} parameters, {:.3f} GFLOP per step, {} steps\n\n", answer["model"]["parameters"].get<long long>(),
                 answer["model"]["flops_per_step"].get<double>() / 1e9, answer["steps"].get<long long>());
      for (const auto& row : answer["estimates"]) {
        if (row["status"] != "ok") {
          fmt::print("{}: no estimate: {}\n", row["device"].get<std::string>(), row["detail"].get<std::string>());
          continue;
        }
        fmt::print("{}: {:.1f} ± {:.1f} J, {:.1f} ± {:.1f} s ({}, trained on {} data; FLOPs baseline {:.1f} J)\n",
                   row["device"].get<std::string>(), row["joules"]["mean"].get<double>(), row["joules"]["std"].get<double>(),
                   row["seconds"]["mean"].get<double>(), row["seconds"]["std"].get<double>(), row["method"].get<std::string>(),
                   row["source"].get<std::string>(), row["baseline"]["joules"].get<double>());
        if (row.contains("overhead")) fmt::print("  {}\n", overhead_text(row));
        if (row.contains("whole"))
          fmt::print("  {}: the layers sum to {:.3g} J per step, ×{:.2f} ({})\n",
                     row["whole"]["basis"] == "measured" ? "measured whole on the device"
                                                         : "scaled by its family's whole-to-layers ratio",
                     row["whole"]["layers_joules_per_step"].get<double>(), row["whole"]["joules_ratio"].get<double>(),
                     row["whole"]["family"].get<std::string>());
        if (const auto settings = row.find("settings"); settings != row.end() && settings->is_array())
          for (const auto& line : *settings)
            fmt::print("  at {} {}: {:.1f} J (×{:.3f} ± {:.0f} %), {:.1f} s (×{:.3f}) ({})\n", line.value("knob", ""),
                       line.value("label", ""), line["joules"].value("mean", 0.0), line.value("joules_ratio", 1.0),
                       100.0 * line.value("joules_log_std", 0.0), line["seconds"].value("mean", 0.0),
                       line.value("seconds_ratio", 1.0),
                       line.value("basis", "") == "measured" ? "measured at the setting"
                                                             : "predicted from the networks measured there");
        if (row.contains("runtime"))
          fmt::print("  {}: {:.1f} J and {:.2f} s to start, {:.3g} J and {:.3g} ms per step beyond the layers\n",
                     row["runtime"]["runtime"].get<std::string>(), row["runtime"]["start_joules"]["mean"].get<double>(),
                     row["runtime"]["start_seconds"]["mean"].get<double>(),
                     row["runtime"]["step_joules"]["mean"].get<double>(),
                     1e3 * row["runtime"]["step_seconds"]["mean"].get<double>());
        for (const auto& warning : row["warnings"]) fmt::print("  warning: {}\n", warning.get<std::string>());
      }
      return 0;
    }
    if (advise->parsed())
      return advise_command(client, model_file, advise_target, batch_size, advise_samples, advise_device,
                            min_multiplier, advise_out, as_json);
    if (probe->parsed()) {
      json request = {{"device", device_pattern}, {"seconds", probe_seconds}};
      for (const auto& path : probe_models) {
        json model = json::parse(read_input(path), nullptr, false);
        if (model.is_discarded()) throw Failure{fmt::format("{} is not valid JSON", path)};
        if (model.contains("model")) model = model["model"];  // a job file
        request["models"].push_back({{"model", model}, {"training", {{"batch_size", batch_size}}}});
      }
      json run = expect_json(client.request("POST", "/v1/probes", request.dump()));
      const std::string run_id = run["id"].get<std::string>();
      if (!wait) {
        if (as_json)
          fmt::print("{}\n", run.dump(2));
        else
          fmt::print("probe run {} on {}: {} for up to {:.0f} s\n", run_id, device_pattern,
                     run["state"].get<std::string>(), probe_seconds);
        return 0;
      }
      auto progress = joule::cli::ProgressLine::for_stderr(std::cerr);
      progress.show(run["state"].get<std::string>(), joule::cli::probe_progress_text(run, unix_ms_now()));
      while (run["state"] == "running") {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        run = expect_json(client.request("GET", "/v1/probes/" + run_id));
        progress.show(run["state"].get<std::string>(), joule::cli::probe_progress_text(run, unix_ms_now()));
      }
      progress.finish();
      if (as_json) {
        fmt::print("{}\n", run.dump(2));
      } else {
        print_probe_run(run);
        json listed = expect_json(client.request("GET", "/v1/devices"));
        for (const auto& device : listed["devices"])
          if (device["name"] == device_pattern) fmt::print("model: {}\n", model_summary(device["model"]));
      }
      return run["state"] == "failed" ? 1 : 0;
    }
    if (probes->parsed()) {
      json listed = expect_json(client.request("GET", "/v1/probes"));
      if (as_json) {
        fmt::print("{}\n", listed.dump(2));
        return 0;
      }
      fmt::print("{:<24}  {:<10}  {:<11}  {:<10}  {:>6}  {:>9}  {:>10}  {}\n", "RUN", "DEVICE", "REASON", "STATE", "PROBES",
                 "PREEMPTED", "SECONDS", "ENERGY");
      for (const auto& run : listed) {
        const auto& energy = run["energy"];
        fmt::print("{:<24}  {:<10}  {:<11}  {:<10}  {:>6}  {:>9}  {:>10.1f}  {:.1f} J {}{}\n", run["id"].get<std::string>(),
                   run["device"].get<std::string>(), run["reason"].get<std::string>(), run["state"].get<std::string>(),
                   run["probes"].get<long long>(), run["preempted"].get<long long>(), run["probe_seconds"].get<double>(),
                   energy["joules"].get<double>(), energy["source"].get<std::string>(),
                   energy["measured"].get<bool>() ? "" : " (not measured)");
      }
      return 0;
    }
    if (pause_cmd->parsed() || resume_cmd->parsed()) {
      const bool pausing = pause_cmd->parsed();
      const std::string& id = pausing ? pause_id : resume_id;
      json job = expect_json(client.request("POST", "/v1/jobs/" + id + (pausing ? "/pause" : "/resume")));
      if (as_json)
        fmt::print("{}\n", job.dump(2));
      else
        fmt::print("{} ({}): {}\n", id, job["name"].get<std::string>(), job["state"].get<std::string>());
      return 0;
    }
    if (nodes->parsed()) {
      // A coordinator answers at most 500 agents at a time; every page is followed (node
      // names are letters, digits, '.', '_' and '-': nothing to escape in the query).
      json listed = expect_json(client.request("GET", "/v1/nodes"));
      while (listed.value("next", json(nullptr)).is_string()) {
        json page = expect_json(client.request("GET", "/v1/nodes?after=" + listed["next"].get<std::string>()));
        for (auto& node : page["nodes"]) listed["nodes"].push_back(std::move(node));
        listed["next"] = page.value("next", json(nullptr));
      }
      if (as_json) {
        fmt::print("{}\n", listed.dump(2));
        return 0;
      }
      print_nodes(listed);
      return 0;
    }
    if (devices->parsed()) {
      json listed = expect_json(client.request("GET", "/v1/devices"));
      if (as_json) {
        fmt::print("{}\n", listed.dump(2));
        return 0;
      }
      fmt::print("{:<20}  {:<10}  {:>9}  {:>12}  {:<36}  {}\n", "DEVICE", "METER", "POWER W", "ENERGY J", "JOB",
                 "MODEL");
      for (const auto& device : listed["devices"]) {
        const auto& meter = device["meter"];
        fmt::print("{:<20}  {:<10}  {:>9.1f}  {:>12.1f}  {:<36}  {}\n", device["name"].get<std::string>(),
                   meter["source"].get<std::string>() + (meter["measured"].get<bool>() ? "" : "*"),
                   device["power_watts"].get<double>(), device["energy_joules"].get<double>(), device_jobs_text(device),
                   model_summary(device["model"]));
      }
      for (const auto& device : listed["devices"]) {
        if (!device["meter"]["measured"].get<bool>())
          fmt::print("* {}: not a measurement: {}\n", device["name"].get<std::string>(),
                     device["meter"]["note"].get<std::string>());
      }
      for (const auto& device : listed["devices"]) {
        // Older daemons send no knobs; a device with none says why only where it would have one.
        if (!device.contains("knobs")) continue;
        const auto& offered = device["knobs"]["offered"];
        std::vector<std::string> knobs;
        if (offered.contains("cpu_max_frequency_mhz"))
          knobs.push_back(fmt::format("cpu_max_frequency_mhz {:g}-{:g}",
                                      offered["cpu_max_frequency_mhz"]["min"].get<double>(),
                                      offered["cpu_max_frequency_mhz"]["max"].get<double>()));
        if (offered.contains("cpu_energy_preference"))
          knobs.push_back(
              "cpu_energy_preference " +
              fmt::format("{}",
                          fmt::join(offered["cpu_energy_preference"]["values"].get<std::vector<std::string>>(), "|")));
        if (offered.contains("gpu_power_limit_watts"))
          knobs.push_back(fmt::format("gpu_power_limit_watts {:g}-{:g}",
                                      offered["gpu_power_limit_watts"]["min"].get<double>(),
                                      offered["gpu_power_limit_watts"]["max"].get<double>()));
        if (offered.contains("gpu_max_frequency_mhz"))
          knobs.push_back(fmt::format("gpu_max_frequency_mhz {:g}-{:g}",
                                      offered["gpu_max_frequency_mhz"]["min"].get<double>(),
                                      offered["gpu_max_frequency_mhz"]["max"].get<double>()));
        if (offered.contains("power_mode")) {
          std::vector<std::string> modes;
          for (const auto& mode : offered["power_mode"]["modes"])
            modes.push_back(fmt::format("{} {}", mode["id"].get<int>(), mode["name"].get<std::string>()));
          knobs.push_back(fmt::format("power_mode {}", fmt::join(modes, "|")));
        }
        if (!knobs.empty())
          fmt::print("knobs of {}: {}\n", device["name"].get<std::string>(), fmt::join(knobs, "; "));
        else if (device["name"] == "cpu" && device["knobs"].contains("note"))
          fmt::print("knobs of cpu: none ({})\n", device["knobs"]["note"].get<std::string>());
      }
      return 0;
    }
  } catch (const Failure& failure) {
    fmt::print(stderr, "joulectl: {}\n", failure.message);
    return 1;
  }
  return 0;
}
