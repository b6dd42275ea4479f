#include "joule/daemon/metrics.hpp"

#include "joule/schedulers/placement.hpp"

#include <fmt/format.h>
#include <prometheus/text_serializer.h>

#include <array>

namespace joule::daemon {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      device_energy_(
          BuildCounter()
              .Name("joule_device_energy_joules_total")
              .Help("Energy of each device since jouled started, by meter source (modelled is not a measurement)")
              .Register(*registry_)),
      device_power_(BuildGauge()
                        .Name("joule_device_power_watts")
                        .Help("Mean power of each device over the last meter interval, by meter source")
                        .Register(*registry_)),
      jobs_(BuildGauge().Name("joule_jobs").Help("Jobs known to this node, by state").Register(*registry_)),
      jobs_waiting_(BuildGauge()
                        .Name("joule_jobs_waiting")
                        .Help("Queued jobs by why they wait (behind: their turn has not come; budget, "
                              "power-cap, battery-floor, deadline, device-busy...)")
                        .Register(*registry_)),
      nodes_(BuildGauge()
                 .Name("joule_nodes")
                 .Help("Agents known to this coordinator, by state (joining, ready, lost)")
                 .Register(*registry_)),
      submitted_(BuildCounter()
                     .Name("joule_jobs_submitted_total")
                     .Help("Jobs accepted by the API (durably stored before acknowledgement)")
                     .Register(*registry_)),
      placement_passes_(BuildCounter()
                            .Name("joule_placement_passes_total")
                            .Help("Placement passes: full (the whole queue looked at again), or continued "
                                  "(only jobs queued at the tail since the last full pass decided)")
                            .Register(*registry_)),
      job_energy_(BuildCounter()
                      .Name("joule_job_energy_joules_total")
                      .Help("Energy metered over finished jobs' runs, by device and meter source")
                      .Register(*registry_)),
      project_energy_(BuildCounter()
                          .Name("joule_project_energy_joules_total")
                          .Help("Energy of finished jobs by project (configured projects; \"none\" for jobs without "
                                "one, \"other\" for projects no longer configured) and meter source")
                          .Register(*registry_)),
      project_jobs_(BuildCounter()
                        .Name("joule_project_jobs_total")
                        .Help("Finished jobs that ran, by project (as joule_project_energy_joules_total)")
                        .Register(*registry_)),
      http_requests_(BuildCounter()
                         .Name("joule_http_requests_total")
                         .Help("HTTP requests answered, by route template and status code")
                         .Register(*registry_)),
      http_duration_(BuildHistogram()
                         .Name("joule_http_request_duration_seconds")
                         .Help("Time from a request's arrival to its response, commit included")
                         .Register(*registry_)),
      loop_work_(BuildHistogram()
                     .Name("joule_loop_work_seconds")
                     .Help("Time the event loop spent on one piece of work before it could serve anything else, by "
                           "work (a request's handler by route, placement, sample, estimates)")
                     .Register(*registry_)),
      build_info_(BuildGauge().Name("joule_build_info").Help("Version of the running jouled").Register(*registry_)),
      model_samples_(BuildGauge()
                         .Name("joule_model_samples")
                         .Help("Probe samples behind each device's energy model, by layer kind and position")
                         .Register(*registry_)),
      probe_runs_(BuildCounter()
                      .Name("joule_probe_runs_total")
                      .Help("THOR probes run per device (simulated devices: by their simulator)")
                      .Register(*registry_)),
      estimate_error_(BuildHistogram()
                          .Name("joule_estimate_relative_error")
                          .Help("(measured - estimated) / estimated energy of finished jobs, per device, where the "
                                "job was metered by the same source the model learnt from")
                          .Register(*registry_)),
      model_version_(BuildGauge()
                         .Name("joule_model_version")
                         .Help("Version of each device's energy model in use (0: none)")
                         .Register(*registry_)),
      model_heldout_error_(BuildGauge()
                               .Name("joule_model_heldout_error_ratio")
                               .Help("Median |relative error| of the model's predictions of probe networks made "
                                     "before they were measured")
                               .Register(*registry_)),
      model_last_probe_(BuildGauge()
                            .Name("joule_model_last_probe_timestamp_seconds")
                            .Help("Unix time of each device's last completed probe")
                            .Register(*registry_)),
      speed_drift_(BuildGauge()
                       .Name("joule_device_speed_drift_ratio")
                       .Help("The device's reference network measured whole again: its last reading of joules per "
                             "step against its first, minus 1 ([probing] reference_minutes)")
                       .Register(*registry_)),
      speed_spread_(BuildGauge()
                        .Name("joule_device_speed_spread")
                        .Help("Standard deviation of the log of the reference network's readings: how much the "
                              "device's own speed moves, the least spread its estimates claim")
                        .Register(*registry_)),
      probe_energy_(BuildCounter()
                        .Name("joule_probe_energy_joules_total")
                        .Help("Metered energy of probe repetitions, by meter source (modelled is not a measurement)")
                        .Register(*registry_)),
      probe_outcomes_(BuildCounter()
                          .Name("joule_probe_outcomes_total")
                          .Help("Probe processes by outcome: completed, preempted, failed")
                          .Register(*registry_)),
      throttle_actions_(BuildCounter()
                            .Name("joule_throttle_actions_total")
                            .Help("Throttling actions taken on running jobs, by action")
                            .Register(*registry_)),
      knobs_(BuildCounter()
                 .Name("joule_job_knobs_total")
                 .Help("Jobs whose knobs were set on their device (outcome set), or refused there so that they "
                       "ran at the defaults (refused); settings placement chose for jobs (chosen), and what the "
                       "check in their first epochs kept (check-kept, check-defaults)")
                 .Register(*registry_)),
      carbon_intensity_(BuildGauge()
                            .Name("joule_grid_carbon_intensity_grams_per_kwh")
                            .Help("The grid's carbon intensity in force now under [carbon] (gCO2e/kWh)")
                            .Register(*registry_)),
      carbon_state_(BuildGauge()
                        .Name("joule_grid_carbon_signal_state")
                        .Help("1 for what the carbon intensity in force comes from: fresh (the source covers "
                              "now), stale (its last value, past its end), constant ([carbon] intensity), none")
                        .Register(*registry_)),
      carbon_failures_(BuildCounter()
                           .Name("joule_grid_carbon_signal_failures_total")
                           .Help("Loads of the carbon signal's file or URL that failed (unreadable, HTTP "
                                 "error, malformed); the last good signal stays in force")
                           .Register(*registry_)),
      job_carbon_(BuildCounter()
                      .Name("joule_job_carbon_grams_total")
                      .Help("Grams of CO2e of finished jobs: their joules (source: measured or modelled) times "
                            "the carbon intensity over their run")
                      .Register(*registry_)),
      price_(BuildGauge()
                 .Name("joule_grid_price_per_kwh")
                 .Help("The electricity price in force now under [price], per kWh in its currency")
                 .Register(*registry_)),
      price_state_(BuildGauge()
                       .Name("joule_grid_price_signal_state")
                       .Help("1 for what the price in force comes from: fresh (the source covers now), stale (its "
                             "last value, past its end), constant ([price] per_kwh), none")
                       .Register(*registry_)),
      price_failures_(BuildCounter()
                          .Name("joule_grid_price_signal_failures_total")
                          .Help("Loads of the price signal's file or URL that failed (unreadable, HTTP error, "
                                "malformed); the last good signal stays in force")
                          .Register(*registry_)),
      job_cost_(BuildCounter()
                    .Name("joule_job_cost_total")
                    .Help("What finished jobs cost: their joules (source: measured or modelled) times the price "
                          "over their run, in the currency labelled")
                    .Register(*registry_)),
      calibration_rows_(BuildGauge()
                            .Name("joule_calibration_rows")
                            .Help("Finished jobs each device's estimates learn from (same meter source, not partial)")
                            .Register(*registry_)),
      calibration_error_(BuildGauge()
                             .Name("joule_calibration_error_ratio")
                             .Help("Mean |estimate - metered| / metered over the rows: estimate=\"raw\" for the "
                                   "model's own, \"corrected\" for the correction with each row left out")
                             .Register(*registry_)),
      calibration_coverage_(BuildGauge()
                                .Name("joule_calibration_coverage_ratio")
                                .Help("Share of the rows whose metered joules fell inside the estimate's 2 sigma: "
                                      "estimate=\"raw\", or \"calibrated\" (each row left out)")
                                .Register(*registry_)),
      calibration_sigma_scale_(BuildGauge()
                                   .Name("joule_calibration_sigma_scale")
                                   .Help("Factor applied to the log-space sigma of new estimates (1: none)")
                                   .Register(*registry_)),
      job_overhead_(BuildGauge()
                        .Name("joule_job_overhead_joules")
                        .Help("What jobs use outside their training steps, learnt from finished jobs: per=\"job\" "
                              "(start-up) or \"epoch\"")
                        .Register(*registry_)) {
  // Budgets' gauges, one set per unit: joules as before, grams of CO2e, money (with its currency).
  constexpr std::array<std::pair<const char*, const char*>, 3> kUnits{
      {{"joules", "Energy"}, {"grams", "Grams of CO2e"}, {"cost", "Money"}}};
  for (std::size_t unit = 0; unit < kUnits.size(); ++unit) {
    const auto [suffix, what] = kUnits[unit];
    const std::array<std::pair<const char*, std::string>, 4> gauges{{
        {"limit", fmt::format("{} allowed per window by each budget of the policy", what)},
        {"remaining", "Limit minus spent minus reserved, per budget (negative: overrun)"},
        {"spent", fmt::format("{} of metered jobs and probes in each budget's current window", what)},
        {"reserved", fmt::format("{} placed and running jobs are still expected to use, per budget", what)},
    }};
    for (std::size_t g = 0; g < gauges.size(); ++g)
      budget_gauges_[unit][g] = &BuildGauge()
                                     .Name(fmt::format("joule_budget_{}_{}", gauges[g].first, suffix))
                                     .Help(gauges[g].second)
                                     .Register(*registry_);
  }
  for (const char* action :
       {"pause", "resume", "cpu-quota", "clear-cpu-quota", "gpu-power-limit", "clear-gpu-power-limit"})
    throttle_actions_.Add({{"action", action}});
  for (const char* state : {"queued", "placed", "running", "throttled", "succeeded", "failed", "cancelled"}) {
    jobs_.Add({{"state", state}}).Set(0);
  }
  using Kind = schedulers::WaitReason::Kind;
  for (const auto kind : {Kind::behind, Kind::device_busy, Kind::no_free_device, Kind::budget, Kind::max_energy,
                          Kind::power_cap, Kind::battery_floor, Kind::deadline, Kind::no_estimate, Kind::unavailable,
                          Kind::cleaner_window, Kind::not_before, Kind::quota})
    jobs_waiting_.Add({{"reason", std::string(schedulers::to_string(kind))}}).Set(0);
  submitted_.Add({});
  for (const char* kind : {"full", "continued"}) placement_passes_.Add({{"kind", kind}});
}

std::string Metrics::serialize() const { return prometheus::TextSerializer().Serialize(registry_->Collect()); }

std::map<std::string, std::string> Metrics::device_labels(const std::string& device, const std::string& source) const {
  // An agent's device is "node/device" on the coordinator: one label each.
  const auto slash = device.find('/');
  if (slash == std::string::npos) return {{"node", node_}, {"device", device}, {"source", source}};
  return {{"node", device.substr(0, slash)}, {"device", device.substr(slash + 1)}, {"source", source}};
}

void Metrics::add_device_energy(const std::string& device, const std::string& source, double joules) {
  if (joules > 0.0)
    device_energy_.Add(device_labels(device, source)).Increment(joules);
  else
    device_energy_.Add(device_labels(device, source));
}

void Metrics::set_device_power(const std::string& device, const std::string& source, double watts) {
  device_power_.Add(device_labels(device, source)).Set(watts);
}

void Metrics::set_nodes_in_state(const std::string& state, double count) { nodes_.Add({{"state", state}}).Set(count); }

void Metrics::set_jobs_in_state(std::string_view state, double count) {
  jobs_.Add({{"state", std::string(state)}}).Set(count);
}

void Metrics::set_jobs_waiting(const std::map<std::string, double>& by_reason) {
  for (const auto& [reason, count] : waiting_seen_)
    if (!by_reason.contains(reason)) jobs_waiting_.Add({{"reason", reason}}).Set(0);
  for (const auto& [reason, count] : by_reason) jobs_waiting_.Add({{"reason", reason}}).Set(count);
  waiting_seen_ = by_reason;
}

void Metrics::count_submission() { submitted_.Add({}).Increment(); }

void Metrics::count_placement_pass(bool continued) {
  placement_passes_.Add({{"kind", continued ? "continued" : "full"}}).Increment();
}

void Metrics::add_job_energy(const std::string& device, const std::string& source, double joules) {
  if (joules > 0.0) job_energy_.Add(device_labels(device, source)).Increment(joules);
}

void Metrics::add_project_job(const std::string& project, const std::string& source, std::optional<double> joules) {
  project_jobs_.Add({{"node", node_}, {"project", project}}).Increment();
  if (joules && *joules > 0.0)
    project_energy_.Add({{"node", node_}, {"project", project}, {"source", source}}).Increment(*joules);
}

void Metrics::observe_request(const std::string& route, unsigned status, double seconds) {
  http_requests_.Add({{"route", route}, {"code", std::to_string(status)}}).Increment();
  static const prometheus::Histogram::BucketBoundaries buckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                                  0.25,   0.5,   1.0,    2.5,   5.0,  10.0,  30.0};
  http_duration_.Add({{"route", route}}, buckets).Observe(seconds);
}

