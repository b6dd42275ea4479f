#pragma once
// The HTTP/1.1 server of jouled (Boost.Beast over Asio): sessions with timeouts, a body limit,
// a connection limit and keep-alive. It knows nothing of routes: every request goes to one
// handler that answers through a callback, possibly later (after a commit), on the same
// io_context.

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "joule/common/result.hpp"

namespace joule::daemon {

using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;
using HttpResponse = boost::beast::http::response<boost::beast::http::string_body>;
/// Sends the response; call exactly once. Safe to call after the client went away.
using Reply = std::function<void(HttpResponse)>;
using HttpHandler = std::function<void(HttpRequest&&, Reply)>;
/// Called for requests refused before reaching the handler (413, 400, 503), for metrics.
using RefusalObserver = std::function<void(unsigned status)>;

struct HttpServerOptions {
  std::size_t max_body_bytes = 1 << 20;
  double timeout_seconds = 30.0;  ///< a request must arrive, and a response leave, within this
  std::size_t max_connections = 512;
};

class HttpSession;

class HttpServer {
 public:
  HttpServer(boost::asio::io_context& io, HttpHandler handler, HttpServerOptions options,
             RefusalObserver on_refusal = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// Binds and starts accepting. Port 0 picks a free port; the bound endpoint is returned.
  Result<boost::asio::ip::tcp::endpoint> listen(const std::string& host, std::uint16_t port);
  /// Stops accepting and closes idle connections; requests in flight still get their answers.
  void stop();
  std::size_t connections() const { return sessions_.size(); }

 private:
  friend class HttpSession;
  void accept();
  void forget(std::list<std::weak_ptr<HttpSession>>::iterator where);

  boost::asio::io_context& io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  HttpHandler handler_;
  HttpServerOptions options_;
  RefusalObserver on_refusal_;
  std::list<std::weak_ptr<HttpSession>> sessions_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace joule::daemon
