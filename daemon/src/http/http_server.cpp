#include "joule/daemon/http_server.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/rfc7230.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#include "joule/adapters/peer_credentials.hpp"
#include "joule/common/openssl_error.hpp"
#include "joule/common/text.hpp"

namespace joule::daemon {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

namespace {

Result<std::string> read_file(const std::filesystem::path& file, std::string_view what) {
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec))
    return make_error(ErrorCode::invalid_argument, fmt::format("{} {} is a directory", what, file.string()));
  std::FILE* in = std::fopen(file.c_str(), "rb");
  if (!in) {
    const int error = errno;
    return make_error(error == EACCES ? ErrorCode::permission_denied : ErrorCode::unavailable,
                      fmt::format("cannot read {} {}: {}", what, file.string(), std::strerror(error)));
  }
  std::string text;
  char chunk[4096];
  for (std::size_t n; (n = std::fread(chunk, 1, sizeof chunk, in)) > 0;) text.append(chunk, n);
  const bool failed = std::ferror(in) != 0;
  std::fclose(in);
  if (failed) return make_error(ErrorCode::io, fmt::format("cannot read {} {}", what, file.string()));
  return text;
}

struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
BioPtr memory_bio(const std::string& text) {
  return BioPtr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// A key behind a passphrase cannot be loaded by a daemon; without this OpenSSL would prompt on a terminal.
int no_passphrase(char*, int, int, void*) { return -1; }

Status use_certificate_chain(SSL_CTX* context, const std::filesystem::path& file) {
  auto text = read_file(file, "TLS certificate chain");
  if (!text) return text.error();
  const BioPtr bio = memory_bio(*text);
  X509* leaf = PEM_read_bio_X509_AUX(bio.get(), nullptr, no_passphrase, nullptr);
  if (!leaf) {
    return make_error(ErrorCode::invalid_argument, fmt::format("TLS certificate chain {} holds no PEM certificate ({})",
                                                               file.string(), openssl_reason()));
  }
  const int used = SSL_CTX_use_certificate(context, leaf);
  X509_free(leaf);
  if (used != 1) {
    return make_error(
        ErrorCode::invalid_argument,
        fmt::format("TLS certificate chain {}: the certificate is refused ({})", file.string(), openssl_reason()));
  }
  SSL_CTX_clear_chain_certs(context);
  for (int n = 2;; ++n) {
    X509* next = PEM_read_bio_X509(bio.get(), nullptr, no_passphrase, nullptr);
    if (!next) {
      const unsigned long last = ERR_peek_last_error();
      if (ERR_GET_LIB(last) == ERR_LIB_PEM && ERR_GET_REASON(last) == PEM_R_NO_START_LINE) {
        ERR_clear_error();  // the end of the file
        break;
      }
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("TLS certificate chain {}: certificate {} is unreadable ({})", file.string(), n,
                                    openssl_reason()));
    }
    if (SSL_CTX_add0_chain_cert(context, next) != 1) {
      X509_free(next);
      return make_error(
          ErrorCode::invalid_argument,
          fmt::format("TLS certificate chain {}: certificate {} is refused ({})", file.string(), n, openssl_reason()));
    }
  }
  return {};
}

Status use_private_key(SSL_CTX* context, const TlsFiles& files) {
  auto text = read_file(files.private_key, "TLS private key");
  if (!text) return text.error();
  if (text->find("ENCRYPTED") != std::string::npos) {
    OPENSSL_cleanse(text->data(), text->size());
    return make_error(
        ErrorCode::invalid_argument,
        fmt::format("TLS private key {} is encrypted; jouled needs it unencrypted (readable by jouled only)",
                    files.private_key.string()));
  }
  EVP_PKEY* key = nullptr;
  {
    const BioPtr bio = memory_bio(*text);
    key = PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr);
  }
  OPENSSL_cleanse(text->data(), text->size());
  if (!key) {
    return make_error(ErrorCode::invalid_argument, fmt::format("TLS private key {} holds no PEM private key ({})",
                                                               files.private_key.string(), openssl_reason()));
  }
  Status status;
  if (X509_check_private_key(SSL_CTX_get0_certificate(context), key) != 1) {
    ERR_clear_error();
    status = make_error(ErrorCode::invalid_argument,
                        fmt::format("TLS private key {} does not match the certificate in {}",
                                    files.private_key.string(), files.certificate_chain.string()));
  } else if (SSL_CTX_use_PrivateKey(context, key) != 1 || SSL_CTX_check_private_key(context) != 1) {
    status = make_error(ErrorCode::invalid_argument, fmt::format("TLS private key {} is refused ({})",
                                                                 files.private_key.string(), openssl_reason()));
  }
  EVP_PKEY_free(key);
  return status;
}

}  // namespace

