#include "tcp_proxy.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>
#include <vector>

namespace joule::testing {

namespace {
int connect_to(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}
}  // namespace

TcpProxy::TcpProxy(std::uint16_t target_port) : target_port_(target_port) {
  listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int yes = 1;
  ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  ::listen(listener_, 64);
  socklen_t length = sizeof(address);
  ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
  port_ = ntohs(address.sin_port);
  thread_ = std::thread([this] { run(); });
}

TcpProxy::~TcpProxy() {
  stopping_ = true;
  thread_.join();
  ::close(listener_);
}

void TcpProxy::run() {
  std::vector<std::pair<int, int>> pairs;  // (client, upstream)
  auto drop = [&](std::size_t i) {
    ::close(pairs[i].first);
    ::close(pairs[i].second);
    pairs.erase(pairs.begin() + static_cast<long>(i));
  };
  while (!stopping_) {
    if (cut_) {
      while (!pairs.empty()) drop(0);
    }
    std::vector<pollfd> fds{{listener_, POLLIN, 0}};
    for (const auto& [a, b] : pairs) {
      fds.push_back({a, POLLIN, 0});
      fds.push_back({b, POLLIN, 0});
    }
    if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
    // Only the pairs that were polled have entries in fds; one accepted below waits for the next
    // poll (ASan found the loop reading past fds after an accept).
    const std::size_t polled = pairs.size();
    if (fds[0].revents & POLLIN) {
      const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      const int upstream = cut_ ? -1 : connect_to(target_port_);
      if (upstream < 0) {
        ::close(client);
      } else {
        pairs.emplace_back(client, upstream);
      }
    }
    for (std::size_t i = polled; i-- > 0;) {
      const auto& from_client = fds[1 + 2 * i];
      const auto& from_upstream = fds[2 + 2 * i];
      char buffer[65536];
      bool closed = false;
      for (const auto& [ready, source, sink] : {std::tuple{from_client.revents, pairs[i].first, pairs[i].second},
                                               std::tuple{from_upstream.revents, pairs[i].second, pairs[i].first}}) {
        if (closed || !(ready & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t got = ::read(source, buffer, sizeof(buffer));
        if (got <= 0 || ::write(sink, buffer, static_cast<std::size_t>(got)) != got) closed = true;
      }
      if (closed) drop(i);
    }
  }
  while (!pairs.empty()) drop(0);
}

}  // namespace joule::testing
