// Replays the finished jobs of a saved bench/e2e_accuracy.py run through jouled's outcome
// calibration (daemon OutcomeService, the production path), with the estimates as the jobs
// stored them and again with their layers left out, so a change to the calibration can be
// judged on the same jobs without running them again (~40 min). Prints the leave-one-out figures
// GET /v1/devices would show after the last job.
// Usage: outcome_replay RUN.json

#include <cstdio>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "joule/daemon/job_estimate.hpp"
#include "joule/daemon/outcome_service.hpp"

using joule::daemon::JobFeedback;
using nlohmann::json;

namespace {

std::string percent(const json& value) {
  return value.is_number() ? fmt::format("{:.2f} %", 100.0 * value.get<double>()) : "-";
}

// Each succeeded job's feedback, as jouled's finished hook gives it; `with_layers` false keeps
// only what a compact stored row has (no per-layer breakdown, so no work mix).
std::vector<JobFeedback> feedback_of(const json& run, bool with_layers) {
  std::vector<JobFeedback> out;
  std::int64_t order = 0;
  for (const auto& row : run.value("rows", json::array())) {
    if (row.value("state", "") != "succeeded" || !row.contains("estimate_at_submit") ||
        !row["estimate_at_submit"].is_object() || !row.contains("energy") || !row["energy"].is_object())
      continue;
    json estimate = json::array({row["estimate_at_submit"]});
    if (!with_layers) {
      // What a stored row beyond a job's cheapest devices keeps: the summed FLOPs, no breakdown.
      json& row_kept = estimate[0];
      double flops = 0.0;
      for (const auto& layer : row_kept.value("layers", json::array()))
        if (layer.is_object()) flops += layer.value("flops_per_step", 0.0);
      row_kept["flops_per_step"] = flops;
      row_kept["layers"] = json::array();
      row_kept["layers_left_out"] = true;
    }
    const auto estimates = joule::daemon::read_estimates(estimate);
    if (estimates.empty()) continue;
    JobFeedback feedback;
    feedback.device = estimates[0].device;
    feedback.estimate = estimates[0];
    feedback.joules = row["energy"].value("joules", 0.0);
    feedback.source = joule::energy_source_from_string(row["energy"].value("source", ""));
    feedback.job_id = row.value("job_id", fmt::format("row-{}", order));
    feedback.finished_ms = ++order;
    if (row.contains("job_seconds") && row["job_seconds"].is_number())
      feedback.seconds = row["job_seconds"].get<double>();
    out.push_back(std::move(feedback));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: outcome_replay RUN.json (written by bench/e2e_accuracy.py --json)\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  const json run = json::parse(in, nullptr, false);
  if (run.is_discarded() || !run.is_object()) {
    std::fprintf(stderr, "%s: not a JSON object\n", argv[1]);
    return 2;
  }
  fmt::print("{}: every job's joules as the run metered them (their source is in its rows)\n", argv[1]);
  for (const bool with_layers : {true, false}) {
    joule::daemon::OutcomeService outcomes;
    const auto feedback = feedback_of(run, with_layers);
    std::size_t rows = 0;
    for (const auto& one : feedback) rows += outcomes.record(one) ? 1 : 0;
    const std::string device = feedback.empty() ? "cpu" : feedback.front().device;
    const json view = outcomes.view(device);
    fmt::print(
        "{:<22} rows {:>3}  error raw {:>7}  corrected (leave-one-out) {:>7}  2σ coverage raw {:>7}  calibrated {:>7}  "
        "σ ×{:.2f}  work mix used: {}\n",
        with_layers ? "estimates as stored" : "layers left out", rows, percent(view["error_raw"]),
        percent(view["error_corrected_leave_one_out"]), percent(view["coverage_2sigma_raw"]),
        percent(view["coverage_2sigma_calibrated_leave_one_out"]), view.value("sigma_scale", 1.0),
        view.value("uses_work_mix", false));
  }
  return 0;
}
