#pragma once
// The states of a device's background probing as one explicit machine: events and the time in,
// the state and the next action out; pure, beside the rules of probe_policy.hpp.
//
//   checking_environment --(env known)--> busy | backing_off | refused | settling | converged | probing
//   checking_environment --(env failed)--> unavailable (until a reload)
//   probing --(probe ended)--> any of the above, backing_off after repeated failures
//
// Every state but `probing` and `checking_environment` is re-judged at each step from the
// conditions the caller reads (is a job on the device, does the policy refuse, does the
// planner still have a probe worth running), in that order of precedence.

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace joule::daemon {

enum class ProbeState {
  checking_environment,  ///< `joule-worker env` runs, or must run before any probe
  unavailable,           ///< the environment check failed: nothing until the config is reloaded
  busy,                  ///< a job runs on the device or waits for it
  backing_off,           ///< after failures to start or to complete probes
  refused,               ///< the policy says no now: disabled, outside the hours, daily cap spent
  settling,              ///< idle, but not yet for [probing] idle_seconds
  probing,               ///< a probe runs
  converged,             ///< the model is as sure as asked wherever the workload needs it
};

/// "checking_environment", "busy", ... (GET /v1/devices: model.probing.state).
std::string_view to_string(ProbeState state);

enum class ProbeOutcome { completed, failed, preempted };

/// What the machine is told at each step; the caller reads the clocks, the jobs and the policy.
struct ProbeConditions {
  bool device_busy = false;  ///< a job runs on the device or waits for it
  /// Why it is busy, where it is not the usual (a MIG device whose sibling has work); empty: the
  /// usual.
  std::string busy_reason;
  /// probing_refusal()'s sentence, if it refuses: for background probing, and for a requested
  /// run (which only the daily cap stops). Both, since a step may end a request.
  std::optional<std::string> refusal;
  std::optional<std::string> refusal_when_requested;
  double idle_seconds = 0.0;  ///< [probing] idle_seconds
  /// Whether the planner has a probe worth running; asked last, and only for background
  /// probing (a requested run probes while it may), since the planner's answer costs a search.
  std::function<bool()> needs_probing;
};

/// What to do after a step.
struct ProbeStep {
  enum class Action { none, check_environment, start_probe };
  Action action = Action::none;
  /// A requested run's time is over: close it and give the planner back its σ target.
  bool request_over = false;
  /// The open background run (if any) ends here, with this message. Never set while a
  /// requested run lasts: a request overrides the reasons a background run stops for.
  std::optional<std::string> end_background_run;
  /// The device has just become converged (worth one log line).
  bool newly_converged = false;
};

struct ProbeCycleOptions {
  int failures_before_backoff = 3;
  std::chrono::seconds failure_backoff{600};  ///< after that many failed probes in a row
  std::chrono::seconds launch_backoff{60};    ///< after a probe could not be started
};

class ProbeCycle {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  explicit ProbeCycle(ProbeCycleOptions options = {}) : options_(options) {}

  ProbeState state() const { return state_; }
  /// Why the device is not probing, for GET /v1/devices; empty while probing or converged.
  const std::string& waiting() const { return waiting_; }
  /// Whether a requested run (POST /v1/probes) lasts.
  bool requested() const { return requested_until_.has_value(); }
  /// A worker process (a probe or the environment check) runs: nothing else may start.
  bool worker_running() const { return worker_running_; }
  /// Why the last back-off began ("paused for 10 minutes after 3 failed probes in a row ...").
  const std::string& backoff_reason() const { return backoff_reason_; }

  /// Judges the device at `now` and says what to do; the caller does it and reports back.
  ProbeStep step(TimePoint now, const ProbeConditions& conditions);

  void environment_check_started();
  void environment_known();
  /// `joule-worker env` failed (`why` is shown): the device is unavailable until reload().
  void environment_failed(std::string why);
  /// Probes may now run under another environment (other threads, another worker): check it
  /// again before the next probe.
  void environment_may_have_changed();
  /// The config was reloaded: a device that was unavailable checks its environment again.
  void reload();

  /// POST /v1/probes: probe until `until`, whatever the policy's hours and idleness say.
  void request(TimePoint until) { requested_until_ = until; }
  /// The requested run ended early (nothing left to probe, or another request replaced it).
  void end_request() { requested_until_.reset(); }

  void probe_started();
  /// A probe ended. True when its failure starts a back-off (the caller closes the run as failed).
  bool probe_ended(TimePoint now, ProbeOutcome outcome);
  /// A probe could not be started; the next try waits for the launch back-off.
  void launch_failed(TimePoint now, std::string why);

 private:
  enum class Environment { unknown, checking, known, failed };

  /// Sets a state that is not probing, with its reason.
  void wait(ProbeState state, std::string why);

  ProbeCycleOptions options_;
  ProbeState state_ = ProbeState::checking_environment;
  std::string waiting_ = "checking joule-worker's environment";
  Environment environment_ = Environment::unknown;
  std::string environment_failure_;
  bool worker_running_ = false;
  std::optional<TimePoint> idle_since_;
  std::optional<TimePoint> requested_until_;
  TimePoint backoff_until_{};
  std::string backoff_reason_;
  int consecutive_failures_ = 0;
  bool converged_reported_ = false;  // since the last probe started
};

}  // namespace joule::daemon
