#pragma once
// The HTTP/1.1 server of jouled (Boost.Beast over Asio): sessions with timeouts, a body limit,
// a connection limit and keep-alive, over plain TCP or TLS. It knows nothing of routes: every
// request goes to one handler that answers through a callback, possibly later (after a commit),
// on the same io_context.

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "joule/common/result.hpp"

// Callers that only pass a context around do not need OpenSSL's headers.
namespace boost::asio::ssl {
class context;
}  // namespace boost::asio::ssl

namespace joule::daemon {

using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;
using HttpResponse = boost::beast::http::response<boost::beast::http::string_body>;
/// Sends the response; call exactly once. Safe to call after the client went away.
using Reply = std::function<void(HttpResponse)>;
/// The connection a request came on.
struct HttpPeer {
  boost::asio::ip::tcp::endpoint local;
  boost::asio::ip::tcp::endpoint remote;
  /// The local user of a loopback client, as the kernel names the owner of its socket
  /// (adapters/peer_credentials.hpp); nothing for remote clients or when it could not be told.
  std::optional<uid_t> uid;
};
using HttpHandler = std::function<void(HttpRequest&&, const HttpPeer&, Reply)>;
/// Called for requests refused before reaching the handler (413, 400, 503), for metrics.
/// A TLS handshake refused on protocol grounds (a plain-HTTP client on a TLS port, a client
/// that rejected the certificate, no common TLS version) counts as 400.
using RefusalObserver = std::function<void(unsigned status)>;

/// The PEM files of a TLS server identity.
struct TlsFiles {
  std::filesystem::path certificate_chain;  ///< the server certificate first, then intermediates
  std::filesystem::path private_key;        ///< unencrypted (there is nobody to type a passphrase)
};

/// A TLS server context for HttpServer: TLS 1.2 and 1.3 only, renegotiation and compression
/// off, TLS 1.2 limited to ECDHE with AES-GCM or ChaCha20-Poly1305 (TLS 1.3: OpenSSL's suites),
/// at the system's OpenSSL security level. Reads both files now; fails with a message
/// naming the file when one is missing or unreadable, holds no PEM certificate or key, is an
/// encrypted key, or when the key does not match the certificate. Call it again (on SIGHUP) to
/// pick up renewed files and hand the result to HttpServer::set_tls.
Result<std::shared_ptr<boost::asio::ssl::context>> make_server_tls_context(const TlsFiles& files);

struct HttpServerOptions {
  std::size_t max_body_bytes = 1 << 20;
  /// A request must arrive, and a response leave, within this; so must a TLS handshake, and
  /// the close_notify sent after a response that closes the connection.
  double timeout_seconds = 30.0;
  /// At this many connections, the one that has waited longest for a request (idle keep-alive,
  /// or a request still arriving) is closed to make room; when every connection is busy with a
  /// request, a newcomer gets 503 with Retry-After (a plain-HTTP answer; TLS ones are closed).
  std::size_t max_connections = 512;
  /// The same rule per client address, so that one client cannot hold every connection.
  std::size_t max_connections_per_client = 256;
  /// A kept-alive or new connection must start a request within this, or it is closed.
  double idle_timeout_seconds = 10.0;
  /// From make_server_tls_context: every connection starts with a TLS handshake. Null: plain HTTP.
  std::shared_ptr<boost::asio::ssl::context> tls = nullptr;
  /// Requests held open on purpose (a coordinator's agent syncs): while one is held, its
  /// connection counts against `max_long_polls` instead of `max_connections` and the per-client
  /// cap, so agents' polls neither crowd out other clients nor cap the agents at
  /// `max_connections`. Unset: none.
  std::function<bool(const HttpRequest&)> long_poll;
  std::size_t max_long_polls = 16384;
};

class HttpSession;

/// Not thread-safe: construct, call and destroy it on the io_context's thread (or before it runs).
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
  /// Of those, the ones holding a long poll (HttpServerOptions::long_poll).
  std::size_t long_polls() const { return held_; }

  /// Connections accepted from now on use this context (a renewed certificate); open ones keep
  /// the one they started with. Null switches new connections to plain HTTP.
  void set_tls(std::shared_ptr<boost::asio::ssl::context> tls) { options_.tls = std::move(tls); }
  bool uses_tls() const { return options_.tls != nullptr; }

 private:
  friend class HttpSession;
  void accept();
  void accept_later();
  /// Makes room for a connection from `client`; false when nothing could give way.
  bool admit(const boost::asio::ip::address& client);
  void forget(std::list<std::weak_ptr<HttpSession>>::iterator where, const boost::asio::ip::address& client);

  boost::asio::io_context& io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  HttpHandler handler_;
  HttpServerOptions options_;
  RefusalObserver on_refusal_;
  std::list<std::weak_ptr<HttpSession>> sessions_;  ///< newest first
  std::size_t held_ = 0;                             ///< sessions holding a long poll
  /// Per client address, its sessions that hold no long poll (max_connections_per_client).
  std::map<boost::asio::ip::address, std::size_t> open_by_client_;
  std::unique_ptr<boost::asio::steady_timer> accept_retry_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace joule::daemon
