#pragma once
// ProbeService's private parts, shared by its files (probe_service.cpp: scheduling, requests and
// what it shows; probe_runs.cpp: the worker's runs; probe_learning.cpp: results into models):
// a device's probing state, a probe in progress, and small helpers.

#include <algorithm>
#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/daemon/device_knobs.hpp"
#include "joule/daemon/probe_service.hpp"
#include "joule/estimator/drift.hpp"
#include "joule/estimator/layer_analysis.hpp"
#include "joule/estimator/probe_campaign.hpp"
#include "joule/worker/protocol.hpp"

namespace joule::daemon {

using SteadyTime = std::chrono::steady_clock::time_point;

namespace probe_parts {

using nlohmann::json;

inline constexpr std::size_t kHeldOutWindow = 50;
inline constexpr std::size_t kRunsKept = 200;
// Until its cost pools estimator::kRuntimeRunsPooled runs, the runtime probe is read again this
// often (at most [probing] reference_minutes), then every reference_minutes: runs minutes apart
// see the machine in different states, as the jobs will.
inline constexpr double kRuntimeRereadMinutes = 5.0;

// The held-out error shown and exported: the upper median of the recent |relative errors|.
inline std::optional<double> median_error(const std::deque<double>& errors) {
  if (errors.empty()) return std::nullopt;
  std::vector<double> sorted(errors.begin(), errors.end());
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
  return sorted[sorted.size() / 2];
}

inline std::string read_file(const std::filesystem::path& path, std::size_t limit = 1 << 20) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > limit) text = text.substr(text.size() - limit);
  return text;
}

inline std::string last_line(const std::string& text) {
  auto end = text.find_last_not_of("\n ");
  if (end == std::string::npos) return "";
  auto start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1,
                     end - (start == std::string::npos ? 0 : start + 1) + 1);
}

inline std::optional<estimator::LayerKey> parse_key(const std::string& name) {
  const auto at = name.find('@');
  if (at == std::string::npos) return std::nullopt;
  const std::string position = name.substr(at + 1);
  estimator::LayerKey key{name.substr(0, at)};
  if (position == "input")
    key.position = estimator::LayerPosition::input;
  else if (position == "hidden")
    key.position = estimator::LayerPosition::hidden;
  else if (position == "output")
    key.position = estimator::LayerPosition::output;
  else
    return std::nullopt;
  return key;
}

inline json target_json(const estimator::ProbeTarget& target) {
  return {{"layer", estimator::to_json(target.layer)},
          {"input_shape", target.input_shape},
          {"input_dtype", target.input_dtype},
          {"batch_size", target.batch_size},
          {"position", std::string(estimator::to_string(target.position))},
          {"loss", target.loss},
          {"optimizer", target.optimizer}};
}

