#pragma once
// A real joule::daemon::HttpServer on 127.0.0.1:0 with its io_context on a thread of its own,
// for tests that talk to it through sockets (plain or TLS).

#include <atomic>
#include <cstdint>
#include <future>
#include <optional>
#include <stdexcept>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include "joule/daemon/http_server.hpp"

namespace joule::testing {

class RunningHttpServer {
 public:
  RunningHttpServer(daemon::HttpHandler handler, daemon::HttpServerOptions options) {
    server_.emplace(io_, std::move(handler), std::move(options), [this](unsigned status) {
      if (status == 400) ++refused_400_;
      if (status == 503) ++refused_503_;
    });
    auto bound = server_->listen("127.0.0.1", 0);
    if (!bound) throw std::runtime_error(bound.error().message);
    port_ = bound->port();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~RunningHttpServer() {
    work_.reset();
    io_.stop();
    thread_.join();
    server_.reset();  // before the io_context, which still holds the sessions' handlers
  }
  RunningHttpServer(const RunningHttpServer&) = delete;
  RunningHttpServer& operator=(const RunningHttpServer&) = delete;

  std::uint16_t port() const { return port_; }
  /// Refusals the server reported (a failed TLS handshake counts as 400).
  int refused_400() const { return refused_400_; }
  int refused_503() const { return refused_503_; }

  /// Runs `action(server)` on the io thread and waits for it.
  template <class Action>
  auto on_io(Action action) {
    std::packaged_task<decltype(action(*server_))()> task([&] { return action(*server_); });
    auto done = task.get_future();
    boost::asio::post(io_, [&task] { task(); });
    return done.get();
  }

 private:
  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_{io_.get_executor()};
  std::optional<daemon::HttpServer> server_;
  std::atomic<int> refused_400_{0};
  std::atomic<int> refused_503_{0};
  std::uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace joule::testing