Result<std::shared_ptr<ssl::context>> make_server_tls_context(const TlsFiles& files) {
  ERR_clear_error();
  std::shared_ptr<ssl::context> context;
  try {
    context = std::make_shared<ssl::context>(ssl::context::tls_server);
  } catch (const boost::system::system_error& error) {
    return make_error(ErrorCode::internal, fmt::format("cannot create a TLS context: {}", error.what()));
  }
  SSL_CTX* native = context->native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  SSL_CTX_set_options(native, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  // TLS 1.2: forward-secret AEAD suites only; TLS 1.3's suites are all of that kind already.
  if (SSL_CTX_set_cipher_list(native, "ECDHE+AESGCM:ECDHE+CHACHA20") != 1)
    return make_error(ErrorCode::internal, fmt::format("cannot set the TLS 1.2 ciphers: {}", openssl_reason()));
  if (auto status = use_certificate_chain(native, files.certificate_chain); !status) return status.error();
  if (auto status = use_private_key(native, files); !status) return status.error();
  return context;
}

/// What the server keeps of a connection; the HTTP logic is BasicHttpSession's, one per stream type.
class HttpSession {
 public:
  using Where = std::list<std::weak_ptr<HttpSession>>::iterator;
  explicit HttpSession(HttpServer& server) : server_(server), alive_(server.alive_) {}
  virtual ~HttpSession() {
    if (!*alive_) return;
    hold(false);
    server_.forget(where_, client_);
  }
  HttpSession(const HttpSession&) = delete;
  HttpSession& operator=(const HttpSession&) = delete;

  virtual void start(Where where) = 0;
  /// Closes the connection unless a request is being answered; then it closes after the reply.
  virtual void close_when_idle() = 0;
  /// Closes the connection now if it is waiting for a request (to make room for another).
  virtual bool give_way() = 0;

  /// Since when the connection waits for a request to arrive whole; nothing while one is handled.
  std::optional<std::chrono::steady_clock::time_point> waiting_since() const { return waiting_since_; }
  const asio::ip::address& client() const { return client_; }
  /// Whether it holds a long poll now (counted apart from max_connections).
  bool held() const { return held_; }

 protected:
  void hold(bool on) {
    if (held_ == on) return;
    held_ = on;
    // A held long poll counts against neither cap: nor against its client's connections.
    if (on) {
      ++server_.held_;
      --server_.open_by_client_[client_];
    } else {
      --server_.held_;
      ++server_.open_by_client_[client_];
    }
  }
  bool is_long_poll(const HttpRequest& request) const { return options().long_poll && options().long_poll(request); }
  const HttpServerOptions& options() const { return server_.options_; }
  void handle(HttpRequest&& request, Reply reply) { server_.handler_(std::move(request), peer_, std::move(reply)); }
  void refused(unsigned status) {
    if (server_.on_refusal_) server_.on_refusal_(status);
  }

  Where where_;
  std::optional<std::chrono::steady_clock::time_point> waiting_since_;
  asio::ip::address client_;
  HttpPeer peer_;

 private:
  HttpServer& server_;
  std::shared_ptr<bool> alive_;
  bool held_ = false;
};

namespace {

using PlainStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

template <class Stream>
class BasicHttpSession final : public HttpSession, public std::enable_shared_from_this<BasicHttpSession<Stream>> {
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;

 public:
  BasicHttpSession(tcp::socket socket, std::shared_ptr<ssl::context> tls, HttpServer& server)
      : HttpSession(server), tls_(std::move(tls)), stream_(make_stream(std::move(socket), tls_.get())) {
    beast::error_code ignored;
    peer_.local = lowest().socket().local_endpoint(ignored);
    peer_.remote = lowest().socket().remote_endpoint(ignored);
    client_ = peer_.remote.address();
    // Asked once per connection, while the client's socket surely exists.
    peer_.uid = adapters::loopback_peer_uid(peer_.local, peer_.remote);
    waiting_since_ = std::chrono::steady_clock::now();
  }

  void start(Where where) override {
    where_ = where;
    if constexpr (kTls) {
      lowest().expires_after(timeout());
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) { self->on_handshake(ec); });
    } else {
      read();
    }
  }

  void close_when_idle() override {
    closing_ = true;
    // An idle TLS connection is closed without close_notify: a read is pending on the stream.
    if (!busy_) close_socket(tcp::socket::shutdown_both);
  }

  bool give_way() override {
    if (busy_ || !waiting_since_) return false;
    waiting_since_.reset();
    close_when_idle();
    return true;
  }

 private:
  static Stream make_stream(tcp::socket socket, ssl::context* tls) {
    if constexpr (kTls)
      return Stream(std::move(socket), *tls);
    else
      return Stream(std::move(socket));
  }

  beast::tcp_stream& lowest() { return beast::get_lowest_layer(stream_); }

  std::chrono::steady_clock::duration timeout() const {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(options().timeout_seconds));
  }

  void close_socket(tcp::socket::shutdown_type how) {
    beast::error_code ignored;
    lowest().socket().shutdown(how, ignored);
    lowest().close();
  }

  void on_handshake(beast::error_code ec) {
    if (ec) {
      // Refused on TLS grounds: plain HTTP on a TLS port, a client that rejected the certificate,
      // no common protocol version. A timeout or a client that left counts no more than it
      // does before a plain request.
      if (ec.category() == asio::error::get_ssl_category()) refused(400);
      return close_socket(tcp::socket::shutdown_both);
    }
    read();
  }

  std::chrono::steady_clock::duration idle_timeout() const {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(std::min(options().idle_timeout_seconds, options().timeout_seconds)));
  }

  // Waits, for at most the idle timeout, for the first bytes of the next request; then the
  // request itself has the request timeout. An idle or silent connection so goes quickly, and
  // one that only trickles (slowloris) still ends at the request timeout.
  void read() {
    if (closing_) return close_when_idle();
    waiting_since_ = std::chrono::steady_clock::now();
    if (buffer_.size() > 0) return read_request();  // pipelined: the next request is already here
    lowest().expires_after(idle_timeout());
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = this->shared_from_this()](beast::error_code ec, std::size_t bytes) {
                              self->buffer_.commit(bytes);
                              if (ec) return self->on_read(ec);
                              self->read_request();
                            });
  }

  void read_request() {
    if (closing_) return close_when_idle();
    // RFC 9112 2.2: empty lines before a request line are ignored (some clients send a CRLF after
    // a POST body). Only a few, so a stream of them cannot keep a connection from timing out.
    while (buffer_.size() > 0 && blank_bytes_skipped_ < kMaxBlankBytes) {
      const char first = *static_cast<const char*>(buffer_.data().data());
      if (first != '\r' && first != '\n') break;
      buffer_.consume(1);
      ++blank_bytes_skipped_;
    }
    if (buffer_.size() == 0) return read();
    blank_bytes_skipped_ = 0;
    parser_.emplace();
    parser_->body_limit(options().max_body_bytes);
    parser_->header_limit(16 * 1024);
    lowest().expires_after(timeout());
    http::async_read(stream_, buffer_, *parser_,
                     [self = this->shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    waiting_since_.reset();
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset || ec == asio::error::eof || ec == asio::error::bad_descriptor ||
        ec == ssl::error::stream_truncated)  // a TLS client that closed without close_notify
      return close_when_idle();
    if (ec == http::error::body_limit) {
      return refuse(http::status::payload_too_large,
                    fmt::format("the request body is larger than the limit of {} bytes", options().max_body_bytes));
    }
    if (ec == http::error::header_limit)
      return refuse(http::status::request_header_fields_too_large, "request headers are too large");
    if (ec) return refuse(http::status::bad_request, fmt::format("malformed HTTP request: {}", ec.message()));

    HttpRequest request = parser_->release();
    version_ = request.version();
    if (auto framing = framing_problem(request)) return refuse(framing->first, framing->second);
    busy_ = true;
    keep_alive_ = request.keep_alive();
    head_ = request.method() == http::verb::head;
    lowest().expires_never();  // the handler may wait on a commit; the write has its own timeout
    hold(is_long_poll(request));
    auto replied = std::make_shared<bool>(false);
    try {
      handle(std::move(request), [self = this->shared_from_this(), replied](HttpResponse response) {
        if (*replied) return;
        *replied = true;
        self->hold(false);
        self->write(std::move(response), !self->keep_alive_);
      });
    } catch (const std::exception&) {
      // The handler is meant to answer every error itself; an exception escaping it must still
      // not cross this Asio handler (it would end io_context::run and the daemon).
      if (*replied) return;
      *replied = true;
      hold(false);
      refuse(http::status::internal_server_error, "the request could not be handled");
    }
  }

  void refuse(http::status status, const std::string& detail) {
    refused(static_cast<unsigned>(status));
    HttpResponse response{status, 11};
    response.set(http::field::content_type, "application/problem+json");
    // The detail may quote what the client sent: escaped for a JSON string.
    std::string escaped;
    for (const char c : printable(detail, 200)) {
      if (c == '"' || c == '\\') escaped += '\\';
      escaped += c;
    }
    response.body() = fmt::format(R"({{"type":"about:blank","title":"{}","status":{},"detail":"{}"}})",
                                  std::string(http::obsolete_reason(status)), static_cast<unsigned>(status), escaped);
    busy_ = true;
    write(std::move(response), true);
  }

  void write(HttpResponse response, bool close) {
    close = close || closing_;
    response.version(version_ ? version_ : 11);
    response.keep_alive(!close);
    response.set(http::field::server, "jouled");
    response.prepare_payload();
    if (head_) {
      // HEAD: the GET answer's headers, Content-Length included, and no body (RFC 9110 9.3.2);
      // a body here would be read by a pipelining client as the start of its next answer.
      const auto length = response.body().size();
      response.body().clear();
      response.content_length(length);
      head_ = false;
    }
    response_ = std::make_shared<HttpResponse>(std::move(response));
    lowest().expires_after(timeout());
    http::async_write(stream_, *response_, [self = this->shared_from_this(), close](beast::error_code ec, std::size_t) {
      self->busy_ = false;
      self->response_.reset();
      if (ec) return self->close_socket(tcp::socket::shutdown_both);
      if (close) return self->finish();
      self->read();
    });
  }

  // After a response that ends the connection: TLS sends close_notify before the socket closes,
  // without waiting for the client's (TLS allows that; a client that keeps its end open must
  // not hold the connection, nor a drain at stop). Marking the client's close_notify as received
  // makes OpenSSL's shutdown complete once ours is written.
  void finish() {
    if constexpr (kTls) {
      SSL_set_shutdown(stream_.native_handle(), SSL_RECEIVED_SHUTDOWN);
      lowest().expires_after(timeout());
      stream_.async_shutdown(
          [self = this->shared_from_this()](beast::error_code) { self->close_socket(tcp::socket::shutdown_send); });
    } else {
      close_socket(tcp::socket::shutdown_send);
    }
  }

  // What RFC 9112 asks a server to refuse that Beast's parser lets through: a Host field missing
  // from HTTP/1.1 or given twice (3.2), a transfer coding other than chunked, which Beast would
  // leave undecoded in the body (6.1: 501), and Transfer-Encoding on HTTP/1.0, whose framing a
  // 1.0 intermediary may have read differently (6.1).
  static std::optional<std::pair<http::status, std::string>> framing_problem(const HttpRequest& request) {
    const auto hosts = request.count(http::field::host);
    if (hosts > 1) return std::pair{http::status::bad_request, std::string("more than one Host header")};
    if (hosts == 0 && request.version() >= 11)
      return std::pair{http::status::bad_request, std::string("an HTTP/1.1 request needs a Host header")};
    if (request.count(http::field::transfer_encoding) == 0) return std::nullopt;
    if (request.version() < 11)
      return std::pair{http::status::bad_request, std::string("Transfer-Encoding is not allowed in HTTP/1.0")};
    const auto [first, last] = request.equal_range(http::field::transfer_encoding);
    for (auto field = first; field != last; ++field) {
      for (const auto& coding : http::token_list{field->value()}) {
        if (!beast::iequals(coding, "chunked"))
          return std::pair{http::status::not_implemented,
                           fmt::format("transfer coding {} is not supported; only chunked is",
                                       printable(std::string_view(coding.data(), coding.size()), 40))};
      }
    }
    return std::nullopt;
  }

  static constexpr int kMaxBlankBytes = 8;
  int blank_bytes_skipped_ = 0;
  std::shared_ptr<ssl::context> tls_;  // null for plain HTTP; kept while the stream uses it
  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<HttpResponse> response_;
  bool keep_alive_ = false;
  bool head_ = false;
  unsigned version_ = 11;
  bool busy_ = false;
  bool closing_ = false;
};

}  // namespace

