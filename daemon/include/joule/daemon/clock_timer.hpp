#pragma once
// A one-shot timer on the event loop that fires when the injected clock's monotonic time
// reaches a deadline: with the system clock, an asio timer for the time left; with a
// ManualClock, when a test has moved the clock past it (the clock lists its timers' deadlines,
// so a test can move to the next one).

#include <chrono>
#include <functional>
#include <memory>
#include <optional>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "joule/common/clock.hpp"

namespace joule::daemon {

class ClockTimer {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  ClockTimer(boost::asio::io_context& io, const Clock& clock);
  ~ClockTimer();
  ClockTimer(const ClockTimer&) = delete;
  ClockTimer& operator=(const ClockTimer&) = delete;

  /// Calls `fire` once, on the loop, when the clock reaches `deadline` (at once if it has);
  /// replaces the wait in progress, whose `fire` is then never called.
  void wait_until(TimePoint deadline, std::function<void()> fire);
  /// The same, `delay` from the clock's now.
  void wait_for(std::chrono::steady_clock::duration delay, std::function<void()> fire) {
    wait_until(clock_.steady() + delay, std::move(fire));
  }
  /// Stops the wait in progress, if any.
  void cancel();
  /// The deadline waited for, if a wait is in progress.
  std::optional<TimePoint> deadline() const { return deadline_; }

 private:
  void arm();

  const Clock& clock_;
  boost::asio::steady_timer timer_;
  std::optional<TimePoint> deadline_;
  std::function<void()> fire_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace joule::daemon
