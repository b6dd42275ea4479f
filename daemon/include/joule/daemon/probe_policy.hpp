#pragma once
// Whether background probing may run on a device now: pure, so the rules are tested directly.

#include <optional>
#include <string>

#include "joule/config/daemon_config.hpp"

namespace joule::daemon {

/// What the rules look at; clocks are read by the caller.
struct ProbeMoment {
  bool requested = false;      ///< a POST /v1/probes run is active (overrides enabled and hours)
  int minute_of_day = 0;       ///< local time
  double joules_today = 0.0;   ///< metered probe energy since local midnight
};

/// Whether a minute of the day lies in [start, end); a range with start > end wraps midnight.
bool within_probing_hours(int minute_of_day, int start_minute, int end_minute);

/// Why probing may not run now (a sentence for GET /v1/devices), or nothing when it may.
/// The daily joule cap holds for requested runs too: it is a budget, not a schedule.
std::optional<std::string> probing_refusal(const config::ProbingConfig& probing, const ProbeMoment& moment);

}  // namespace joule::daemon
