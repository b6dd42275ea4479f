#include "joule/daemon/clock_timer.hpp"

namespace joule::daemon {

ClockTimer::ClockTimer(boost::asio::io_context& io, const Clock& clock) : clock_(clock), timer_(io) {}

ClockTimer::~ClockTimer() {
  *alive_ = false;
  cancel();
}

void ClockTimer::wait_until(TimePoint deadline, std::function<void()> fire) {
  cancel();
  deadline_ = deadline;
  fire_ = std::move(fire);
  clock_.timer_armed(deadline);
  arm();
}

void ClockTimer::cancel() {
  if (!deadline_) return;
  clock_.timer_disarmed(*deadline_);
  deadline_.reset();
  fire_ = nullptr;
  timer_.cancel();
}

void ClockTimer::arm() {
  timer_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(clock_.real_wait(*deadline_)));
  timer_.async_wait([this, alive = alive_, deadline = *deadline_](boost::system::error_code ec) {
    // A wait replaced by another (or cancelled) is not this one's to end.
    if (ec || !*alive || deadline_ != deadline) return;
    if (clock_.steady() < deadline) return arm();  // a manual clock not there yet, or a wake-up early
    auto fire = std::move(fire_);                  // `fire` may start the next wait
    cancel();
    if (fire) fire();
  });
}

}  // namespace joule::daemon
