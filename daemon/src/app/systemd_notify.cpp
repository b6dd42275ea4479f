#include "joule/daemon/systemd_notify.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

namespace joule::daemon {
namespace {

// sd_notify() sends with a blocking sendmsg(): if the receiver stops reading (a stuck manager,
// a test that does not drain its socket) its queue fills and the event loop would hang inside
// a STATUS update. Notifications are advisory, so they go out non-blocking and are dropped
// when the queue is full.
void notify(const std::string& message) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (!path || (path[0] != '/' && path[0] != '@')) return;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::size_t length = std::strlen(path);
  if (length >= sizeof(address.sun_path)) return;
  std::memcpy(address.sun_path, path, length);
  if (path[0] == '@') address.sun_path[0] = '\0';  // abstract namespace
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return;
  const auto size = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + length);
  (void)::sendto(fd, message.data(), message.size(), MSG_NOSIGNAL | MSG_DONTWAIT,
                 reinterpret_cast<const sockaddr*>(&address), size);
  ::close(fd);
}

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
