#pragma once
// A job as the job book (JobService) keeps it: its stored row, its spec, where it stands in the
// queue and what is in force on it. What runs it (a process group here, a placement on another
// node) is its executor's own state, kept by the executor. Private to the daemon's sources.

#include <chrono>
#include <optional>
#include <string_view>
#include <vector>

#include "joule/adapters/database.hpp"
#include "joule/daemon/device_knobs.hpp"
#include "joule/daemon/job_estimate.hpp"
#include "joule/schedulers/job.hpp"
#include "joule/schedulers/placement.hpp"
#include "joule/schedulers/setting_check.hpp"
#include "joule/schedulers/step_projection.hpp"

namespace joule::daemon {

/// How the reason of a run its runner ended for want of lease renewals starts: an agent tells
/// its coordinator so (ReportedJob::fenced), which queues the job again instead of ending it.
inline constexpr std::string_view kFencedReason = "fenced: ";

/// How long an agent reports a run's end (after a restart too) until its coordinator
/// acknowledges it; the run stays in the agent's memory that long.
inline constexpr std::int64_t kReportEndsForMs = 10 * 60 * 1000;

/// What the event says when a job starts to share its device: a run whose row was not written
/// since (jouled killed) is known by it at the next start.
inline constexpr std::string_view kSharedEnergyNote =
    "from now: its energy is its share of the device's by CPU time, idle power included";

/// The parts of a job's row that change as it runs, as last committed: what the API shows.
struct ShownRow {
  std::string state;
  std::string device;
  std::optional<std::int64_t> started_ms;
  std::optional<std::int64_t> finished_ms;
  std::optional<int> exit_code;
  std::string reason;
  std::optional<double> energy_joules;
  std::string energy_source;
  bool energy_partial = false;
  std::optional<double> carbon_grams;
  std::optional<double> carbon_intensity;
  std::string carbon_signal;
  std::optional<double> cost;
  std::optional<double> cost_price;
  std::string cost_currency;
  std::string cost_signal;

  static ShownRow of(const adapters::StoredJob& row) {
    return {row.state,          row.device,       row.started_ms,       row.finished_ms,
            row.exit_code,      row.reason,       row.energy_joules,    row.energy_source,
            row.energy_partial, row.carbon_grams, row.carbon_intensity, row.carbon_signal,
            row.cost,           row.cost_price,   row.cost_currency,    row.cost_signal};
  }
};

struct JobRecord {
  adapters::StoredJob row;  // everything that is persisted, as the daemon decides it
  /// The row as last committed: what the API shows and lists by (a state is shown only once it
  /// is durable), and the events committed so far.
  ShownRow shown;
  std::size_t events_shown = 0;
  schedulers::JobSpec spec;
  schedulers::JobState state = schedulers::JobState::queued;
  std::vector<adapters::StoredEvent> events;
  /// Its estimate on each eligible device, read once from row.estimate_json (the stored form).
  std::vector<DeviceEstimate> estimates;
  /// When this daemon saw it start, on the monotonic clock (not for runs adopted or reported
  /// from another node), and how long that run lasted once it ended: durations a wall clock set
  /// back cannot make negative.
  std::optional<std::chrono::steady_clock::time_point> started_steady;
  std::optional<double> run_seconds;
  std::optional<double> used_joules;  // its energy so far while it runs, as of the last meter sample
  std::string used_source;            // where that comes from (Executor::source_so_far)
  bool cancel_requested = false;
  // Scheduling (what the core decides with, its queue entry and its run's reports, is the core's):
  std::optional<schedulers::WaitReason> waiting;  // why it is not running, from the last pass
  // Shown by the API: its last epoch report and the projection the core made from it.
  std::optional<schedulers::EpochReport> last_report;
  std::optional<schedulers::Projection> projection;
  /// What the job said of its training with its last report (loss, accuracy, firing_rates).
  nlohmann::json training_figures = nlohmann::json::object();

  /// Before it is queued again: its next run reports its own epochs (from 1, or after the
  /// checkpoint it resumes from), so what the last run reported is dropped.
  void forget_run_reports() {
    last_report.reset();
    projection.reset();
    training_figures = nlohmann::json::object();
    forget_setting();
  }
  /// Its next placement chooses (and checks) a setting afresh.
  void forget_setting() {
    chosen_setting.reset();
    setting_check.reset();
    setting_check_noted = false;
    stored_check.reset();
    setting_was_in_force = false;
    row.chosen_setting.clear();
  }
  // Throttling in force (set by its executor, shown in GET /v1/jobs/{id}, offered to the controller):
  bool paused = false;
  std::optional<double> cpu_quota;
  std::optional<double> gpu_limit_watts;
  /// Its knobs as set on its device this run ("cpu_max_frequency_mhz 1600 (policy0 1600 MHz)");
  /// nothing when it asked for none, or they were refused (its events say why).
  std::optional<std::string> knobs_in_force;
  /// The knob setting placement chose for this run (policy knobs.goal), and what the job was
  /// expected to cost there and at the device's defaults; nullopt: its own knobs, or the defaults.
  struct ChosenSetting {
    estimator::KnobSetting setting;
    std::string goal;  ///< the policy's knobs.goal that chose it
    schedulers::Estimate at_setting;
    schedulers::Estimate at_default;
  };
  std::optional<ChosenSetting> chosen_setting;
  /// The chosen setting checked in its first epochs (setting_check.hpp); its result, once
  /// decided, is noted on the job and remembered for the next job of the same network.
  std::optional<schedulers::SettingCheck> setting_check;
  bool setting_check_noted = false;
  /// Read back from its row (a restart, or a finished job from the database): the check's verdict
  /// (the check itself is not resumed) and whether the setting was in force when it was stored.
  std::optional<schedulers::SettingCheckResult> stored_check;
  bool setting_was_in_force = false;
  /// The check's verdict, live or read back; nullptr before it decided.
  const schedulers::SettingCheckResult* check_result() const {
    if (setting_check && setting_check->result()) return &*setting_check->result();
    return stored_check ? &*stored_check : nullptr;
  }
  /// The cores it runs on this run: the count placement chose where it let it choose, else its
  /// resources.cores; 0: none asked.
  int run_cores() const { return row.cores > 0 ? row.cores : spec.resources.cores.value_or(0); }
  /// The cores it holds of a device that shares them (0: the whole device, as knobs make it).
  int held_cores() const { return spec.knobs.empty() ? run_cores() : 0; }
  /// What its executor sets before it starts: its own knobs, else the setting chosen for it.
  schedulers::Knobs effective_knobs() const;
  /// The measured setting it runs (or ran) at, if any: the one chosen for it unless its check
  /// gave it up, else its own knobs where they are one setting (setting_of).
  std::optional<estimator::KnobSetting> setting_ran_at() const {
    if (chosen_setting) {
      if (const auto* check = check_result(); check && !check->kept) return std::nullopt;
      return chosen_setting->setting;
    }
    return setting_of(spec.knobs);
  }
};

inline schedulers::Knobs JobRecord::effective_knobs() const {
  if (!spec.knobs.empty() || !chosen_setting) return spec.knobs;
  return knobs_of(chosen_setting->setting);
}

}  // namespace joule::daemon
