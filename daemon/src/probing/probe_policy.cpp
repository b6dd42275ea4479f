#include "joule/daemon/probe_policy.hpp"

#include <fmt/format.h>

namespace joule::daemon {

bool within_probing_hours(int minute, int start, int end) {
  return start < end ? (minute >= start && minute < end) : (minute >= start || minute < end);
}

std::optional<std::string> probing_refusal(const config::ProbingConfig& probing, const ProbeMoment& moment) {
  if (!moment.requested && !probing.enabled) return "probing is disabled ([probing] enabled = false)";
  if (!moment.requested && !within_probing_hours(moment.minute_of_day, probing.start_minute, probing.end_minute))
    return fmt::format("outside the probing hours {:02}:{:02}-{:02}:{:02} ([probing] hours)", probing.start_minute / 60,
                       probing.start_minute % 60, probing.end_minute / 60, probing.end_minute % 60);
  if (probing.max_joules_per_day > 0.0 && moment.joules_today >= probing.max_joules_per_day)
    return fmt::format("today's probe energy cap of {} J is spent ({:.0f} J)", probing.max_joules_per_day,
                       moment.joules_today);
  return std::nullopt;
}

}  // namespace joule::daemon
