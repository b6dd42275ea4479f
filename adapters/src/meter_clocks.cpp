#include "joule/adapters/meter_clocks.hpp"

#include <ctime>

namespace joule::adapters {

namespace {
double seconds_of(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
}  // namespace

double monotonic_seconds() { return seconds_of(CLOCK_MONOTONIC); }
double process_cpu_seconds() { return seconds_of(CLOCK_PROCESS_CPUTIME_ID); }

}  // namespace joule::adapters
