#pragma once
// jouled's Prometheus metrics (names as listed in README.md, "Metrics"), kept in one prometheus-cpp
// Registry and served by our own HTTP server through the TextSerializer, so the daemon needs
// no second listener. No per-job labels: label values are bounded (devices, states, routes).

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "joule/common/clock.hpp"
#include "joule/estimator/outcome_calibration.hpp"
#include "joule/schedulers/policy.hpp"

namespace joule::daemon {

class Metrics {
 public:
  Metrics();

  /// The text exposition format (version 0.0.4) of everything registered.
  std::string serialize() const;

  /// Adds metered energy of a device; `source` is the meter's ("modelled", "rapl"...).
  /// This node's name: the `node` label of its own devices (an agent's are named "node/device").
  void set_node(std::string node) { node_ = std::move(node); }
  void set_nodes_in_state(const std::string& state, double count);
  void add_device_energy(const std::string& device, const std::string& source, double joules);
  void set_device_power(const std::string& device, const std::string& source, double watts);
  void set_jobs_in_state(std::string_view state, double count);
  /// Queued jobs by wait reason ("behind", "budget"...), after each placement pass; reasons
  /// not in `by_reason` read 0.
  void set_jobs_waiting(const std::map<std::string, double>& by_reason);
  void count_submission();
  /// One placement pass: a full one, or one that continued the last with jobs queued since.
  void count_placement_pass(bool continued);
  void add_job_energy(const std::string& device, const std::string& source, double joules);
  /// A finished job's energy and count under its project: `project` is a configured project's
  /// name, "none" or "other" (the caller bounds the labels: one per configured project).
  void add_project_job(const std::string& project, const std::string& source, std::optional<double> joules);
  /// One answered HTTP request; `route` is the route template, never the raw path.
  void observe_request(const std::string& route, unsigned status, double seconds);
  /// Time the event loop spent on one piece of work before it could answer anything else: a
  /// request's handler by route template (what it does before the commit it may wait for), a
  /// placement pass, a meter sample, estimating the queue again. Bounded labels.
  void observe_loop_work(const std::string& work, double seconds);
  void set_up_info(const std::string& version);
  /// Samples behind a device's model of one (layer kind, position), e.g. layer="conv2d@hidden".
  void set_model_samples(const std::string& device, const std::string& layer, double samples);
  void add_probe_runs(const std::string& device, double runs);
  /// (measured − estimated) / estimated of a finished job on a device, same meter source.
  void observe_estimate_error(const std::string& device, double relative_error);
  /// A device model's state: version, held-out error (median |relative error| of probe networks
  /// predicted before they were measured), time of the last probe.
  void set_model_state(const std::string& device, double version, double heldout_error, double last_probe_seconds);
  /// The device's reference network: its last reading against its first, and the readings' log σ.
  void set_device_speed(const std::string& device, double drift, double spread);
  void add_probe_energy(const std::string& device, const std::string& source, double joules);
  void count_probe_outcome(const std::string& device, const std::string& outcome);

  /// One budget's figures for the joule_budget_* gauges, in its unit: joule budgets in
  /// joule_budget_*_joules, grams budgets in joule_budget_*_grams, money budgets in
  /// joule_budget_*_cost{currency}.
  struct BudgetFigures {
    std::string name;
    schedulers::BudgetUnit unit = schedulers::BudgetUnit::joules;
    std::string currency;
    double limit = 0.0;
    double spent = 0.0;
    double reserved = 0.0;
    double remaining = 0.0;
  };
  /// Replaces the budget gauges (a reload may add or drop budgets).
  void set_budgets(const std::vector<BudgetFigures>& budgets);
  /// One throttling action: pause, resume, cpu-quota, gpu-power-limit and their clears.
  void count_throttle_action(const std::string& action);
  /// Jobs whose knobs were set on a device, or refused there (outcome "set" or "refused"); a
  /// setting placement chose ("chosen"), and what its check kept ("check-kept", "check-defaults").
  void count_knobs(const std::string& device, const std::string& outcome);

  /// The carbon signal ([carbon]): the intensity in force now (nullopt: none), what stands
  /// behind it (fresh, stale, constant, none: one gauge per state, 1 for the current one) and
  /// its loads that failed so far (a counter: raised to `failures`).
  void set_carbon_signal(std::optional<double> grams_per_kwh, std::string_view state, std::size_t failures);
  /// A finished job's grams of CO2e, by device and the joules' source (measured or modelled).
  void add_job_carbon(const std::string& device, const std::string& joules_source, double grams);
  /// The price signal ([price]), as set_carbon_signal: the price per kWh in force now in its
  /// currency, its state and its failed loads.
  void set_price_signal(std::optional<double> per_kwh, const std::string& currency, std::string_view state,
                        std::size_t failures);
  /// A finished job's cost, by device, the joules' source and the currency.
  void add_job_cost(const std::string& device, const std::string& joules_source, const std::string& currency,
                    double cost);

