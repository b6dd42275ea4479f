#include "joule/daemon/probe_cycle.hpp"

#include <fmt/format.h>

namespace joule::daemon {

std::string_view to_string(ProbeState state) {
  switch (state) {
    case ProbeState::checking_environment:
      return "checking_environment";
    case ProbeState::unavailable:
      return "unavailable";
    case ProbeState::busy:
      return "busy";
    case ProbeState::backing_off:
      return "backing_off";
    case ProbeState::refused:
      return "refused";
    case ProbeState::settling:
      return "settling";
    case ProbeState::probing:
      return "probing";
    case ProbeState::converged:
      return "converged";
  }
  return "unknown";
}

void ProbeCycle::wait(ProbeState state, std::string why) {
  state_ = state;
  waiting_ = std::move(why);
}

ProbeStep ProbeCycle::step(TimePoint now, const ProbeConditions& conditions) {
  ProbeStep out;
  if (worker_running_) return out;  // a probe or the environment check: its end is an event
  if (environment_ == Environment::unknown) {
    wait(ProbeState::checking_environment, "checking joule-worker's environment");
    out.action = ProbeStep::Action::check_environment;
    return out;
  }
  if (requested_until_ && now >= *requested_until_) {
    requested_until_.reset();
    out.request_over = true;
  }
  const bool requested = requested_until_.has_value();
  // Each reason below also ends a background run (a request lasts its time regardless).
  const auto stop_here = [&](ProbeState state, std::string why) {
    wait(state, std::move(why));
    if (!requested) out.end_background_run = waiting_;
    return out;
  };
  if (environment_ == Environment::failed) return stop_here(ProbeState::unavailable, environment_failure_);
  if (conditions.device_busy) {
    idle_since_.reset();
    return stop_here(ProbeState::busy, conditions.busy_reason.empty() ? "a job runs on the device or waits for it"
                                                                      : conditions.busy_reason);
  }
  if (!idle_since_) idle_since_ = now;
  if (now < backoff_until_) return stop_here(ProbeState::backing_off, backoff_reason_);
  if (const auto& refusal = requested ? conditions.refusal_when_requested : conditions.refusal)
    return stop_here(ProbeState::refused, *refusal);
  if (!requested) {
    const double idle = std::chrono::duration<double>(now - *idle_since_).count();
    if (idle < conditions.idle_seconds) {
      wait(ProbeState::settling,
           fmt::format("waiting for {:.0f} s of idleness ([probing] idle_seconds)", conditions.idle_seconds - idle));
      return out;
    }
    if (!conditions.needs_probing || !conditions.needs_probing()) {
      out.newly_converged = !converged_reported_;
      converged_reported_ = true;
      wait(ProbeState::converged, "");
      out.end_background_run = "the model is sure enough where the workload needs it";
      return out;
    }
  }
  waiting_.clear();
  out.action = ProbeStep::Action::start_probe;
  return out;
}

void ProbeCycle::environment_check_started() {
  environment_ = Environment::checking;
  worker_running_ = true;
  wait(ProbeState::checking_environment, "checking joule-worker's environment");
}

void ProbeCycle::environment_known() {
  environment_ = Environment::known;
  worker_running_ = false;
  wait(ProbeState::settling, "");  // judged at the next step
}

void ProbeCycle::environment_failed(std::string why) {
  environment_ = Environment::failed;
  worker_running_ = false;
  environment_failure_ = std::move(why);
  wait(ProbeState::unavailable, environment_failure_);
}

void ProbeCycle::environment_may_have_changed() {
  if (environment_ == Environment::known) environment_ = Environment::unknown;
}

void ProbeCycle::reload() {
  if (environment_ == Environment::failed) environment_ = Environment::unknown;
}

void ProbeCycle::probe_started() {
  worker_running_ = true;
  converged_reported_ = false;
  wait(ProbeState::probing, "");
}

bool ProbeCycle::probe_ended(TimePoint now, ProbeOutcome outcome) {
  worker_running_ = false;
  wait(ProbeState::settling, "");  // judged at the next step
  switch (outcome) {
    case ProbeOutcome::completed:
      consecutive_failures_ = 0;
      return false;
    case ProbeOutcome::preempted:
      return false;  // a job needed the device: says nothing about the probes
    case ProbeOutcome::failed:
      if (++consecutive_failures_ < options_.failures_before_backoff) return false;
      consecutive_failures_ = 0;
      backoff_until_ = now + options_.failure_backoff;
      backoff_reason_ = fmt::format("paused for {} minutes after {} failed probes in a row (see GET /v1/probes)",
                                    options_.failure_backoff.count() / 60, options_.failures_before_backoff);
      return true;
  }
  return false;
}

void ProbeCycle::launch_failed(TimePoint now, std::string why) {
  backoff_until_ = now + options_.launch_backoff;
  backoff_reason_ = fmt::format("{} (trying again in {} s)", why, options_.launch_backoff.count());
  wait(ProbeState::backing_off, backoff_reason_);
}

}  // namespace joule::daemon
