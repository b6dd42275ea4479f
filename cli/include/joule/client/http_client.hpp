#pragma once
// A small blocking HTTP/1.1 client for jouled's REST API (joulectl and the integration tests).

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "joule/common/result.hpp"

namespace joule::client {

struct HttpReply {
  unsigned status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  ///< lower-case names
};

/// "http://host:port" split into its parts.
struct ServerUrl {
  std::string host = "127.0.0.1";
  std::string port = "8571";
};
Result<ServerUrl> parse_server_url(const std::string& url);

class HttpClient {
 public:
  explicit HttpClient(ServerUrl server, std::string token = {},
                      std::chrono::milliseconds timeout = std::chrono::seconds(30));
  /// One request on a fresh connection. Fails only when no HTTP answer came back.
  Result<HttpReply> request(const std::string& method, const std::string& target, const std::string& body = {},
                            const std::string& content_type = "application/json") const;

 private:
  ServerUrl server_;
  std::string token_;
  std::chrono::milliseconds timeout_;
};

}  // namespace joule::client
