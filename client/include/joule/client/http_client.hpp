#pragma once
// A small blocking HTTP/1.1 client for jouled's REST API (joulectl, cluster agents and the
// integration tests), over plain TCP or TLS.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "joule/common/result.hpp"

namespace joule::client {

struct HttpReply {
  unsigned status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  ///< lower-case names
};

/// "http://host:port" or "https://host:port" split into its parts. The port defaults to 8571
/// for both schemes; a URL without a scheme is http. IPv6 hosts are written "[::1]" in the URL
/// and kept without brackets here.
struct ServerUrl {
  std::string host = "127.0.0.1";
  std::string port = "8571";
  bool tls = false;  ///< https: TLS 1.2+, the server's certificate and host name verified
};
Result<ServerUrl> parse_server_url(const std::string& url);

/// How an https client trusts the server.
struct ClientTls {
  /// PEM file of the CA certificate(s) that signed jouled's certificate (a private CA, or the
  /// self-signed certificate itself). Empty: the system's default verify paths
  /// (/etc/ssl/certs on Debian).
  std::filesystem::path ca_file;
};

class HttpClient {
 public:
  /// For an https server the CA file (or the system's store) is read here, once; a file that
  /// cannot be read makes every request fail with a message naming it. `tls` is unused for http.
  explicit HttpClient(ServerUrl server, std::string token = {},
                      std::chrono::milliseconds timeout = std::chrono::seconds(30), ClientTls tls = {});
  /// One request on a fresh connection; the timeout covers connecting, the TLS handshake, the
  /// request and the response. Fails only when no HTTP answer came back: ErrorCode::unauthorized
  /// when the server's certificate fails verification ("certificate verify failed (self-signed
  /// certificate)", "... (hostname mismatch)"), ErrorCode::unavailable when nothing answers,
  /// ErrorCode::io when the exchange breaks off. Safe to call from several threads at once.
  Result<HttpReply> request(const std::string& method, const std::string& target, const std::string& body = {},
                            const std::string& content_type = "application/json") const;
  /// Sends the token as `name: TOKEN` instead of `Authorization: Bearer TOKEN` (an API that
  /// wants its key in a header of its own, such as ElectricityMaps' `auth-token`).
  void set_token_header(std::string name) { token_header_ = std::move(name); }

 private:
  friend class HttpConnection;  // shares the server, token, timeout and TLS setup

  struct TlsSetup;  // the verifying OpenSSL context, shared by copies of the client

  ServerUrl server_;
  std::string token_;
  std::string token_header_;  // empty: Authorization: Bearer
  std::chrono::milliseconds timeout_;
  std::shared_ptr<TlsSetup> tls_;  // null for http
};

/// One connection kept open from request to request (HTTP/1.1 keep-alive): a cluster agent's
/// syncs then cost one TCP connect and one TLS handshake in all, not one each. It opens on the
/// first request and again after the server or the network closed it; a request that fails at
/// once (not by its timeout) on a connection that had already served one is sent once more on a
/// fresh connection (the server may have closed it while idle). Errors as HttpClient's. Not
/// thread-safe: one per thread.
class HttpConnection {
 public:
  explicit HttpConnection(HttpClient client);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  /// `timeout` covers this request (connecting too, when it must); 0: the client's.
  Result<HttpReply> request(const std::string& method, const std::string& target, const std::string& body = {},
                            std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  /// Connections opened so far: 1 while the server keeps the first one alive.
  std::size_t connections_opened() const;

 private:
  struct State;
  HttpClient client_;
  std::unique_ptr<State> state_;
};

}  // namespace joule::client
