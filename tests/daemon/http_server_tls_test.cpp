// What TLS adds to the server: certificate and host name verification as joule::client sees
// them, plain HTTP on a TLS port, certificate files that cannot be used, and switching the
// certificate for new connections (SIGHUP reload).

#include <chrono>
#include <filesystem>
#include <memory>
#include <thread>

#include <gtest/gtest.h>
#include <openssl/ssl.h>
#include <boost/asio/ssl/context.hpp>

#include "joule/client/http_client.hpp"
#include "joule/daemon/http_server.hpp"
#include "running_http_server.hpp"
#include "temp_dir.hpp"
#include "test_connection.hpp"
#include "test_pki.hpp"

namespace http = boost::beast::http;
using joule::client::ClientTls;
using joule::client::HttpClient;
using joule::client::ServerUrl;
using joule::daemon::HttpRequest;
using joule::daemon::HttpResponse;
using joule::daemon::make_server_tls_context;
using joule::daemon::Reply;
using joule::daemon::TlsFiles;
using joule::testing::RunningHttpServer;
using namespace std::chrono_literals;

namespace {

// Whether `text` holds `part`, with both shown when it does not.
::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

void hello(HttpRequest&& request, const joule::daemon::HttpPeer&, Reply reply) {
  HttpResponse response{http::status::ok, 11};
  response.body() = "hello " + std::string(request.target());
  reply(std::move(response));
}

class HttpsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new joule::testing::TempDir;
    pki_ = new joule::testing::TestPki(joule::testing::make_test_pki(dir_->path()));
  }
  static void TearDownTestSuite() {
    delete pki_;
    delete dir_;
  }

  static std::shared_ptr<boost::asio::ssl::context> context(const std::filesystem::path& chain,
                                                            const std::filesystem::path& key) {
    auto made = make_server_tls_context({chain, key});
    EXPECT_TRUE(made) << made.error().message;
    return made ? *made : nullptr;
  }

  std::unique_ptr<RunningHttpServer> start(std::shared_ptr<boost::asio::ssl::context> tls) {
    joule::daemon::HttpServerOptions options;
    options.timeout_seconds = 5.0;
    options.tls = std::move(tls);
    return std::make_unique<RunningHttpServer>(hello, std::move(options));
  }
  std::unique_ptr<RunningHttpServer> start() { return start(context(pki_->server_chain, pki_->server_key)); }

  static HttpClient client(const RunningHttpServer& server, const std::string& host, ClientTls tls) {
    return HttpClient(ServerUrl{host, std::to_string(server.port()), true}, {}, 5s, std::move(tls));
  }

  static joule::testing::TempDir* dir_;
  static joule::testing::TestPki* pki_;
};

joule::testing::TempDir* HttpsTest::dir_ = nullptr;
joule::testing::TestPki* HttpsTest::pki_ = nullptr;

TEST_F(HttpsTest, a_client_trusting_the_ca_gets_the_handlers_answer_by_address_and_by_name) {
  auto server = start();
  for (const std::string host : {"127.0.0.1", "localhost"}) {
    auto reply = client(*server, host, {pki_->ca_certificate}).request("GET", "/v1/health");
    ASSERT_TRUE(reply) << host << ": " << reply.error().message;
    EXPECT_EQ(reply->status, 200u);
    EXPECT_EQ(reply->body, "hello /v1/health");
  }
}

// A cluster agent's syncs: one TLS handshake for many requests, and a connection the server
// closed while idle is replaced without the caller seeing a failure.
TEST_F(HttpsTest, a_kept_alive_connection_serves_many_requests_and_reopens_after_the_server_closed_it) {
  joule::daemon::HttpServerOptions options;
  options.timeout_seconds = 5.0;
  options.idle_timeout_seconds = 0.3;
  options.tls = context(pki_->server_chain, pki_->server_key);
  RunningHttpServer server(hello, std::move(options));
  joule::client::HttpConnection connection(client(server, "127.0.0.1", {pki_->ca_certificate}));
  for (int i = 0; i < 5; ++i) {
    auto reply = connection.request("POST", "/v1/cluster/sync", "{}");
    ASSERT_TRUE(reply) << reply.error().message;
    EXPECT_EQ(reply->body, "hello /v1/cluster/sync");
  }
  EXPECT_EQ(connection.connections_opened(), 1u);
  std::this_thread::sleep_for(800ms);  // past the server's idle timeout: it closes the connection
  auto again = connection.request("GET", "/v1/health");
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(again->body, "hello /v1/health");
  EXPECT_EQ(connection.connections_opened(), 2u);
}

TEST_F(HttpsTest, a_client_without_the_ca_is_refused_with_a_verify_error) {
  auto server = start();
  // No CA file: the system's store, which does not know the test CA.
  auto reply = client(*server, "127.0.0.1", {}).request("GET", "/v1/health");
  ASSERT_FALSE(reply);
  EXPECT_EQ(reply.error().code, joule::ErrorCode::unauthorized);
  EXPECT_TRUE(contains(reply.error().message, "certificate verify failed (unable to get local issuer certificate)"));
  // The client's alert makes the server's handshake fail: a refusal.
  for (int i = 0; i < 200 && server->refused_400() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server->refused_400(), 1);
}

TEST_F(HttpsTest, a_self_signed_certificate_is_refused_unless_it_is_trusted_itself) {
  auto server = start(context(pki_->self_signed_chain, pki_->self_signed_key));
  auto refused = client(*server, "127.0.0.1", {pki_->ca_certificate}).request("GET", "/");
  ASSERT_FALSE(refused);
  EXPECT_TRUE(contains(refused.error().message, "certificate verify failed (self-signed certificate)"));
  auto trusted = client(*server, "127.0.0.1", {pki_->self_signed_chain}).request("GET", "/");
  EXPECT_TRUE(trusted) << trusted.error().message;
}

