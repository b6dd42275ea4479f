#include "joule/daemon/clock_timer.hpp"

#include <gtest/gtest.h>
#include <boost/asio/executor_work_guard.hpp>

namespace joule::daemon {
namespace {

using namespace std::chrono_literals;

class ClockTimerTest : public ::testing::Test {
 protected:
  /// Runs the loop for a little real time.
  void run_for(std::chrono::milliseconds real) {
    auto busy = boost::asio::make_work_guard(io_);
    io_.run_for(real);
    io_.restart();
  }

  boost::asio::io_context io_;
  ManualClock clock_;
};

TEST_F(ClockTimerTest, fires_once_when_the_manual_clock_reaches_its_deadline_not_when_real_time_passes) {
  ClockTimer timer(io_, clock_);
  int fired = 0;
  timer.wait_for(30s, [&] { ++fired; });
  EXPECT_EQ(clock_.next_deadline(), clock_.steady() + 30s);
  run_for(20ms);
  EXPECT_EQ(fired, 0);
  clock_.advance(29s);
  run_for(20ms);
  EXPECT_EQ(fired, 0);
  clock_.advance(1s);
  run_for(20ms);
  EXPECT_EQ(fired, 1);
  EXPECT_FALSE(timer.deadline());
  EXPECT_FALSE(clock_.next_deadline());
  clock_.advance(1h);
  run_for(20ms);
  EXPECT_EQ(fired, 1);
}

TEST_F(ClockTimerTest, a_new_wait_replaces_the_one_in_progress_and_cancel_ends_it) {
  ClockTimer timer(io_, clock_);
  std::vector<int> fired;
  timer.wait_for(10s, [&] { fired.push_back(1); });
  timer.wait_for(20s, [&] { fired.push_back(2); });
  EXPECT_EQ(clock_.next_deadline(), clock_.steady() + 20s);  // the replaced wait is no longer listed
  clock_.advance(15s);
  run_for(20ms);
  EXPECT_TRUE(fired.empty());
  clock_.advance(5s);
  run_for(20ms);
  EXPECT_EQ(fired, std::vector<int>{2});
  timer.wait_for(5s, [&] { fired.push_back(3); });
  timer.cancel();
  EXPECT_FALSE(clock_.next_deadline());
  clock_.advance(10s);
  run_for(20ms);
  EXPECT_EQ(fired, std::vector<int>{2});
}

TEST_F(ClockTimerTest, a_callback_may_start_the_next_wait_and_a_destroyed_timer_is_unlisted) {
  int fired = 0;
  {
    ClockTimer timer(io_, clock_);
    std::function<void()> again = [&] {
      if (++fired < 3) timer.wait_for(1s, again);
    };
    timer.wait_for(1s, again);
    for (int i = 0; i < 5; ++i) {
      clock_.advance(1s);
      run_for(10ms);
    }
    EXPECT_EQ(fired, 3);
    timer.wait_for(1min, [] {});
    EXPECT_TRUE(clock_.next_deadline());
  }
  EXPECT_FALSE(clock_.next_deadline());
  clock_.advance(2min);
  run_for(10ms);  // nothing of the destroyed timer runs
}

TEST_F(ClockTimerTest, a_deadline_already_past_fires_on_the_next_turn_of_the_loop) {
  ClockTimer timer(io_, clock_);
  bool fired = false;
  timer.wait_until(clock_.steady() - 1s, [&] { fired = true; });
  EXPECT_FALSE(fired);  // never from inside wait_until
  run_for(10ms);
  EXPECT_TRUE(fired);
}

TEST_F(ClockTimerTest, on_the_system_clock_it_waits_real_time) {
  ClockTimer timer(io_, system_clock());
  bool fired = false;
  const auto started = std::chrono::steady_clock::now();
  timer.wait_for(30ms, [&] { fired = true; });
  auto busy = boost::asio::make_work_guard(io_);
  while (!fired && std::chrono::steady_clock::now() - started < 5s) {
    io_.run_for(5ms);
    io_.restart();
  }
  EXPECT_TRUE(fired);
  EXPECT_GE(std::chrono::steady_clock::now() - started, 30ms);
}

}  // namespace
}  // namespace joule::daemon
