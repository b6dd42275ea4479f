// ProbeService measuring the workload's own networks whole: which one is worth it, the worker's
// run, and what its result teaches (estimator/whole_network.hpp).
#include "joule/daemon/probe_service.hpp"

#include "probe_parts.hpp"

#include <cmath>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "joule/common/energy_source.hpp"
#include "joule/estimator/thread_count.hpp"
#include "joule/estimator/whole_network.hpp"
#include "joule/worker/protocol.hpp"

namespace joule::daemon {

using nlohmann::json;
using namespace probe_parts;

namespace {

constexpr const char* kWholeRowKey = "whole-network";
// A whole measurement holds the device like a probe (a job pre-empts it); one whose readings
// would take longer than this at its estimated pace is left to the layers and the family gap.
constexpr double kMaxWholeSeconds = 120.0;
// How unsure a setting's effect on a network is before any network was measured at it (log σ):
// published sweeps move a step's energy by 10-40 % across a knob's range.
constexpr double kUnknownSettingSigma = 0.3;

std::string key_of(const estimator::WorkloadItem& item, const std::optional<estimator::KnobSetting>& setting = {}) {
  return estimator::whole_network_key(estimator::network_signature(item.model), item.batch_size, item.optimizer,
                                      setting ? &*setting : nullptr);
}

// A worker's environment as it would be at the device's own thread count: a measurement at a
// thread count (the setting) differs from the model's conditions in that alone.
std::string fingerprint_at_defaults(worker::WorkerEnvironment environment,
                                    const std::optional<estimator::KnobSetting>& setting, int device_threads) {
  if (setting && setting->knob == estimator::kThreadsKnob) environment.threads = device_threads;
  return environment.fingerprint();
}

}  // namespace

std::optional<ProbeService::NextProbe> ProbeService::next_whole(Device& device) {
  // Whole networks are weighed against layer probes once the layers have a fitted model: the
  // worth of a measurement is how unsure the model's estimate of the network is.
  if (!device.fitted || device.planner->seeding() || device.whole_items.empty()) return std::nullopt;
  const auto& model = *device.fitted;
  const std::size_t tried = device.wholes_tried.size() + device.learning->whole_networks().size();
  const auto settings = settings_to_measure(device);
  auto& kept = device.whole_answer;
  if (!kept || kept->model_revision != model.revision() || kept->items_revision != device.whole_items_revision ||
      kept->tried != tried || kept->settings != settings) {
    kept = Device::WholeAnswer{model.revision(), device.whole_items_revision, tried, settings, std::nullopt};
    // One candidate per network, batch size and optimizer; its share of the workload is the
    // share of the workload's items (jobs, a run's models) that train it. Every item counts the
    // same, as in the layer planner (ProbePlanner::weights): an estimate's error matters per job,
    // and a network of small steps is trained for as long as one of large ones (weighing items
    // by their joules per step left small-step networks never measured whole).
    std::vector<estimator::WholeNetworkCandidate> candidates;
    std::vector<std::size_t> item_of;
    std::map<std::string, std::size_t> index_of;
    double total = 0.0;
    for (std::size_t i = 0; i < device.whole_items.size(); ++i) {
      const auto& item = device.whole_items[i];
      const std::string signature = estimator::network_signature(item.model);
      const std::string key = estimator::whole_network_key(signature, item.batch_size, item.optimizer);
      const estimator::TrainingConfig one_step{item.batch_size, 1, item.batch_size, item.optimizer, std::nullopt};
      auto estimate = model.estimate(item.model, one_step);
      if (!estimate || !(estimate->joules_per_step.mean > 0.0)) continue;
      total += 1.0;
      if (const auto seen = index_of.find(key); seen != index_of.end()) {
        candidates[seen->second].share += 1.0;
        continue;
      }
      estimator::WholeNetworkCandidate candidate;
      candidate.signature = signature;
      candidate.batch_size = item.batch_size;
      candidate.optimizer = item.optimizer;
      candidate.flops_per_step = 0.0;
      for (const auto& line : estimate->layers) candidate.flops_per_step += line.flops_per_step;
      candidate.relative_std = estimate->joules_per_step.std / estimate->joules_per_step.mean;
      candidate.seconds_per_step =
          estimate->seconds.mean / static_cast<double>(std::max<std::int64_t>(1, estimate->steps));
      candidate.share = 1.0;
      index_of.emplace(key, candidates.size());
      candidates.push_back(std::move(candidate));
      item_of.push_back(i);
    }
    for (auto& candidate : candidates) candidate.share /= total;
    // A network measured at the defaults may be measured at each knob setting too: what the
    // setting does to it is unknown (a prior of ±30 %) or its setting's response's spread, and
    // a measurement leaves about the device's drift between two readings.
    const std::size_t at_defaults = candidates.size();
    const auto& settings_known = device.learning->settings();
    for (std::size_t c = 0; c < at_defaults && !settings.empty(); ++c) {
      if (!device.learning->whole_network(candidates[c].signature, candidates[c].batch_size, candidates[c].optimizer))
        continue;
      for (const auto& setting : settings) {
        estimator::WholeNetworkCandidate at = candidates[c];
        at.setting = setting;
        const auto known = settings_known.find(setting.key());
        at.relative_std = known != settings_known.end() && known->second.response ? estimator::kResponseFloorSigma
                                                                                  : kUnknownSettingSigma;
        at.measured_std = std::max(estimator::kSettingFloorSigma, std::sqrt(2.0) * device.learning->speed_spread());
        candidates.push_back(std::move(at));
        item_of.push_back(item_of[c]);
      }
    }
    std::vector<std::string> done = device.wholes_tried;
    for (const auto& sample : device.learning->whole_networks()) {
      // Measured before the device's speed stepped: as unsure as the step, and measured again.
      if (!sample.setting && sample.measured_ms < device.speed_step_ms) {
        const std::string key = estimator::whole_network_key(sample);
        for (auto& candidate : candidates)
          if (!candidate.setting &&
              estimator::whole_network_key(candidate.signature, candidate.batch_size, candidate.optimizer) == key)
            candidate.relative_std = std::max(candidate.relative_std, device.speed_step);
        continue;
      }
      done.push_back(estimator::whole_network_key(sample));
    }
    const int steps =
        options_.probing.warmup_steps + options_.probing.repetitions * options_.probing.steps_per_repetition;
    if (const auto best = estimator::plan_whole_network(candidates, done, steps, kMaxWholeSeconds))
      kept->best = Device::WholeAnswer::Best{item_of[best->index], candidates[best->index].setting,
                                             best->error_reduction, best->cost};
  }
  if (!kept->best) return std::nullopt;
  return NextProbe{kept->best->reduction, kept->best->cost, device.whole_items[kept->best->item], kept->best->setting};
}

std::vector<estimator::KnobSetting> ProbeService::settings_to_measure(const Device& device) const {
  const daemon::Device* where = table_.find(device.name);
  if (!where) return {};
  std::vector<estimator::KnobSetting> choices;
  if (demand_.chooses_settings()) choices = knob_choices(*where);
  if (where->shared_cores > 0) {
    const int own = config::device_threads(*device.config, options_.probing);
    for (const int cores : demand_.core_counts(device.name))
      if (cores != own && cores <= where->shared_cores) choices.push_back(estimator::threads_setting(cores));
  }
  if (choices.empty()) return choices;
  for (const auto& other : table_)
    if (other.node.empty() && !other.holds.empty()) return {};
  return choices;
}

void ProbeService::put_knobs_back(Running& probe) {
  if (!probe.knobs) return;
  for (const auto& failure : probe.knobs->restore(probe.gpu_limit.get()))
    spdlog::warn("whole-network probe: {}", failure);
  probe.knobs.reset();
  probe.gpu_limit.reset();
}

void ProbeService::start_whole_probe(Device& device, const estimator::WorkloadItem& item,
                                     const std::optional<estimator::KnobSetting>& setting) {
  // A thread count is the worker's own setting: nothing of the device's is set for it.
  const bool at_threads = setting && setting->knob == estimator::kThreadsKnob;
  const int threads =
      at_threads ? static_cast<int>(setting->value) : config::device_threads(*device.config, options_.probing);
  const auto directory = open_probe_directory(device, "whole");
  worker::ProbeRequest request =
      probe_request(options_.probing, *device.config, device.name, threads, item.batch_size, next_run_++);
  request.optimizer = item.optimizer;
  request.networks = {item.model};
  const auto file = directory / "request.json";
  {
    std::ofstream out(file);
    out << worker::to_json(request).dump();
    if (!out) {
      device.wholes_tried.push_back(key_of(item, setting));
      device.cycle.launch_failed(clock_.steady(), fmt::format("cannot write {}", file.string()));
      return;
    }
  }
  adapters::LaunchSpec spec;
  spec.argv = {worker_for(device.name).string(), "probe", "--request", file.string()};
  set_probe_launch(spec, directory, threads, "results.jsonl");
  Running running;
  running.directory = directory;
  running.whole = item;
  if (at_threads) running.setting = setting;
  if (setting && !at_threads) {
    // Set just before the worker starts, put back when it ends (a failed start drops `running`,
    // whose controls put the originals back as they go).
    const daemon::Device* where = table_.find(device.name);
    running.setting = setting;
    running.knobs = std::make_unique<DeviceKnobs>(options_.control_journal, options_.run_tool);
    auto gpu_limit = [&]() -> adapters::GpuPowerLimit* {
      running.gpu_limit = gpu_power_limit_of(*where, options_.control_journal);
      return running.gpu_limit.get();
    };
    auto applied = where ? running.knobs->apply(knobs_of(*setting), *where, gpu_limit)
                         : Result<std::vector<std::string>>(make_error(ErrorCode::unavailable, "no such device"));
    if (!applied) {
      // Not tried again this campaign; nothing was measured, nothing is stored.
      device.wholes_tried.push_back(key_of(item, setting));
      device.whole_failures[key_of(item, setting)] =
          fmt::format("{} could not be set: {}", setting->label, applied.error().message);
      running.knobs.reset();
      // The device itself is fine: probing goes on at once with what is worth most next (this
      // setting, now tried, is not it again).
      spdlog::warn("device {}: cannot set {} to measure network {} there: {}", device.name, setting->label,
                   item.model.name.empty() ? estimator::network_signature(item.model) : item.model.name,
                   applied.error().message);
      std::error_code ec;
      std::filesystem::remove_all(directory, ec);
      start_probe(device);
      return;
    }
  }
  if (!launch_probe(device, spec, "whole-network probe", std::move(running))) return;
  spdlog::info("device {}: measuring network {} whole at batch {} ({}){}", device.name,
               item.model.name.empty() ? estimator::network_signature(item.model) : item.model.name, item.batch_size,
               item.optimizer,
               !setting     ? std::string()
               : at_threads ? " at " + setting->label
                            : fmt::format(" at {} {}", setting->knob, setting->label));
}

void ProbeService::on_whole_exit(Device& device, Running& probe, const std::optional<adapters::ExitStatus>& exit,
                                 double seconds) {
  const std::string& name = device.name;
  const estimator::WorkloadItem& item = *probe.whole;
  put_knobs_back(probe);
  auto run = runs_.find(probe.run_id);
  if (run != runs_.end()) run->second.probe_seconds += seconds;
  ProbeOutcome outcome = ProbeOutcome::completed;
  std::string failure;
  if (probe.preempted) {
    // Not tried: it is a candidate again once the device is idle.
    outcome = ProbeOutcome::preempted;
    metrics_.count_probe_outcome(name, "preempted");
    if (run != runs_.end()) ++run->second.preempted;
  } else {
    device.wholes_tried.push_back(key_of(item, probe.setting));
    const std::string output = read_file(probe.directory / "results.jsonl");
    const auto line = output.substr(0, output.find('\n'));
    auto result = worker::parse_probe_result(json::parse(line, nullptr, false));
    const std::string label = item.model.name.empty() ? estimator::network_signature(item.model) : item.model.name;
    if (!exit || !exit->success() || !result || result->networks.size() != 1) {
      const std::string why = last_line(read_file(probe.directory / "stderr.log", 8192));
      failure = fmt::format("whole-network probe of {} (batch {}) failed with {}: {}", label, item.batch_size,
                            exit ? exit->describe() : "no exit status",
                            !why.empty() ? why
                            : result     ? "no result"
                                         : result.error().message);
    } else if (fingerprint_at_defaults(result->environment, probe.setting,
                                       config::device_threads(*device.config, options_.probing)) !=
                   device.environment ||
               result->meter_source != device.source) {
      // Not comparable with the layers it would be set beside: the next layer probe notices
      // the change and re-probes.
      failure = fmt::format(
          "whole-network probe of {} ran under \"{}\" metered by {}, the model under \"{}\" by {}: "
          "not kept",
          label, result->environment.fingerprint(), result->meter_source, device.environment, device.source);
    } else {
      const auto& network = result->networks.front();
      double joules = 0.0;
      for (const auto& repetition : network.repetitions)
        joules += repetition.joules_per_step *
                  (repetition.steps > 0 ? repetition.steps : std::max(1, network.steps_per_repetition));
      const auto ended = now_ms();
      device.last_probe_ms = ended;
      device.joules_today += joules;
      device.probe_joules += joules;
      ++device.probe_plans;
      metrics_.add_probe_runs(name, 1.0);
      metrics_.add_probe_energy(name, result->meter_source, joules);
      budgets_.record(adapters::StoredEnergyUse{budgets_.node(), name, "probe",
                                                ended - static_cast<std::int64_t>(seconds * 1000.0), ended, joules,
                                                result->meter_source});
      if (run != runs_.end()) {
        ++run->second.probes;
        run->second.joules += joules;
        run->second.source = result->meter_source;
      }
      estimator::WholeNetworkSample sample;
      sample.model = item.model;
      sample.signature = estimator::network_signature(item.model);
      if (auto layers = estimator::analyze_model(item.model, item.batch_size))
        sample.family = estimator::network_family(*layers);
      sample.batch_size = item.batch_size;
      sample.optimizer = item.optimizer;
      sample.joules_per_step = network.joules_per_step;
      sample.seconds_per_step = network.seconds_per_step;
      sample.joules_spread = network.joules_spread;
      sample.seconds_spread = network.seconds_spread;
      sample.measured_ms = ended;
      sample.setting = probe.setting;
      // Held out: what the model in use said of this network before its measurement joined.
      const auto& models = models_.models();
      if (const auto in_use = models.find(name); !probe.setting && in_use != models.end() && in_use->second) {
        const estimator::TrainingConfig one_step{item.batch_size, 1, item.batch_size, item.optimizer, std::nullopt};
        if (auto predicted = in_use->second->estimate(item.model, one_step);
            predicted && sample.joules_per_step > 0.0) {
          device.heldout.push_back(std::abs(predicted->joules_per_step.mean - sample.joules_per_step) /
                                   sample.joules_per_step);
          if (device.heldout.size() > kHeldOutWindow) device.heldout.pop_front();
        }
      }
      if (!device.learning->add_whole_network(sample)) {
        failure = fmt::format("whole-network probe of {} measured nothing usable ({:.3g} J, {:.3g} s per step)", label,
                              sample.joules_per_step, sample.seconds_per_step);
      } else {
        // A reading at a setting is no reading of the reference's speed.
        const double spread = probe.setting ? device.learning->speed_spread()
                                            : note_reference(device, item, ended, sample.joules_per_step);
        device.learning->set_speed_spread(spread);
        const auto& readings = device.reference_readings;
        if (!probe.setting && readings.size() >= 2 && readings.back().first == ended &&
            options_.probing.max_speed_spread > 0.0) {
          const double step = std::abs(std::log(readings.back().second / readings[readings.size() - 2].second));
          if (step > options_.probing.max_speed_spread) {
            device.speed_step_ms = ended;
            device.speed_step = step;
            // Tried once is no longer enough: their measurements describe a device that moved.
            std::erase_if(device.wholes_tried,
                          [](const std::string& key) { return key.find('@') == std::string::npos; });
            spdlog::warn(
                "device {}: its speed moved {:+.0f} % between two readings of its reference network: the "
                "networks measured whole before are measured again where that is worth it",
                name, 100.0 * (readings.back().second / readings[readings.size() - 2].second - 1.0));
          }
        }
        if (!readings.empty())
          metrics_.set_device_speed(name, readings.back().second / readings.front().second - 1.0, spread);
        metrics_.count_probe_outcome(name, "completed");
        adapters::StoredProbeSample row;
        row.device = name;
        row.fingerprint = device.environment + "; meter " + device.source;
        row.at_ms = ended;
        row.layer_key = kWholeRowKey;
        row.joules_per_step = sample.joules_per_step;
        row.seconds_per_step = sample.seconds_per_step;
        row.source = result->meter_source;
        row.detail_json = json{{"whole", estimator::to_json(sample)}, {"run", probe.run_id}}.dump();
        storage_.submit([row](adapters::Database& db) { return db.insert_probe_sample(row); },
                        [name](Status s) {
                          if (!s)
                            spdlog::error("device {}: whole-network sample not saved: {}", name, s.error().message);
                        });
        // Served at once: the fitted layers stay, the measurement and the gaps join them.
        if (device.fitted && !device.replacing) {
          auto updated = std::make_shared<estimator::DeviceEnergyModel>(*device.fitted);
          updated->add_whole_network(sample);
          updated->learn_whole_network_gaps();
          updated->set_speed_spread(spread);
          device.fitted = updated;
          install_model(device, updated);
        }
        spdlog::info("device {}: network {} measured whole at batch {}{}: {:.4g} J and {:.4g} s per step ({})", name,
                     label, item.batch_size, probe.setting ? " at " + probe.setting->label : std::string(),
                     sample.joules_per_step, sample.seconds_per_step, result->meter_source);
      }
    }
    if (failure.empty())
      device.whole_failures.erase(key_of(item, probe.setting));
    else
      device.whole_failures[key_of(item, probe.setting)] = failure;
    if (!failure.empty()) {
      outcome = ProbeOutcome::failed;
      metrics_.count_probe_outcome(name, "failed");
      spdlog::warn("device {}: {}", name, failure);
      if (run != runs_.end()) {
        ++run->second.failed;
        run->second.message = failure;
      }
    }
  }
  if (run != runs_.end()) save_run(run->first);
  std::error_code ec;
  std::filesystem::remove_all(probe.directory, ec);
  if (device.cycle.probe_ended(clock_.steady(), outcome))
    close_run(device, "failed", failure + " (" + device.cycle.backoff_reason() + ")");
}

std::vector<std::string> ProbeService::estimate_caveats(const std::string& device_name,
                                                        const estimator::ModelSpec& model,
                                                        const estimator::TrainingConfig& training) const {
  std::vector<std::string> out;
  const auto it = devices_.find(device_name);
  if (it == devices_.end()) return out;
  const Device& device = *it->second;
  const std::string signature = estimator::network_signature(model);
  const std::string optimizer = training.optimizer.empty() ? "sgd" : training.optimizer;
  const auto& learnt = device.fitted ? *device.fitted : *device.learning;
  const std::string network_key = estimator::whole_network_key(signature, training.batch_size, optimizer);
  for (const auto& [key, why] : device.whole_failures) {
    // This network at the defaults, or at a setting ("key@setting"); not another whose key
    // merely starts the same.
    if (key != network_key && key.rfind(network_key + "@", 0) != 0) continue;
    const auto at = key.find('@');
    if (at == std::string::npos) {
      if (learnt.whole_network(signature, training.batch_size, optimizer)) continue;  // measured before
      out.push_back(fmt::format("this network could not be measured whole on {} ({}): estimated from its layers{}",
                                device_name, why,
                                learnt.whole_network_gaps().empty() ? "" : " and its family's gap where learnt"));
    } else {
      out.push_back(
          fmt::format("this network could not be measured at {} on {} ({}): that setting is estimated "
                      "from the networks that were, or not at all",
                      key.substr(at + 1), device_name, why));
    }
  }
  const double spread = learnt.speed_spread();
  if (options_.probing.max_speed_spread > 0.0 && spread > options_.probing.max_speed_spread)
    out.push_back(
        fmt::format("device {} is noisy: its reference network's readings spread ±{:.0f} % (log σ {:.3f}), "
                    "above [probing] max_speed_spread {:.3f}; no estimate here is tighter than that, and "
                    "errors below it cannot be told from the device's own drift",
                    device_name, 100.0 * std::expm1(spread), spread, options_.probing.max_speed_spread));
  return out;
}

bool ProbeService::reference_due(const Device& device) const {
  if (!(options_.probing.reference_minutes > 0.0) || !device.reference || !device.fitted ||
      device.reference_readings.empty())
    return false;
  const auto due_ms =
      device.reference_readings.back().first + static_cast<std::int64_t>(options_.probing.reference_minutes * 60'000.0);
  return now_ms() >= due_ms;
}

double ProbeService::note_reference(Device& device, const estimator::WorkloadItem& item, std::int64_t at_ms,
                                    double joules_per_step) {
  constexpr std::size_t kReadingsKept = 24;  // 12 hours at the default half hour
  if (!device.reference) device.reference = item;
  if (key_of(*device.reference) == key_of(item)) {
    device.reference_readings.emplace_back(at_ms, joules_per_step);
    if (device.reference_readings.size() > kReadingsKept) device.reference_readings.pop_front();
  }
  // The sample standard deviation of the log readings, once there are three.
  const auto& readings = device.reference_readings;
  if (readings.size() < 3) return device.learning->speed_spread();
  double mean = 0.0;
  for (const auto& [ms, joules] : readings) mean += std::log(joules);
  mean /= static_cast<double>(readings.size());
  double sum = 0.0;
  for (const auto& [ms, joules] : readings) sum += (std::log(joules) - mean) * (std::log(joules) - mean);
  return std::sqrt(sum / static_cast<double>(readings.size() - 1));
}

bool ProbeService::restore_whole(Device& device, const adapters::StoredProbeSample& row) {
  if (row.layer_key != kWholeRowKey) return false;
  const auto detail = json::parse(row.detail_json, nullptr, false);
  if (!detail.is_object() || !detail.contains("whole")) return true;
  auto sample = estimator::whole_network_sample_from_json(detail["whole"]);
  if (!sample) {
    spdlog::warn("device {}: a stored whole-network sample is unreadable ({}: {}); skipped", device.name,
                 sample.error().where, sample.error().message);
    return true;
  }
  device.learning->add_whole_network(std::move(sample).value());
  return true;
}

json ProbeService::whole_info(const Device& device) {
  const auto& model = device.fitted ? *device.fitted : *device.learning;
  json families = json::object();
  for (const auto& [family, gap] : model.whole_network_gaps())
    families[family] = {{"networks", gap.samples},
                        {"joules_ratio", std::exp(gap.log_joules_mean)},
                        {"joules_log_std", gap.log_joules_std},
                        {"seconds_ratio", std::exp(gap.log_seconds_mean)},
                        {"seconds_log_std", gap.log_seconds_std}};
  const auto& wholes = model.whole_networks();
  const auto at_defaults = std::count_if(wholes.begin(), wholes.end(), [](const auto& w) { return !w.setting; });
  json out = {{"measured", at_defaults}, {"gaps", families}};
  if (device.probe && device.probe->whole) {
    out["measuring"] = device.probe->whole->model.name;
    if (device.probe->setting) out["measuring_at"] = estimator::to_json(*device.probe->setting);
  }
  // The knob settings networks were measured at (policy knobs.goal), and what each taught.
  if (!model.settings().empty()) {
    json settings = json::array();
    for (const auto& [key, setting] : model.settings())
      settings.push_back({{"knob", setting.setting.knob},
                          {"value", setting.setting.value},
                          {"label", setting.setting.label},
                          {"networks", setting.networks},
                          {"response", setting.response.has_value()}});
    out["settings"] = std::move(settings);
  }
  if (device.reference && !device.reference_readings.empty()) {
    const auto& readings = device.reference_readings;
    out["reference"] = {
        {"network", device.reference->model.name.empty() ? estimator::network_signature(device.reference->model)
                                                         : device.reference->model.name},
        {"batch_size", device.reference->batch_size},
        {"readings", readings.size()},
        {"last_ms", readings.back().first},
        {"joules_per_step", readings.back().second},
        {"drift", readings.back().second / readings.front().second - 1.0},
        {"spread", model.speed_spread()}};
  }
  return out;
}

}  // namespace joule::daemon