TEST_F(HttpsTest, a_client_asking_for_another_host_name_is_refused) {
  // Signed by the trusted CA, but for jouled.example only.
  auto server = start(context(pki_->other_host_chain, pki_->other_host_key));
  auto by_address = client(*server, "127.0.0.1", {pki_->ca_certificate}).request("GET", "/");
  ASSERT_FALSE(by_address);
  EXPECT_TRUE(contains(by_address.error().message, "certificate verify failed (IP address mismatch)"));
  auto by_name = client(*server, "localhost", {pki_->ca_certificate}).request("GET", "/");
  ASSERT_FALSE(by_name);
  EXPECT_TRUE(contains(by_name.error().message, "certificate verify failed (hostname mismatch)"));
}

TEST_F(HttpsTest, plain_http_to_the_tls_port_gets_no_answer_and_tls_clients_are_still_served) {
  auto server = start();
  auto plain = HttpClient(ServerUrl{"127.0.0.1", std::to_string(server->port())}, {}, 5s).request("GET", "/");
  EXPECT_FALSE(plain) << "an HTTP answer came back: " << plain->status << " " << plain->body;
  for (int i = 0; i < 200 && server->refused_400() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server->refused_400(), 1);
  auto tls = client(*server, "127.0.0.1", {pki_->ca_certificate}).request("GET", "/after");
  ASSERT_TRUE(tls) << tls.error().message;
  EXPECT_EQ(tls->body, "hello /after");
}

TEST_F(HttpsTest, set_tls_changes_the_certificate_of_new_connections_only) {
  auto server = start();
  auto client_tls = joule::testing::client_tls_context(pki_->ca_certificate);
  joule::testing::TestConnection open(server->port(), &client_tls);
  ASSERT_TRUE(open.request("/before")) << open.error().message();

  auto renewed = context(pki_->self_signed_chain, pki_->self_signed_key);
  server->on_io([&](auto& s) {
    s.set_tls(renewed);
    return 0;
  });
  auto old_trust = client(*server, "127.0.0.1", {pki_->ca_certificate}).request("GET", "/");
  ASSERT_FALSE(old_trust);
  EXPECT_TRUE(contains(old_trust.error().message, "self-signed certificate"));
  EXPECT_TRUE(client(*server, "127.0.0.1", {pki_->self_signed_chain}).request("GET", "/"));
  auto still = open.request("/still");  // keeps the context it started with
  ASSERT_TRUE(still) << open.error().message();
  EXPECT_EQ(still->body(), "hello /still");
}

TEST_F(HttpsTest, the_context_allows_tls_1_2_and_newer_only) {
  auto tls = context(pki_->server_chain, pki_->server_key);
  ASSERT_TRUE(tls);
  EXPECT_EQ(SSL_CTX_get_min_proto_version(tls->native_handle()), TLS1_2_VERSION);
  auto server = start(tls);
  auto client_tls = joule::testing::client_tls_context(pki_->ca_certificate);
  SSL_CTX_set_max_proto_version(client_tls.native_handle(), TLS1_2_VERSION);
  joule::testing::TestConnection tls12(server->port(), &client_tls);
  EXPECT_TRUE(tls12.request("/")) << tls12.error().message();
}

TEST_F(HttpsTest, certificate_files_that_cannot_be_read_are_named) {
  const auto missing = dir_->path() / "missing.pem";
  auto no_chain = make_server_tls_context({missing, pki_->server_key});
  ASSERT_FALSE(no_chain);
  EXPECT_TRUE(contains(no_chain.error().message, "TLS certificate chain " + missing.string()));
  EXPECT_TRUE(contains(no_chain.error().message, "No such file or directory"));

  auto no_key = make_server_tls_context({pki_->server_chain, missing});
  ASSERT_FALSE(no_key);
  EXPECT_TRUE(contains(no_key.error().message, "TLS private key " + missing.string()));

  const auto garbage = dir_->write("garbage.pem", "not a certificate\n");
  auto not_pem = make_server_tls_context({garbage, pki_->server_key});
  ASSERT_FALSE(not_pem);
  EXPECT_TRUE(contains(not_pem.error().message, garbage.string() + " holds no PEM certificate"));

  auto key_as_chain = make_server_tls_context({pki_->server_key, pki_->server_key});
  ASSERT_FALSE(key_as_chain);
  EXPECT_TRUE(contains(key_as_chain.error().message, pki_->server_key.string() + " holds no PEM certificate"));

  auto chain_as_key = make_server_tls_context({pki_->server_chain, pki_->server_chain});
  ASSERT_FALSE(chain_as_key);
  EXPECT_TRUE(contains(chain_as_key.error().message, pki_->server_chain.string() + " holds no PEM private key"));

  auto directory = make_server_tls_context({dir_->path(), pki_->server_key});
  ASSERT_FALSE(directory);
  EXPECT_TRUE(contains(directory.error().message, "is a directory"));
}

TEST_F(HttpsTest, a_key_that_does_not_match_the_certificate_is_refused) {
  auto mismatched = make_server_tls_context({pki_->server_chain, pki_->unrelated_key});
  ASSERT_FALSE(mismatched);
  EXPECT_EQ(mismatched.error().message, "TLS private key " + pki_->unrelated_key.string() +
                                            " does not match the certificate in " + pki_->server_chain.string());
}

TEST_F(HttpsTest, an_encrypted_key_is_refused_without_asking_for_a_passphrase) {
  auto encrypted = make_server_tls_context({pki_->server_chain, pki_->encrypted_key});
  ASSERT_FALSE(encrypted);
  EXPECT_TRUE(contains(encrypted.error().message, pki_->encrypted_key.string() + " is encrypted"));
}

}  // namespace
