#include "joule/client/http_client.hpp"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#include "joule/common/openssl_error.hpp"

namespace joule::client {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;

Result<ServerUrl> parse_server_url(const std::string& url) {
  std::string rest = url;
  ServerUrl out;
  if (rest.rfind("http://", 0) == 0) {
    rest = rest.substr(7);
  } else if (rest.rfind("https://", 0) == 0) {
    rest = rest.substr(8);
    out.tls = true;
  } else if (rest.find("://") != std::string::npos) {
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("{}: only http:// and https:// URLs are supported", url));
  }
  if (const auto slash = rest.find('/'); slash != std::string::npos) rest = rest.substr(0, slash);
  if (!rest.empty() && rest.front() == '[') {
    const auto close = rest.find(']');
    if (close == std::string::npos)
      return make_error(ErrorCode::invalid_argument, fmt::format("{}: bad IPv6 address", url));
    out.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size() && rest[close + 1] == ':') out.port = rest.substr(close + 2);
  } else if (const auto colon = rest.rfind(':'); colon != std::string::npos) {
    out.host = rest.substr(0, colon);
    out.port = rest.substr(colon + 1);
  } else if (!rest.empty()) {
    out.host = rest;
  }
  if (out.host.empty() || out.port.empty())
    return make_error(ErrorCode::invalid_argument, fmt::format("{}: expected http(s)://HOST:PORT", url));
  return out;
}

struct HttpClient::TlsSetup {
  ssl::context context{ssl::context::tls_client};
  std::optional<Error> error;  // why the context cannot verify anything; every request reports it
};

namespace {

std::optional<Error> configure(ssl::context& context, const ClientTls& tls) {
  SSL_CTX* native = context.native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  SSL_CTX_set_verify(native, SSL_VERIFY_PEER, nullptr);
  if (tls.ca_file.empty()) {
    if (SSL_CTX_set_default_verify_paths(native) != 1)
      return make_error(ErrorCode::unavailable,
                        fmt::format("cannot load the system's CA certificates: {}", openssl_reason()));
    return std::nullopt;
  }
  // OpenSSL's own message for a missing file is "system lib"; say which file and why.
  if (std::FILE* in = std::fopen(tls.ca_file.c_str(), "rb")) {
    std::fclose(in);
  } else {
    return make_error(ErrorCode::unavailable,
                      fmt::format("cannot read CA file {}: {}", tls.ca_file.string(), std::strerror(errno)));
  }
  if (SSL_CTX_load_verify_locations(native, tls.ca_file.c_str(), nullptr) != 1)
    return make_error(ErrorCode::invalid_argument, fmt::format("CA file {} holds no usable PEM certificate ({})",
                                                               tls.ca_file.string(), openssl_reason()));
  return std::nullopt;
}

// Name the server must prove, and the name it is asked for (SNI; IP addresses send none).
bool expect_host(SSL* ssl, const std::string& host) {
  beast::error_code ec;
  asio::ip::make_address(host, ec);
  if (!ec) return X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host.c_str()) == 1;
  return SSL_set_tlsext_host_name(ssl, host.c_str()) == 1 && SSL_set1_host(ssl, host.c_str()) == 1;
}

// Runs the io_context until the operation started by `start` has completed; the stream's
// deadline cancels it when the timeout passes.
template <class Start>
beast::error_code run(asio::io_context& io, Start start) {
  beast::error_code ec;
  io.restart();
  start([&ec](beast::error_code e, auto&&...) { ec = e; });
  io.run();
  return ec;
}

// Sends `request` and reads the answer. `keep`: leave the connection open for the next request
// (set to false when the server said it closes); otherwise it is shut down here.
template <class Stream>
Result<HttpReply> exchange(asio::io_context& io, Stream& stream, http::request<http::string_body>& request,
                           bool* keep = nullptr) {
  if (auto ec = run(io, [&](auto done) { http::async_write(stream, request, done); }))
    return make_error(ErrorCode::io, fmt::format("sending the request failed: {}", ec.message()));
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(1ULL << 30);
  if (auto ec = run(io, [&](auto done) { http::async_read(stream, buffer, parser, done); }))
    return make_error(ErrorCode::io, fmt::format("reading the response failed: {}", ec.message()));
  auto response = parser.release();
  if (keep) *keep = *keep && response.keep_alive();
  HttpReply reply;
  reply.status = response.result_int();
  reply.body = std::move(response.body());
  for (const auto& field : response) {
    std::string name(field.name_string());
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    reply.headers[name] = std::string(field.value());
  }
  if (keep && *keep) return reply;
  // Without close_notify: the response was framed by its length, and the server takes a
  // truncated TLS stream after a complete request for a client that left.
  beast::error_code ignored;
  beast::get_lowest_layer(stream).socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  return reply;
}

http::request<http::string_body> make_request(const ServerUrl& server, const std::string& token,
                                              const std::string& token_header, const std::string& method,
                                              const std::string& target, const std::string& body,
                                              const std::string& content_type) {
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, server.host);
  req.set(http::field::user_agent, "joulectl");
  if (!token.empty() && token_header.empty()) req.set(http::field::authorization, "Bearer " + token);
  if (!token.empty() && !token_header.empty()) req.set(token_header, token);
  if (!body.empty() || method == "POST") {
    req.set(http::field::content_type, content_type);
    req.body() = body;
  }
  req.prepare_payload();
  return req;
}

