#pragma once
// What jouled tells systemd (sd_notify): READY=1 once listening, STATUS= lines, WATCHDOG=1,
// RELOADING=1, STOPPING=1. Without NOTIFY_SOCKET (not under systemd) every call is a no-op.

#include <chrono>
#include <optional>
#include <string>

namespace joule::daemon {

class SystemdNotifier {
 public:
  void ready(const std::string& status);
  void status(const std::string& status);
  void reloading();
  void stopping(const std::string& status);
  void watchdog();
  /// The watchdog period systemd asked for (WATCHDOG_USEC for this pid), if any.
  static std::optional<std::chrono::microseconds> watchdog_period();
};

}  // namespace joule::daemon