inline std::optional<estimator::ProbeTarget> parse_target(const json& j) {
  try {
    estimator::ProbeTarget target;
    json layer = j.at("layer");
    target.layer.type = layer.at("type").get<std::string>();
    if (layer.contains("inputs")) target.layer.inputs = layer.at("inputs").get<std::vector<std::string>>();
    if (layer.contains("name")) target.layer.name = layer.at("name").get<std::string>();
    for (const char* wiring : {"type", "inputs", "name"}) layer.erase(wiring);
    target.layer.args = layer;
    target.input_shape = j.at("input_shape").get<std::vector<std::int64_t>>();
    target.input_dtype = j.at("input_dtype").get<std::string>();
    target.batch_size = j.at("batch_size").get<std::int64_t>();
    auto key = parse_key(target.layer.type + "@" + j.at("position").get<std::string>());
    if (!key) return std::nullopt;
    target.position = key->position;
    target.loss = j.at("loss").get<std::string>();
    target.optimizer = j.value("optimizer", "");  // absent in rows from before optimizer probes
    return target;
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

/// A probe request as every probing worker run is given one: the device, its threads and meter,
/// the [probing] reading lengths, at `batch_size` with a fresh `seed`; the caller adds networks.
inline worker::ProbeRequest probe_request(const config::ProbingConfig& probing, const config::DeviceConfig& config,
                                          const std::string& device, int threads, std::int64_t batch_size,
                                          std::uint64_t seed) {
  worker::ProbeRequest request;
  request.device = device;
  request.threads = threads;
  request.batch_size = batch_size;
  request.warmup_steps = probing.warmup_steps;
  request.steps_per_repetition = probing.steps_per_repetition;
  request.min_reading_seconds = probing.reading_seconds;
  request.repetitions = probing.repetitions;
  request.meter = config.meter;
  request.idle_watts = config.idle_watts;
  request.watts_per_busy_core = config.watts_per_busy_core;
  request.seed = seed;
  return request;
}

}  // namespace probe_parts

struct ProbeService::Running {
  std::string run_id;
  std::vector<estimator::ProbePlan> plans;  // measured in this order, one result line each
  std::size_t taken = 0;                    // result lines learnt from so far
  SteadyTime taken_at;                      // when they were (the budgets' energy use starts there)
  std::unique_ptr<ChildProcess> worker;
  std::filesystem::path directory;
  SteadyTime started;
  bool preempted = false;
  bool environment_only = false;  // `joule-worker env`, not a probe
  bool runtime_only = false;      // `joule-worker runtime`: the interpreter's cost, not a layer
  std::vector<std::string> runtime_kinds;        // the layer kinds it was asked to read (--kinds)
  std::optional<estimator::WorkloadItem> whole;  // a network of the workload measured whole
  // The knob setting `whole` is measured at (nullopt: the defaults), set on the device for the
  // worker's run and put back when it ends or is pre-empted (or, dropped, by the controls).
  std::optional<estimator::KnobSetting> setting;
  std::unique_ptr<DeviceKnobs> knobs;
  std::unique_ptr<adapters::GpuPowerLimit> gpu_limit;
};

struct ProbeService::Device {
  std::string name;
  const config::DeviceConfig* config = nullptr;  // its [[devices]] table, in the device table
  std::string environment;                       // worker environment fingerprint of the samples in `learning`
  std::string source;                            // meter source of those samples
  std::shared_ptr<estimator::DeviceEnergyModel> learning;      // every sample so far (loop thread only)
  std::shared_ptr<const estimator::DeviceEnergyModel> fitted;  // latest fit of `learning`
  std::unique_ptr<estimator::ProbePlanner> planner;
  std::size_t samples = 0;
  std::size_t samples_at_fit = 0;
  bool fit_pending = false;
  std::int64_t model_saved_ms = 0;
  std::optional<std::int64_t> last_probe_ms;
  std::deque<double> heldout;  // |relative error| of probe networks predicted before measuring
  estimator::DriftDetector drift;
  std::string campaign_reason = "initial";                        // why the current samples are being gathered
  std::shared_ptr<const estimator::DeviceEnergyModel> replacing;  // the model a re-probe replaces
  ProbeCycle cycle;  // checking, busy, settling, probing, converged...: when it probes
  std::optional<Running> probe;
  std::optional<std::string> active_run;
  std::vector<estimator::WorkloadItem> requested_models;  // named by the latest POST /v1/probes
  double joules_today = 0.0;
  int day = -1;
  // What deciding whether a probe pays needs: what probe plans have cost here, and the energy
  // of the jobs whose estimates this model makes, over the last day (finished ms, joules).
  double probe_joules = 0.0;
  std::size_t probe_plans = 0;
  std::deque<std::pair<std::int64_t, double>> job_joules;
  std::string not_paying;       // why background probing stopped before the model converged, if it did
  bool runtime_tried = false;   // the runtime probe ended (either way) since the campaign began
  std::int64_t runtime_attempt_ms = 0;  // when it last ended (either way): read again from then on
  std::string runtime_problem;  // why it stored nothing, when it did not
  // The workload's layer kinds the runtime probe reads on their own networks (all it can read,
  // most layers first; a run reads kRuntimeKindsPerRun of them), and those it was asked for and
  // could not read (not asked again by runtime_due).
  std::vector<std::string> runtime_kinds_wanted;
  std::set<std::string> runtime_kinds_unread;
  // Networks of the workload that may be measured whole (queued and recent jobs', a requested
  // run's), and those tried this campaign (whole_network_key) whether they measured or failed.
  std::vector<estimator::WorkloadItem> whole_items;
  std::uint64_t whole_items_revision = 0;
  std::vector<std::string> wholes_tried;
  // Why the last measurement of a network whole failed (refused setting, worker failure), by its
  // whole_network_key: its estimates say so until a measurement of it succeeds.
  std::map<std::string, std::string> whole_failures;
  struct WholeAnswer {  // next_whole's last answer, kept while nothing it read changed
    std::uint64_t model_revision = 0;
    std::uint64_t items_revision = 0;
    std::size_t tried = 0;
    std::vector<estimator::KnobSetting> settings;  // the settings that were candidates
    struct Best {
      std::size_t item = 0;
      std::optional<estimator::KnobSetting> setting;
      double reduction = 0.0;
      double cost = 1.0;
    };
    std::optional<Best> best;
  };
  std::optional<WholeAnswer> whole_answer;
  // The reference network ([probing] reference_minutes): the first network measured whole since
  // jouled started, measured again to see the device's speed move; its readings (ms, J/step).
  std::optional<estimator::WorkloadItem> reference;
  std::deque<std::pair<std::int64_t, double>> reference_readings;
  // When the reference moved by more than [probing] max_speed_spread from one reading to the
  // next (Unix ms, and by how much, log): networks measured whole before then are stale, and
  // measured again where that is worth it.
  std::int64_t speed_step_ms = 0;
  double speed_step = 0.0;
};

}  // namespace joule::daemon
