#include "joule/client/http_client.hpp"

#include <fmt/format.h>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/dynamic_body.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

namespace joule::client {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

Result<ServerUrl> parse_server_url(const std::string& url) {
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0)
    rest = rest.substr(7);
  else if (rest.find("://") != std::string::npos)
    return make_error(ErrorCode::invalid_argument, fmt::format("{}: only http:// URLs are supported", url));
  if (const auto slash = rest.find('/'); slash != std::string::npos) rest = rest.substr(0, slash);
  ServerUrl out;
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
    return make_error(ErrorCode::invalid_argument, fmt::format("{}: expected http://HOST:PORT", url));
  return out;
}

HttpClient::HttpClient(ServerUrl server, std::string token, std::chrono::milliseconds timeout)
    : server_(std::move(server)), token_(std::move(token)), timeout_(timeout) {}

Result<HttpReply> HttpClient::request(const std::string& method, const std::string& target, const std::string& body,
                                      const std::string& content_type) const {
  asio::io_context io;
  beast::tcp_stream stream(io);
  beast::error_code ec;
  asio::ip::tcp::resolver resolver(io);
  const auto endpoints = resolver.resolve(server_.host, server_.port, ec);
  if (ec) return make_error(ErrorCode::unavailable, fmt::format("cannot resolve {}: {}", server_.host, ec.message()));
  stream.expires_after(timeout_);
  // Run the async operations to completion so the stream's timeout applies to each of them.
  stream.async_connect(endpoints, [&](beast::error_code e, const auto&) { ec = e; });
  io.run();
  if (ec) {
    return make_error(ErrorCode::unavailable,
                      fmt::format("cannot connect to jouled at {}:{}: {} (is it running? see --server or JOULE_SERVER)",
                                  server_.host, server_.port, ec.message()));
  }
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, server_.host);
  req.set(http::field::user_agent, "joulectl");
  if (!token_.empty()) req.set(http::field::authorization, "Bearer " + token_);
  if (!body.empty() || method == "POST") {
    req.set(http::field::content_type, content_type);
    req.body() = body;
  }
  req.prepare_payload();
  io.restart();
  http::async_write(stream, req, [&](beast::error_code e, std::size_t) { ec = e; });
  io.run();
  if (ec) return make_error(ErrorCode::io, fmt::format("sending the request failed: {}", ec.message()));
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(1ULL << 30);
  io.restart();
  http::async_read(stream, buffer, parser, [&](beast::error_code e, std::size_t) { ec = e; });
  io.run();
  if (ec) return make_error(ErrorCode::io, fmt::format("reading the response failed: {}", ec.message()));
  auto response = parser.release();
  HttpReply reply;
  reply.status = response.result_int();
  reply.body = std::move(response.body());
  for (const auto& field : response) {
    std::string name(field.name_string());
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    reply.headers[name] = std::string(field.value());
  }
  stream.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  return reply;
}

}  // namespace joule::client