Status connect_tcp(asio::io_context& io, beast::tcp_stream& tcp, const ServerUrl& server,
                   std::chrono::milliseconds timeout) {
  beast::error_code ec;
  asio::ip::tcp::resolver resolver(io);
  const auto endpoints = resolver.resolve(server.host, server.port, ec);
  if (ec) return make_error(ErrorCode::unavailable, fmt::format("cannot resolve {}: {}", server.host, ec.message()));
  tcp.expires_after(timeout);  // one deadline for the whole exchange
  if (auto failed = run(io, [&](auto done) { tcp.async_connect(endpoints, done); })) {
    return make_error(ErrorCode::unavailable,
                      fmt::format("cannot connect to jouled at {}:{}: {} (is it running? see --server or JOULE_SERVER)",
                                  server.host, server.port, failed.message()));
  }
  beast::error_code ignored;
  tcp.socket().set_option(asio::ip::tcp::no_delay(true), ignored);  // see HttpServer's accept
  return {};
}

Status connect_tls(asio::io_context& io, beast::ssl_stream<beast::tcp_stream>& stream, const ServerUrl& server,
                   std::chrono::milliseconds timeout) {
  if (!expect_host(stream.native_handle(), server.host))
    return make_error(ErrorCode::invalid_argument, fmt::format("cannot verify TLS host name {}", server.host));
  if (auto connected = connect_tcp(io, beast::get_lowest_layer(stream), server, timeout); !connected)
    return connected.error();
  if (auto failed = run(io, [&](auto done) { stream.async_handshake(ssl::stream_base::client, done); })) {
    const long verified = SSL_get_verify_result(stream.native_handle());
    ERR_clear_error();
    if (verified != X509_V_OK) {
      return make_error(ErrorCode::unauthorized,
                        fmt::format("TLS handshake with {}:{} failed: certificate verify failed ({})", server.host,
                                    server.port, X509_verify_cert_error_string(verified)));
    }
    return make_error(ErrorCode::unavailable, fmt::format("TLS handshake with {}:{} failed: {} (does it serve https?)",
                                                          server.host, server.port, failed.message()));
  }
  return {};
}

}  // namespace

HttpClient::HttpClient(ServerUrl server, std::string token, std::chrono::milliseconds timeout, ClientTls tls)
    : server_(std::move(server)), token_(std::move(token)), timeout_(timeout) {
  if (!server_.tls) return;
  auto setup = std::make_shared<TlsSetup>();
  setup->error = configure(setup->context, tls);
  tls_ = std::move(setup);
}

Result<HttpReply> HttpClient::request(const std::string& method, const std::string& target, const std::string& body,
                                      const std::string& content_type) const {
  if (tls_ && tls_->error) return *tls_->error;
  asio::io_context io;
  auto req = make_request(server_, token_, token_header_, method, target, body, content_type);
  if (!tls_) {
    beast::tcp_stream stream(io);
    if (auto connected = connect_tcp(io, stream, server_, timeout_); !connected) return connected.error();
    return exchange(io, stream, req);
  }
  beast::ssl_stream<beast::tcp_stream> stream(io, tls_->context);
  if (auto connected = connect_tls(io, stream, server_, timeout_); !connected) return connected.error();
  return exchange(io, stream, req);
}

struct HttpConnection::State {
  asio::io_context io;
  std::optional<beast::tcp_stream> plain;
  std::optional<beast::ssl_stream<beast::tcp_stream>> secure;
  std::size_t opened = 0;
  bool served = false;  // the open connection answered a request already

  bool open() const { return plain.has_value() || secure.has_value(); }
  void drop() {
    plain.reset();
    secure.reset();
    served = false;
  }
};

HttpConnection::HttpConnection(HttpClient client) : client_(std::move(client)), state_(std::make_unique<State>()) {}

HttpConnection::~HttpConnection() = default;

std::size_t HttpConnection::connections_opened() const { return state_->opened; }

Result<HttpReply> HttpConnection::request(const std::string& method, const std::string& target, const std::string& body,
                                          std::chrono::milliseconds timeout) {
  if (client_.tls_ && client_.tls_->error) return *client_.tls_->error;
  if (timeout.count() <= 0) timeout = client_.timeout_;
  State& state = *state_;
  auto req =
      make_request(client_.server_, client_.token_, client_.token_header_, method, target, body, "application/json");
  // A connection that served before may have been closed by the server while idle: a quick
  // failure on it is tried once more on a fresh one. A fresh one's failure is the answer.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool reused = state.open();
    if (!reused) {
      if (client_.tls_) {
        state.secure.emplace(state.io, client_.tls_->context);
        if (auto connected = connect_tls(state.io, *state.secure, client_.server_, timeout); !connected) {
          state.drop();
          return connected.error();
        }
      } else {
        state.plain.emplace(state.io);
        if (auto connected = connect_tcp(state.io, *state.plain, client_.server_, timeout); !connected) {
          state.drop();
          return connected.error();
        }
      }
      ++state.opened;
    }
    bool keep = true;
    const auto sent = std::chrono::steady_clock::now();
    Result<HttpReply> reply = make_error(ErrorCode::io, "no connection");
    if (state.plain) {
      state.plain->expires_after(timeout);
      reply = exchange(state.io, *state.plain, req, &keep);
    } else {
      beast::get_lowest_layer(*state.secure).expires_after(timeout);
      reply = exchange(state.io, *state.secure, req, &keep);
    }
    if (reply && keep) {
      state.served = true;
      return reply;
    }
    // A connection the server closed fails at once (end of stream, reset); one that timed out
    // is not tried again, or the caller would wait twice its timeout.
    const bool retry = !reply && reused && state.served && std::chrono::steady_clock::now() - sent < timeout / 2;
    state.drop();
    if (reply || !retry) return reply;
  }
  return make_error(ErrorCode::io, "the connection broke off twice");
}

}  // namespace joule::client
