#include "joule/simulator/report.hpp"

#include <cmath>

#include <fmt/format.h>

#include "joule/schedulers/time_format.hpp"

namespace joule::simulator {
namespace {

using nlohmann::json;

const PolicyMetrics* find_run(const SimulationReport& report, const std::string& name) {
  for (const auto& run : report.runs)
    if (run.name == name) return &run;
  return nullptr;
}

std::optional<double> ratio(double value, const PolicyMetrics* reference, double PolicyMetrics::*field) {
  if (!reference || !(reference->*field > 0.0)) return std::nullopt;
  return value / (reference->*field);
}

json maybe(std::optional<double> value) { return value ? json(*value) : json(nullptr); }

std::string ratio_text(std::optional<double> value) { return value ? fmt::format("{:.3f}", *value) : "-"; }

}  // namespace

json to_json(const PolicyMetrics& m) {
  json violations = json::array();
  for (const auto& v : m.violations)
    violations.push_back({{"budget", v.budget},
                          {"window_start", schedulers::format_rfc3339(v.window_start)},
                          {"window_end", schedulers::format_rfc3339(v.window_end)},
                          {"unit", schedulers::to_string(v.unit)},
                          {"spent", v.spent},
                          {"limit", v.limit},
                          {"overrun", v.overrun()}});
  json battery = json::object();
  for (const auto& [node, percent] : m.battery_min_percent)
    battery[node] = {{"min_percent", percent}, {"empty_seconds", m.battery_empty_seconds.at(node)}};
  json devices = json::object();
  for (const auto& [name, usage] : m.devices)
    devices[name] = {{"jobs", usage.jobs}, {"busy_seconds", usage.busy_seconds}, {"joules", usage.joules}};
  json carbon = nullptr;
  if (m.carbon_grams)
    carbon = {
        {"grams", *m.carbon_grams}, {"joules_outside_signal", m.joules_outside_carbon_signal}, {"source", "simulated"}};
  json cost = nullptr;
  if (m.cost)
    cost = {{"amount", *m.cost}, {"joules_outside_signal", m.joules_outside_price_signal}, {"source", "simulated"}};
  json out = {
      {"carbon", carbon},
      {"cost", cost},
      {"name", m.name},
      {"objective", m.objective},
      {"knowledge", m.knowledge},
      {"admission", m.admission},
      {"throttle", m.throttle},
      {"jobs",
       {{"total", m.jobs},
        {"completed", m.completed},
        {"jobs_at_knob_settings", m.jobs_at_settings},
        {"jobs_slowed_beyond_max_slowdown", m.slowdown_exceeded},
        {"jobs_swept", m.jobs_swept},
        {"jobs_within_5pct_of_best_setting", m.jobs_within_5pct_of_best},
        {"mean_setting_regret", m.jobs_swept ? m.setting_regret / static_cast<double>(m.jobs_swept) : 0.0},
        {"running_at_end", m.started_not_completed},
        {"never_started", m.never_started},
        {"rejected", m.rejected},
        {"waiting_reasons", m.waiting_reasons}}},
      {"energy",
       {{"joules", m.energy_joules},
        {"kwh", m.energy_joules / 3.6e6},
        {"per_completed_job_joules", m.energy_per_completed_job_joules},
        {"idle_joules_not_counted", m.idle_joules_not_counted},
        {"source", "simulated"}}},
      {"makespan_seconds", m.makespan_seconds},
      {"wait_seconds", {{"mean", m.wait_mean_seconds}, {"p95", m.wait_p95_seconds}}},
      {"turnaround_seconds", {{"mean", m.turnaround_mean_seconds}}},
      {"deadline_misses", m.deadline_misses},
      {"max_energy_exceeded", m.max_energy_exceeded},
      {"budget_violations",
       {{"count", m.violations.size()},
        {"max_overrun_joules", m.max_overrun_joules},
        {"windows", violations},
        {"source", "simulated"}}},
      {"battery_floor_violation_seconds", m.floor_violation_seconds},
      {"power_cap_violation_seconds", m.cap_violation_seconds},
      {"throttle_actions",
       {{"count", m.throttle_action_count},
        {"by_kind", m.throttle_actions},
        {"controls", m.throttle ? "pause and resume (simulated devices offer no GPU power limit or CPU quota)"
                                : "none: this run does not throttle"}}},
      {"battery", battery},
      {"devices", devices},
      {"placement",
       {{"passes", m.placement_passes},
        {"placements", m.placements},
        {"placer_wall_seconds", m.placer_wall_seconds},
        {"passes_per_second",
         m.placer_wall_seconds > 0 ? json(m.placement_passes / m.placer_wall_seconds) : json(nullptr)}}},
      {"wall_seconds", m.wall_seconds},
      {"ended_at", schedulers::format_rfc3339(m.ended_at)},
      {"end_reason", m.end_reason},
  };
  // Per owner, only for traces that name owners (the shipped scenarios' figures stay as they were).
  if (!m.owners.empty()) {
    json owners = json::object();
    for (const auto& [name, owner] : m.owners)
      owners[name] = {{"jobs", owner.jobs},
                      {"started", owner.started},
                      {"completed", owner.completed},
                      {"energy_joules", owner.energy_joules},
                      {"wait_seconds", {{"mean", owner.wait_mean_seconds}, {"max", owner.wait_max_seconds}}},
                      {"energy_source", "simulated"}};
    out["owners"] = std::move(owners);
  }
  return out;
}

json to_json(const SimulationReport& report) {
  const PolicyMetrics* oracle = find_run(report, "oracle");
  const PolicyMetrics* round_robin = find_run(report, "round-robin");
  json runs = json::array();
  for (const auto& run : report.runs) {
    json entry = to_json(run);
    entry["ratios"] = {
        {"energy_vs_oracle", maybe(ratio(run.energy_joules, oracle, &PolicyMetrics::energy_joules))},
        {"energy_vs_round_robin", maybe(ratio(run.energy_joules, round_robin, &PolicyMetrics::energy_joules))},
        {"energy_per_job_vs_oracle",
         maybe(ratio(run.energy_per_completed_job_joules, oracle, &PolicyMetrics::energy_per_completed_job_joules))},
        {"energy_per_job_vs_round_robin", maybe(ratio(run.energy_per_completed_job_joules, round_robin,
                                                      &PolicyMetrics::energy_per_completed_job_joules))},
    };
    runs.push_back(std::move(entry));
  }
  return {{"cluster", report.cluster},   {"trace", report.trace}, {"policy", report.policy}, {"seed", report.seed},
          {"devices", report.devices},   {"jobs", report.jobs},   {"notes", report.notes},   {"runs", runs},
          {"energy_source", "simulated"}};
}

std::string format_table(const SimulationReport& report) {
  const PolicyMetrics* oracle = find_run(report, "oracle");
  const PolicyMetrics* round_robin = find_run(report, "round-robin");
  std::string out = fmt::format("joule-sim: {} jobs on {} devices (cluster {}, trace {}, policy {}, seed {})\n",
                                report.jobs, report.devices, report.cluster, report.trace, report.policy, report.seed);
  out += "All energy is SIMULATED (the simulator's true cost, not a meter reading); idle power is not counted.\n\n";
  out += fmt::format("{:<18} {:>9} {:>11} {:>7} {:>7} {:>10} {:>7} {:>9} {:>17} {:>5} {:>14} {:>6}\n", "policy", "done",
                     "energy kWh", "/oracle", "/rr", "kJ/job", "/oracle", "makespan", "wait mean/p95", "late",
                     "budget viol.", "thr.");
  for (const auto& run : report.runs) {
    out += fmt::format(
        "{:<18} {:>9} {:>11.3f} {:>7} {:>7} {:>10.1f} {:>7} {:>8.1f}h {:>17} {:>5} {:>14} {:>6}\n", run.name,
        fmt::format("{}/{}", run.completed, run.jobs), run.energy_joules / 3.6e6,
        ratio_text(ratio(run.energy_joules, oracle, &PolicyMetrics::energy_joules)),
        ratio_text(ratio(run.energy_joules, round_robin, &PolicyMetrics::energy_joules)),
        run.energy_per_completed_job_joules / 1e3,
        ratio_text(ratio(run.energy_per_completed_job_joules, oracle, &PolicyMetrics::energy_per_completed_job_joules)),
        run.makespan_seconds / 3600.0,
        fmt::format("{:.0f}/{:.0f} min", run.wait_mean_seconds / 60.0, run.wait_p95_seconds / 60.0),
        run.deadline_misses,
        run.violations.empty() ? std::string("0")
                               : fmt::format("{} (+{:.0f} kJ)", run.violations.size(), run.max_overrun_joules / 1e3),
        run.throttle_action_count);
  }
  out += "\n/oracle, /rr: ratio of energy to the oracle's and to round-robin's (total; kJ/job's per completed job).\n";
  out += "budget viol.: budget windows whose simulated spent energy exceeded the limit (largest overrun).\n";
  // Each run's energy at the cluster's price and carbon signals, where it has them.
  auto at_signal = [&](auto amount, auto outside, const char* what) {
    for (const auto& run : report.runs) {
      if (!(run.*amount)) continue;
      out += fmt::format(
          "  {}: {} of simulated energy at the cluster's {} signal{}\n", run.name,
          what == std::string_view("price") ? fmt::format("{:.4g} (in the prices' currency)", *(run.*amount))
                                            : fmt::format("{:.0f} g CO2e", *(run.*amount)),
          what,
          run.*outside > 0 ? fmt::format(" ({:.0f} kJ drawn outside the signal, not counted)", run.*outside / 1e3)
                           : std::string());
    }
  };
  at_signal(&PolicyMetrics::cost, &PolicyMetrics::joules_outside_price_signal, "price");
  at_signal(&PolicyMetrics::carbon_grams, &PolicyMetrics::joules_outside_carbon_signal, "carbon");
  for (const auto& run : report.runs) {
    std::string extra;
    if (run.never_started || run.started_not_completed || run.rejected)
      extra += fmt::format(" {} never started, {} unfinished, {} rejected at submission;", run.never_started,
                           run.started_not_completed, run.rejected);
    for (const auto& [kind, count] : run.waiting_reasons) extra += fmt::format(" {} waiting ({}),", count, kind);
    for (const auto& [node, percent] : run.battery_min_percent)
      extra += fmt::format(" battery {} min {:.0f}%, empty {:.1f} h;", node, percent,
                           run.battery_empty_seconds.at(node) / 3600.0);
    for (const auto& [floor, seconds] : run.floor_violation_seconds)
      if (seconds > 0) extra += fmt::format(" jobs ran below battery floor {} for {:.1f} h;", floor, seconds / 3600.0);
    for (const auto& [cap, seconds] : run.cap_violation_seconds)
      if (seconds > 0) extra += fmt::format(" power cap {} exceeded for {:.1f} h;", cap, seconds / 3600.0);
    if (run.max_energy_exceeded) extra += fmt::format(" {} over their max_energy_joules;", run.max_energy_exceeded);
    extra += fmt::format(" ended {} ({}); {} placement passes, {:.0f} passes/s of placer time",
                         schedulers::format_rfc3339(run.ended_at), run.end_reason, run.placement_passes,
                         run.placer_wall_seconds > 0 ? run.placement_passes / run.placer_wall_seconds : 0.0);
    out += fmt::format("  {}:{}\n", run.name, extra);
  }
  for (const auto& run : report.runs)
    for (const auto& [name, owner] : run.owners)
      out += fmt::format("  {}: owner {}: {} jobs, {} completed, mean wait {:.0f} s (max {:.0f} s), {:.1f} kJ\n",
                         run.name, name, owner.jobs, owner.completed, owner.wait_mean_seconds, owner.wait_max_seconds,
                         owner.energy_joules / 1e3);
  for (const auto& note : report.notes) out += fmt::format("note: {}\n", note);
  return out;
}

}  // namespace joule::simulator