HttpServer::HttpServer(asio::io_context& io, HttpHandler handler, HttpServerOptions options, RefusalObserver on_refusal)
    : io_(io),
      acceptor_(io),
      handler_(std::move(handler)),
      options_(std::move(options)),
      on_refusal_(std::move(on_refusal)) {}

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

namespace {

// Sent without waiting to a connection over the limits, before it is closed: a few hundred
// bytes always fit the new socket's send buffer, so the non-blocking write never blocks the loop.
void answer_busy(tcp::socket& socket) {
  static const std::string kBody =
      R"({"type":"urn:joule:problem:unavailable","title":"Service Unavailable","status":503,)"
      R"("detail":"jouled has as many connections as it serves; retry in a second"})"
      "\n";
  static const std::string kBusy = fmt::format(
      "HTTP/1.1 503 Service Unavailable\r\nServer: jouled\r\nContent-Type: application/problem+json\r\n"
      "Retry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{}",
      kBody.size(), kBody);
  beast::error_code ignored;
  socket.non_blocking(true, ignored);
  socket.write_some(asio::buffer(kBusy), ignored);
  socket.shutdown(tcp::socket::shutdown_send, ignored);
}

}  // namespace

bool HttpServer::admit(const asio::ip::address& client) {
  // Under a cap, the connection that has waited longest for a request gives way: idle
  // keep-alive clients and slow senders make room for new ones, requests being answered
  // (long polls included) are never cut.
  auto make_room = [&](bool same_client_only) {
    std::shared_ptr<HttpSession> oldest;
    for (auto& weak : sessions_) {
      auto session = weak.lock();
      if (!session || !session->waiting_since() || (same_client_only && session->client() != client)) continue;
      if (!oldest || *session->waiting_since() < *oldest->waiting_since()) oldest = session;
    }
    return oldest && oldest->give_way();
  };
  // Held long polls count against their own cap, not these (HttpServerOptions::long_poll). The
  // count per client is kept as sessions open, close and hold: counting them here walked every
  // connection per accept (a tenth of a coordinator's CPU at 10,000 agents).
  const auto open = open_by_client_.find(client);
  const std::size_t from_client = open == open_by_client_.end() ? 0 : open->second;
  if (from_client >= options_.max_connections_per_client && !make_room(true)) return false;
  if (sessions_.size() - held_ >= options_.max_connections && !make_room(false)) return false;
  return sessions_.size() < options_.max_connections + options_.max_long_polls;
}

