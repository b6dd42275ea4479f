#include "joule/daemon/http_server.hpp"

#include <chrono>

#include <fmt/format.h>
#include <boost/asio/ip/address.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

namespace joule::daemon {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket socket, HttpServer& server)
      : stream_(std::move(socket)), server_(server), alive_(server.alive_) {}

  ~HttpSession() {
    if (*alive_) server_.forget(where_);
  }

  void start(std::list<std::weak_ptr<HttpSession>>::iterator where) {
    where_ = where;
    read();
  }

  // Closes the connection unless a request is being answered; then it closes after the reply.
  void close_when_idle() {
    closing_ = true;
    if (!busy_) {
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
      stream_.close();
    }
  }

 private:
  std::chrono::steady_clock::duration timeout() const {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(server_.options_.timeout_seconds));
  }

  void read() {
    if (closing_) return close_when_idle();
    parser_.emplace();
    parser_->body_limit(server_.options_.max_body_bytes);
    parser_->header_limit(16 * 1024);
    stream_.expires_after(timeout());
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset || ec == asio::error::eof || ec == asio::error::bad_descriptor)
      return close_when_idle();
    if (ec == http::error::body_limit) {
      return refuse(
          http::status::payload_too_large,
          fmt::format("the request body is larger than the limit of {} bytes", server_.options_.max_body_bytes));
    }
    if (ec == http::error::header_limit)
      return refuse(http::status::request_header_fields_too_large, "request headers are too large");
    if (ec) return refuse(http::status::bad_request, fmt::format("malformed HTTP request: {}", ec.message()));

    busy_ = true;
    HttpRequest request = parser_->release();
    keep_alive_ = request.keep_alive();
    version_ = request.version();
    stream_.expires_never();  // the handler may wait on a commit; the write has its own timeout
    auto replied = std::make_shared<bool>(false);
    server_.handler_(std::move(request), [self = shared_from_this(), replied](HttpResponse response) {
      if (*replied) return;
      *replied = true;
      self->write(std::move(response), !self->keep_alive_);
    });
  }

  void refuse(http::status status, const std::string& detail) {
    if (server_.on_refusal_) server_.on_refusal_(static_cast<unsigned>(status));
    HttpResponse response{status, 11};
    response.set(http::field::content_type, "application/problem+json");
    response.body() = fmt::format(R"({{"type":"about:blank","title":"{}","status":{},"detail":"{}"}})",
                                  std::string(http::obsolete_reason(status)), static_cast<unsigned>(status), detail);
    busy_ = true;
    write(std::move(response), true);
  }

  void write(HttpResponse response, bool close) {
    close = close || closing_;
    response.version(version_ ? version_ : 11);
    response.keep_alive(!close);
    response.set(http::field::server, "jouled");
    response.prepare_payload();
    response_ = std::make_shared<HttpResponse>(std::move(response));
    stream_.expires_after(timeout());
    http::async_write(stream_, *response_, [self = shared_from_this(), close](beast::error_code ec, std::size_t) {
      self->busy_ = false;
      self->response_.reset();
      if (ec || close) {
        beast::error_code ignored;
        self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
        self->stream_.close();
        return;
      }
      self->read();
    });
  }

  beast::tcp_stream stream_;
  HttpServer& server_;
  std::shared_ptr<bool> alive_;
  std::list<std::weak_ptr<HttpSession>>::iterator where_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<HttpResponse> response_;
  bool keep_alive_ = false;
  unsigned version_ = 11;
  bool busy_ = false;
  bool closing_ = false;
};

HttpServer::HttpServer(asio::io_context& io, HttpHandler handler, HttpServerOptions options, RefusalObserver on_refusal)
    : io_(io), acceptor_(io), handler_(std::move(handler)), options_(options), on_refusal_(std::move(on_refusal)) {}

HttpServer::~HttpServer() {
  *alive_ = false;
  beast::error_code ignored;
  acceptor_.close(ignored);
}

Result<tcp::endpoint> HttpServer::listen(const std::string& host, std::uint16_t port) {
  beast::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (ec) return make_error(ErrorCode::invalid_argument, fmt::format("bad listen address {}: {}", host, ec.message()));
  const tcp::endpoint endpoint{address, port};
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    beast::error_code ignored;
    acceptor_.close(ignored);
    return make_error(ErrorCode::unavailable, fmt::format("cannot listen on {}:{}: {}", host, port, ec.message()));
  }
  const auto bound = acceptor_.local_endpoint(ec);
  accept();
  return bound;
}

void HttpServer::accept() {
  acceptor_.async_accept(io_, [this, alive = alive_](beast::error_code ec, tcp::socket socket) {
    if (!*alive || ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) {
      if (sessions_.size() >= options_.max_connections) {
        // Over the limit: close at once rather than queue; clients retry.
        if (on_refusal_) on_refusal_(503);
        beast::error_code ignored;
        socket.close(ignored);
      } else {
        auto session = std::make_shared<HttpSession>(std::move(socket), *this);
        sessions_.push_front(session);
        session->start(sessions_.begin());
      }
    }
    accept();
  });
}

void HttpServer::forget(std::list<std::weak_ptr<HttpSession>>::iterator where) { sessions_.erase(where); }

void HttpServer::stop() {
  beast::error_code ignored;
  acceptor_.close(ignored);
  for (auto& weak : sessions_) {
    if (auto session = weak.lock()) session->close_when_idle();
  }
}

}  // namespace joule::daemon
