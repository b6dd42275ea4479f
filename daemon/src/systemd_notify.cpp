#include "joule/daemon/systemd_notify.hpp"

#include <systemd/sd-daemon.h>

#include <ctime>

#include <fmt/format.h>

namespace joule::daemon {
namespace {

void notify(const std::string& message) { ::sd_notify(0, message.c_str()); }

std::uint64_t monotonic_usec() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000ULL + static_cast<std::uint64_t>(ts.tv_nsec) / 1000ULL;
}

}  // namespace

void SystemdNotifier::ready(const std::string& status) { notify(fmt::format("READY=1\nSTATUS={}", status)); }
void SystemdNotifier::status(const std::string& status) { notify(fmt::format("STATUS={}", status)); }
// MONOTONIC_USEC lets systemd >= 253 (Type=notify-reload) match the reload; older ones ignore it.
void SystemdNotifier::reloading() { notify(fmt::format("RELOADING=1\nMONOTONIC_USEC={}", monotonic_usec())); }
void SystemdNotifier::stopping(const std::string& status) { notify(fmt::format("STOPPING=1\nSTATUS={}", status)); }
void SystemdNotifier::watchdog() { notify("WATCHDOG=1"); }

std::optional<std::chrono::microseconds> SystemdNotifier::watchdog_period() {
  std::uint64_t usec = 0;
  if (::sd_watchdog_enabled(0, &usec) > 0 && usec > 0) return std::chrono::microseconds(usec);
  return std::nullopt;
}

}  // namespace joule::daemon
