#pragma once
// The time services read, passed in rather than read from the system: wall-clock time for what
// is stored and shown, monotonic time for durations and timeouts (a wall clock set back must
// not make a job's run negative). Tests drive services with a ManualClock.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <set>

namespace joule {

class Clock {
 public:
  virtual ~Clock() = default;
  /// Wall-clock time in milliseconds since the Unix epoch: timestamps that are stored and shown.
  virtual std::int64_t unix_ms() const = 0;
  /// Monotonic time: durations, timeouts, rates.
  virtual std::chrono::steady_clock::time_point steady() const = 0;

  /// Timers on this clock (daemon::ClockTimer): how long to wait in real time before looking
  /// again whether `deadline` (a steady() time) has come.
  virtual std::chrono::nanoseconds real_wait(std::chrono::steady_clock::time_point deadline) const = 0;
  /// A timer begins or stops waiting for `deadline`; a ManualClock lists them, so that a test
  /// can move time on to the next one.
  virtual void timer_armed(std::chrono::steady_clock::time_point /*deadline*/) const {}
  virtual void timer_disarmed(std::chrono::steady_clock::time_point /*deadline*/) const {}
};

/// The system's clocks.
class SystemClock final : public Clock {
 public:
  std::int64_t unix_ms() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  std::chrono::steady_clock::time_point steady() const override { return std::chrono::steady_clock::now(); }
  std::chrono::nanoseconds real_wait(std::chrono::steady_clock::time_point deadline) const override {
    return std::max(deadline - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration::zero());
  }
};

/// The process's system clock, for services nobody gave another one.
inline const Clock& system_clock() {
  static const SystemClock clock;
  return clock;
}

/// A clock that moves only when told: wall time may be set anywhere (also back), monotonic
/// time only advances.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(std::int64_t unix_ms = 1'800'000'000'000) : unix_ms_(unix_ms) {}
  std::int64_t unix_ms() const override { return unix_ms_; }
  std::chrono::steady_clock::time_point steady() const override { return steady_; }
  /// It moves only when told: a timer looks again every millisecond of real time.
  std::chrono::nanoseconds real_wait(std::chrono::steady_clock::time_point deadline) const override {
    return deadline <= steady_ ? std::chrono::nanoseconds::zero() : std::chrono::milliseconds(1);
  }
  void timer_armed(std::chrono::steady_clock::time_point deadline) const override { deadlines_.insert(deadline); }
  void timer_disarmed(std::chrono::steady_clock::time_point deadline) const override {
    if (const auto it = deadlines_.find(deadline); it != deadlines_.end()) deadlines_.erase(it);
  }
  /// The earliest moment a timer on this clock waits for, if one waits.
  std::optional<std::chrono::steady_clock::time_point> next_deadline() const {
    if (deadlines_.empty()) return std::nullopt;
    return *deadlines_.begin();
  }
  /// Both clocks move on by `by`.
  void advance(std::chrono::milliseconds by) {
    unix_ms_ += by.count();
    steady_ += by;
  }
  /// Only the wall clock changes (an NTP step, an operator's `date -s`).
  void set_wall(std::int64_t unix_ms) { unix_ms_ = unix_ms; }

 private:
  std::int64_t unix_ms_;
  std::chrono::steady_clock::time_point steady_{};
  mutable std::multiset<std::chrono::steady_clock::time_point> deadlines_;  // of the timers waiting
};

}  // namespace joule
