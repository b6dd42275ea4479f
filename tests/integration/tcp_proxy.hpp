#pragma once
// A TCP forwarder on 127.0.0.1 that a test can cut and heal: a network partition between an
// agent and its coordinator without network namespaces. Cut, it drops every connection it
// carries and closes new ones at once; healed, it forwards again.

#include <atomic>
#include <cstdint>
#include <thread>

namespace joule::testing {

class TcpProxy {
 public:
  explicit TcpProxy(std::uint16_t target_port);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  std::uint16_t port() const { return port_; }
  void cut() { cut_ = true; }
  void heal() { cut_ = false; }

 private:
  void run();

  std::uint16_t target_port_;
  std::uint16_t port_ = 0;
  int listener_ = -1;
  std::atomic<bool> cut_{false};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace joule::testing