  /// What a device's finished jobs teach its estimates (OutcomeService), for the
  /// joule_calibration_* and joule_job_overhead_joules gauges; the errors and coverages exist
  /// from 5 rows on, the overhead line once fitted.
  void set_calibration(const std::string& device, const estimator::CalibrationSummary& summary);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& device_energy_;
  prometheus::Family<prometheus::Gauge>& device_power_;
  std::map<std::string, std::string> device_labels(const std::string& device, const std::string& source) const;
  // A signal's state gauges (1 for `state`) and its failed loads' counter, raised to `failures`.
  void set_signal_state(prometheus::Family<prometheus::Gauge>& states, prometheus::Family<prometheus::Counter>& failed,
                        double& counted, std::string_view state, std::size_t failures);

  std::string node_ = "localhost";
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Gauge>& jobs_waiting_;
  std::map<std::string, double> waiting_seen_;
  prometheus::Family<prometheus::Gauge>& nodes_;
  prometheus::Family<prometheus::Counter>& submitted_;
  prometheus::Family<prometheus::Counter>& placement_passes_;
  prometheus::Family<prometheus::Counter>& job_energy_;
  prometheus::Family<prometheus::Counter>& project_energy_;
  prometheus::Family<prometheus::Counter>& project_jobs_;
  prometheus::Family<prometheus::Counter>& http_requests_;
  prometheus::Family<prometheus::Histogram>& http_duration_;
  prometheus::Family<prometheus::Histogram>& loop_work_;
  prometheus::Family<prometheus::Gauge>& build_info_;
  prometheus::Family<prometheus::Gauge>& model_samples_;
  prometheus::Family<prometheus::Counter>& probe_runs_;
  prometheus::Family<prometheus::Histogram>& estimate_error_;
  prometheus::Family<prometheus::Gauge>& model_version_;
  prometheus::Family<prometheus::Gauge>& model_heldout_error_;
  prometheus::Family<prometheus::Gauge>& model_last_probe_;
  prometheus::Family<prometheus::Gauge>& speed_drift_;
  prometheus::Family<prometheus::Gauge>& speed_spread_;
  prometheus::Family<prometheus::Counter>& probe_energy_;
  prometheus::Family<prometheus::Counter>& probe_outcomes_;
  // Per budget unit (joules, grams, money): limit, remaining, spent, reserved.
  std::array<std::array<prometheus::Family<prometheus::Gauge>*, 4>, 3> budget_gauges_{};
  prometheus::Family<prometheus::Counter>& throttle_actions_;
  prometheus::Family<prometheus::Counter>& knobs_;
  prometheus::Family<prometheus::Gauge>& carbon_intensity_;
  prometheus::Family<prometheus::Gauge>& carbon_state_;
  prometheus::Family<prometheus::Counter>& carbon_failures_;
  prometheus::Family<prometheus::Counter>& job_carbon_;
  double carbon_failures_counted_ = 0.0;
  prometheus::Family<prometheus::Gauge>& price_;
  prometheus::Family<prometheus::Gauge>& price_state_;
  prometheus::Family<prometheus::Counter>& price_failures_;
  prometheus::Family<prometheus::Counter>& job_cost_;
  double price_failures_counted_ = 0.0;
  std::string price_currency_;  // the currency label of the price series set last
  prometheus::Family<prometheus::Gauge>& calibration_rows_;
  prometheus::Family<prometheus::Gauge>& calibration_error_;
  prometheus::Family<prometheus::Gauge>& calibration_coverage_;
  prometheus::Family<prometheus::Gauge>& calibration_sigma_scale_;
  prometheus::Family<prometheus::Gauge>& job_overhead_;
  // Each budget series set last (its unit and labels), so that a reload's dropped budgets go.
  std::vector<std::pair<std::size_t, std::map<std::string, std::string>>> budget_series_;
};

/// Times one piece of the event loop's work on `clock`'s monotonic time and records it under
/// joule_loop_work_seconds{work} when it goes out of scope.
class TimedWork {
 public:
  TimedWork(Metrics& metrics, std::string work, const Clock& clock)
      : metrics_(metrics), work_(std::move(work)), clock_(clock), started_(clock.steady()) {}
  ~TimedWork() { metrics_.observe_loop_work(work_, std::chrono::duration<double>(clock_.steady() - started_).count()); }
  TimedWork(const TimedWork&) = delete;
  TimedWork& operator=(const TimedWork&) = delete;

 private:
  Metrics& metrics_;
  std::string work_;
  const Clock& clock_;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace joule::daemon
