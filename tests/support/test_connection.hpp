#pragma once
// One client connection to a test server on 127.0.0.1, plain or TLS (verifying the server's
// certificate for 127.0.0.1 against a given context), for tests that need keep-alive or to
// watch a connection close. Every call gives up after five seconds.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

namespace joule::testing {

/// A TLS client context that trusts `ca_file` only (TLS 1.2+).
inline boost::asio::ssl::context client_tls_context(const std::string& ca_file) {
  boost::asio::ssl::context context(boost::asio::ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(context.native_handle(), TLS1_2_VERSION);
  context.load_verify_file(ca_file);
  context.set_verify_mode(boost::asio::ssl::verify_peer);
  return context;
}

class TestConnection {
 public:
  using Response = boost::beast::http::response<boost::beast::http::string_body>;

  /// Connects (and for TLS shakes hands); `error()` says whether that worked.
  TestConnection(std::uint16_t port, boost::asio::ssl::context* tls, bool handshake = true) {
    const boost::asio::ip::tcp::endpoint server(boost::asio::ip::make_address("127.0.0.1"), port);
    if (tls) {
      tls_.emplace(io_, *tls);
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(tls_->native_handle()), "127.0.0.1");
    } else {
      plain_.emplace(io_);
    }
    error_ = run([&](auto done) { lowest().async_connect(server, done); });
    if (!error_ && tls && handshake)
      error_ = run([&](auto done) { tls_->async_handshake(boost::asio::ssl::stream_base::client, done); });
  }

  boost::beast::error_code error() const { return error_; }

  /// Sends one request and reads its response; `error()` tells why there is none.
  /// GET, or POST with a body, unless `method` says otherwise.
  std::optional<Response> request(const std::string& target, const std::string& body = {}, bool close = false,
                                  std::optional<boost::beast::http::verb> method = std::nullopt) {
    namespace http = boost::beast::http;
    http::request<http::string_body> request{method.value_or(body.empty() ? http::verb::get : http::verb::post), target,
                                             11};
    request.set(http::field::host, "127.0.0.1");
    request.body() = body;
    request.keep_alive(!close);
    request.prepare_payload();
    error_ = run([&](auto done) { with_stream([&](auto& stream) { http::async_write(stream, request, done); }); });
    if (error_) return std::nullopt;
    return read(request.method() == http::verb::head);
  }

  /// Reads one response (or the connection's end: `error()`); after a HEAD, headers only.
  std::optional<Response> read(bool head = false) {
    namespace http = boost::beast::http;
    http::response_parser<http::string_body> parser;
    parser.skip(head);
    error_ =
        run([&](auto done) { with_stream([&](auto& stream) { http::async_read(stream, buffer_, parser, done); }); });
    if (error_) return std::nullopt;
    return parser.release();
  }

 private:
  boost::beast::tcp_stream& lowest() { return tls_ ? boost::beast::get_lowest_layer(*tls_) : *plain_; }

  template <class Action>
  void with_stream(Action action) {
    if (tls_)
      action(*tls_);
    else
      action(*plain_);
  }

  template <class Start>
  boost::beast::error_code run(Start start) {
    boost::beast::error_code ec;
    lowest().expires_after(std::chrono::seconds(5));
    io_.restart();
    start([&ec](boost::beast::error_code e, auto&&...) { ec = e; });
    io_.run();
    return ec;
  }

  boost::asio::io_context io_;
  std::optional<boost::beast::tcp_stream> plain_;
  std::optional<boost::beast::ssl_stream<boost::beast::tcp_stream>> tls_;
  boost::beast::flat_buffer buffer_;
  boost::beast::error_code error_;
};

}  // namespace joule::testing
