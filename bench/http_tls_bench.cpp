// http_tls_bench: what TLS costs jouled's HTTP server on loopback. Starts HttpServer twice (plain
// and TLS, a throw-away CA and a P-256 certificate made at start), with a handler that answers at
// once, and runs sequential client loops against each: keep-alive on one connection, a new
// connection per request, and joule::client::HttpClient (joulectl's path: resolve, connect,
// handshake and verify per request). Prints requests/s and the TLS/plain ratio.
//   http_tls_bench [SECONDS_PER_ROW]      (default 3)
//   http_tls_bench --serve SECONDS        only serve, for wrk; prints both URLs
// The server and the client share the machine's cores; read the ratios, not the absolute rates.

#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "joule/client/http_client.hpp"
#include "joule/daemon/http_server.hpp"
#include "running_http_server.hpp"
#include "temp_dir.hpp"
#include "test_connection.hpp"
#include "test_pki.hpp"

namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;

namespace {

void answer(joule::daemon::HttpRequest&&, const joule::daemon::HttpPeer&, joule::daemon::Reply reply) {
  joule::daemon::HttpResponse response{http::status::ok, 11};
  response.set(http::field::content_type, "application/json");
  response.body() = R"({"status":"ok"})";
  reply(std::move(response));
}

// Requests per second of `one` (which returns false on a failed request) over `seconds`.
double rate(double seconds, const std::function<bool()>& one) {
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  const auto start = Clock::now();
  long count = 0;
  while (Clock::now() < end) {
    if (!one()) throw std::runtime_error("a request failed");
    ++count;
  }
  return static_cast<double>(count) / std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) try {
  const bool serve = argc > 1 && std::string(argv[1]) == "--serve";
  const double seconds = argc > 1 ? std::atof(argv[serve ? 2 : 1]) : 3.0;
  joule::testing::TempDir dir;
  const auto pki = joule::testing::make_test_pki(dir.path());
  auto tls_context = joule::daemon::make_server_tls_context({pki.server_chain, pki.server_key});
  if (!tls_context) throw std::runtime_error(tls_context.error().message);

  joule::daemon::HttpServerOptions plain_options;
  plain_options.max_connections = 4096;
  joule::daemon::HttpServerOptions tls_options = plain_options;
  tls_options.tls = *tls_context;
  joule::testing::RunningHttpServer plain(answer, plain_options);
  joule::testing::RunningHttpServer tls(answer, tls_options);

  if (serve) {
    fmt::print("plain http://127.0.0.1:{}/\ntls   https://127.0.0.1:{}/\nCA    {}\n", plain.port(), tls.port(),
               pki.ca_certificate.string());
    std::cout.flush();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    return 0;
  }

  auto client_tls = joule::testing::client_tls_context(pki.ca_certificate);
  struct Row {
    const char* name;
    std::function<std::function<bool()>(const joule::testing::RunningHttpServer&, bool)> make;
  };
  using joule::testing::TestConnection;
  const Row rows[] = {
      {"keep-alive, one connection",
       [&](const auto& server, bool secure) -> std::function<bool()> {
         auto connection = std::make_shared<TestConnection>(server.port(), secure ? &client_tls : nullptr);
         return [connection] { return connection->request("/v1/health").has_value(); };
       }},
      {"new connection per request",
       [&](const auto& server, bool secure) -> std::function<bool()> {
         return [port = server.port(), secure, &client_tls] {
           TestConnection connection(port, secure ? &client_tls : nullptr);
           return connection.request("/v1/health", "", true).has_value();
         };
       }},
      {"HttpClient (joulectl's path)",
       [&](const auto& server, bool secure) -> std::function<bool()> {
         auto client = std::make_shared<joule::client::HttpClient>(
             joule::client::ServerUrl{"127.0.0.1", std::to_string(server.port()), secure}, "", std::chrono::seconds(5),
             joule::client::ClientTls{pki.ca_certificate});
         return [client] { return client->request("GET", "/v1/health").ok(); };
       }},
  };
  fmt::print("{:<30} {:>12} {:>12} {:>10}\n", "sequential requests", "plain req/s", "tls req/s", "tls/plain");
  for (const auto& row : rows) {
    const double plain_rate = rate(seconds, row.make(plain, false));
    const double tls_rate = rate(seconds, row.make(tls, true));
    fmt::print("{:<30} {:>12.0f} {:>12.0f} {:>10.2f}\n", row.name, plain_rate, tls_rate, tls_rate / plain_rate);
  }
  return 0;
} catch (const std::exception& error) {
  std::cerr << "http_tls_bench: " << error.what() << "\n";
  return 1;
}