void HttpServer::accept_later() {
  // Out of descriptors (EMFILE/ENFILE) or memory: accepting again at once would spin the
  // loop at 100 % CPU while the pending connection stays in the backlog; wait a little.
  if (!accept_retry_) accept_retry_ = std::make_unique<asio::steady_timer>(io_);
  accept_retry_->expires_after(std::chrono::milliseconds(100));
  accept_retry_->async_wait([this, alive = alive_](beast::error_code ec) {
    if (*alive && !ec && acceptor_.is_open()) accept();
  });
}

void HttpServer::accept() {
  acceptor_.async_accept(io_, [this, alive = alive_](beast::error_code ec, tcp::socket socket) {
    if (!*alive || ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      if (on_refusal_) on_refusal_(503);
      return accept_later();
    }
    {
      beast::error_code ignored;
      const auto client = socket.remote_endpoint(ignored).address();
      if (!admit(client)) {
        if (on_refusal_) on_refusal_(503);
        // A TLS client cannot read a plain answer: it is only closed.
        if (!options_.tls) answer_busy(socket);
        socket.close(ignored);
      } else {
        // Answers go out whole at once; without this, Nagle and delayed ACKs held small TLS
        // records back ~40 ms (measured in bench/README.md, "Cluster").
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        std::shared_ptr<HttpSession> session;
        if (options_.tls)
          session = std::make_shared<BasicHttpSession<TlsStream>>(std::move(socket), options_.tls, *this);
        else
          session = std::make_shared<BasicHttpSession<PlainStream>>(std::move(socket), nullptr, *this);
        sessions_.push_front(session);
        ++open_by_client_[client];
        session->start(sessions_.begin());
      }
    }
    accept();
  });
}

void HttpServer::forget(std::list<std::weak_ptr<HttpSession>>::iterator where, const asio::ip::address& client) {
  sessions_.erase(where);
  if (const auto open = open_by_client_.find(client); open != open_by_client_.end() && --open->second == 0)
    open_by_client_.erase(open);
}

void HttpServer::stop() {
  beast::error_code ignored;
  acceptor_.close(ignored);
  for (auto& weak : sessions_) {
    if (auto session = weak.lock()) session->close_when_idle();
  }
}

}  // namespace joule::daemon