void Metrics::observe_loop_work(const std::string& work, double seconds) {
  static const prometheus::Histogram::BucketBoundaries buckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                                  0.01,   0.025,   0.05,   0.1,   0.25,   1.0};
  loop_work_.Add({{"work", work}}, buckets).Observe(seconds);
}

void Metrics::set_model_samples(const std::string& device, const std::string& layer, double samples) {
  model_samples_.Add({{"device", device}, {"layer", layer}}).Set(samples);
}

void Metrics::add_probe_runs(const std::string& device, double runs) {
  probe_runs_.Add({{"device", device}}).Increment(runs);
}

void Metrics::set_up_info(const std::string& version) { build_info_.Add({{"version", version}}).Set(1); }

}  // namespace joule::daemon

namespace joule::daemon {

void Metrics::observe_estimate_error(const std::string& device, double relative_error) {
  static const prometheus::Histogram::BucketBoundaries buckets = {-0.5, -0.25, -0.1, -0.05, -0.02, 0.0,
                                                                  0.02, 0.05,  0.1,  0.25,  0.5,   1.0};
  estimate_error_.Add({{"device", device}}, buckets).Observe(relative_error);
}

void Metrics::set_model_state(const std::string& device, double version, double heldout_error,
                              double last_probe_seconds) {
  model_version_.Add({{"device", device}}).Set(version);
  model_heldout_error_.Add({{"device", device}}).Set(heldout_error);
  model_last_probe_.Add({{"device", device}}).Set(last_probe_seconds);
}

void Metrics::set_device_speed(const std::string& device, double drift, double spread) {
  speed_drift_.Add({{"device", device}}).Set(drift);
  speed_spread_.Add({{"device", device}}).Set(spread);
}

void Metrics::set_calibration(const std::string& device, const estimator::CalibrationSummary& figures) {
  calibration_rows_.Add({{"device", device}}).Set(static_cast<double>(figures.rows));
  calibration_sigma_scale_.Add({{"device", device}}).Set(figures.sigma_scale);
  // A figure that no longer exists (a device re-probed under a new environment starts its
  // calibration again) is removed, not left at the old environment's value.
  const auto set = [](prometheus::Family<prometheus::Gauge>& family, const prometheus::Labels& labels,
                      const std::optional<double>& value) {
    if (value)
      family.Add(labels).Set(*value);
    else if (family.Has(labels))
      family.Remove(&family.Add(labels));
  };
  set(calibration_error_, {{"device", device}, {"estimate", "raw"}}, figures.raw_error);
  set(calibration_error_, {{"device", device}, {"estimate", "corrected"}}, figures.corrected_error);
  set(calibration_coverage_, {{"device", device}, {"estimate", "raw"}}, figures.raw_coverage);
  set(calibration_coverage_, {{"device", device}, {"estimate", "calibrated"}}, figures.calibrated_coverage);
  const auto& overhead = figures.overhead_joules;
  set(job_overhead_, {{"device", device}, {"per", "job"}},
      overhead ? std::optional<double>(overhead->per_job) : std::nullopt);
  set(job_overhead_, {{"device", device}, {"per", "epoch"}},
      overhead ? std::optional<double>(overhead->per_epoch) : std::nullopt);
}

void Metrics::add_probe_energy(const std::string& device, const std::string& source, double joules) {
  probe_energy_.Add({{"device", device}, {"source", source}}).Increment(joules);
}

void Metrics::count_probe_outcome(const std::string& device, const std::string& outcome) {
  probe_outcomes_.Add({{"device", device}, {"outcome", outcome}}).Increment();
}

void Metrics::set_budgets(const std::vector<BudgetFigures>& budgets) {
  // A reload may drop budgets or change their units: their series go with them.
  for (const auto& [unit, labels] : budget_series_)
    for (auto* family : budget_gauges_[unit]) family->Remove(&family->Add(labels));
  budget_series_.clear();
  for (const auto& budget : budgets) {
    const auto unit = static_cast<std::size_t>(budget.unit);
    std::map<std::string, std::string> labels{{"budget", budget.name}};
    if (budget.unit == schedulers::BudgetUnit::money) labels["currency"] = budget.currency;
    const std::array<double, 4> values{budget.limit, budget.remaining, budget.spent, budget.reserved};
    for (std::size_t g = 0; g < values.size(); ++g) budget_gauges_[unit][g]->Add(labels).Set(values[g]);
    budget_series_.emplace_back(unit, std::move(labels));
  }
}

void Metrics::count_throttle_action(const std::string& action) {
  throttle_actions_.Add({{"action", action}}).Increment();
}

void Metrics::set_carbon_signal(std::optional<double> grams_per_kwh, std::string_view state, std::size_t failures) {
  // No signal: no sample, rather than a 0 that reads as a perfectly clean grid.
  auto& intensity = carbon_intensity_.Add({{"node", node_}});
  if (grams_per_kwh)
    intensity.Set(*grams_per_kwh);
  else
    carbon_intensity_.Remove(&intensity);
  set_signal_state(carbon_state_, carbon_failures_, carbon_failures_counted_, state, failures);
}

void Metrics::set_signal_state(prometheus::Family<prometheus::Gauge>& states,
                               prometheus::Family<prometheus::Counter>& failed, double& counted, std::string_view state,
                               std::size_t failures) {
  for (const std::string_view each : {"fresh", "stale", "constant", "none"})
    states.Add({{"node", node_}, {"state", std::string(each)}}).Set(each == state ? 1.0 : 0.0);
  // The feed counts its failures; the counter is raised to that count.
  auto& counter = failed.Add({{"node", node_}});
  if (static_cast<double>(failures) > counted) {
    counter.Increment(static_cast<double>(failures) - counted);
    counted = static_cast<double>(failures);
  }
}

void Metrics::add_job_carbon(const std::string& device, const std::string& joules_source, double grams) {
  if (grams > 0.0) job_carbon_.Add(device_labels(device, joules_source)).Increment(grams);
}

void Metrics::set_price_signal(std::optional<double> per_kwh, const std::string& currency, std::string_view state,
                               std::size_t failures) {
  // No price: no sample, rather than a 0 that reads as free power.
  if (!price_currency_.empty() && price_currency_ != currency)
    price_.Remove(&price_.Add({{"node", node_}, {"currency", price_currency_}}));
  price_currency_ = currency;
  if (!currency.empty()) {
    auto& price = price_.Add({{"node", node_}, {"currency", currency}});
    if (per_kwh)
      price.Set(*per_kwh);
    else
      price_.Remove(&price);
  }
  set_signal_state(price_state_, price_failures_, price_failures_counted_, state, failures);
}

void Metrics::add_job_cost(const std::string& device, const std::string& joules_source, const std::string& currency,
                           double cost) {
  if (cost <= 0.0) return;
  auto labels = device_labels(device, joules_source);
  labels["currency"] = currency;
  job_cost_.Add(labels).Increment(cost);
}

void Metrics::count_knobs(const std::string& device, const std::string& outcome) {
  knobs_.Add({{"device", device}, {"outcome", outcome}, {"node", node_}}).Increment();
}

}  // namespace joule::daemon
