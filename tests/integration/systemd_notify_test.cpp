// What jouled tells systemd, read from a NOTIFY_SOCKET of the test's own.

#include <signal.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "daemon_process.hpp"

using joule::testing::DaemonProcess;
using namespace std::chrono_literals;

TEST(SystemdNotifyTest, ready_status_watchdog_reload_and_stop) {
  DaemonProcess daemon({.config_toml = "[log]\nlevel = \"info\"\n", .env = {{"WATCHDOG_USEC", "400000"}}});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  // READY=1 comes once listening, in one datagram with the address in STATUS=.
  const auto first = daemon.notifications();
  const auto ready = std::find_if(first.begin(), first.end(),
                                  [](const std::string& m) { return m.find("READY=1") != std::string::npos; });
  ASSERT_NE(ready, first.end());
  EXPECT_NE(ready->find("STATUS=listening on 127.0.0.1:"), std::string::npos) << *ready;
  // Petted at a quarter of the period from the event loop.
  EXPECT_TRUE(daemon.wait_notification("WATCHDOG=1", 2000ms));

  daemon.signal(SIGHUP);
  EXPECT_TRUE(daemon.wait_notification("RELOADING=1", 5000ms));
  EXPECT_TRUE(daemon.wait_notification("config reloaded", 5000ms));

  daemon.signal(SIGTERM);
  EXPECT_TRUE(daemon.wait_notification("STOPPING=1", 5000ms));
  EXPECT_EQ(daemon.wait_exit(), 0);
}

TEST(SystemdNotifyTest, a_bad_reload_is_refused_and_the_running_config_stays) {
  DaemonProcess daemon({.config_toml = "[log]\nlevel = \"info\"\n"});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  // Break the config file in place, as an admin's typo would.
  const auto config = daemon.state_dir().parent_path() / "jouled.toml";
  std::ofstream(config) << "[log]\nlevel = \"verbose\"\n";
  daemon.signal(SIGHUP);
  EXPECT_TRUE(daemon.wait_notification("last reload refused", 5000ms));
  EXPECT_NE(daemon.log().find("reload refused, the running config stays"), std::string::npos) << daemon.log();
  EXPECT_NE(daemon.log().find("jouled.toml:2: log.level"), std::string::npos) << daemon.log();
  EXPECT_EQ(daemon.call("GET", "/healthz").first, 200u);
}

TEST(SystemdNotifyTest, a_manager_that_stops_reading_never_stalls_the_daemon) {
  // A 2 ms watchdog pets every 0.5 ms: the notify socket's queue (512 datagrams) fills within a
  // second unless the daemon sends without blocking.
  DaemonProcess daemon({.env = {{"WATCHDOG_USEC", "2000"}}});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(daemon.call("GET", "/healthz").first, 200u);
  EXPECT_EQ(daemon.call("GET", "/v1/jobs").first, 200u);
}
