#include "joule/client/http_client.hpp"

#include <gtest/gtest.h>

#include "temp_dir.hpp"

using joule::client::ClientTls;
using joule::client::HttpClient;
using joule::client::parse_server_url;
using joule::client::ServerUrl;

namespace {

// Whether `text` holds `part`, with both shown when it does not.
::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

TEST(ServerUrlTest, both_schemes_default_to_port_8571) {
  auto plain = parse_server_url("http://node7");
  ASSERT_TRUE(plain) << plain.error().message;
  EXPECT_EQ(plain->host, "node7");
  EXPECT_EQ(plain->port, "8571");
  EXPECT_FALSE(plain->tls);
  auto tls = parse_server_url("https://node7.example/");
  ASSERT_TRUE(tls) << tls.error().message;
  EXPECT_EQ(tls->host, "node7.example");
  EXPECT_EQ(tls->port, "8571");
  EXPECT_TRUE(tls->tls);
}

TEST(ServerUrlTest, keeps_the_given_port_and_ipv6_hosts) {
  auto tls = parse_server_url("https://[::1]:9443/v1/jobs");
  ASSERT_TRUE(tls) << tls.error().message;
  EXPECT_EQ(tls->host, "::1");
  EXPECT_EQ(tls->port, "9443");
  EXPECT_TRUE(tls->tls);
  auto bare = parse_server_url("127.0.0.1:8000");
  ASSERT_TRUE(bare) << bare.error().message;
  EXPECT_EQ(bare->port, "8000");
  EXPECT_FALSE(bare->tls);
}

TEST(ServerUrlTest, refuses_other_schemes_and_empty_parts) {
  auto ftp = parse_server_url("ftp://node7");
  ASSERT_FALSE(ftp);
  EXPECT_TRUE(contains(ftp.error().message, "only http:// and https://"));
  EXPECT_FALSE(parse_server_url("https://node7:"));
}

TEST(HttpClientTest, a_ca_file_that_cannot_be_read_is_named_by_every_request) {
  joule::testing::TempDir dir;
  const auto missing = dir / "ca.pem";
  const HttpClient client(ServerUrl{"127.0.0.1", "1", true}, {}, std::chrono::seconds(1), ClientTls{missing});
  for (int i = 0; i < 2; ++i) {
    auto reply = client.request("GET", "/v1/health");
    ASSERT_FALSE(reply);
    EXPECT_EQ(reply.error().message, "cannot read CA file " + missing.string() + ": No such file or directory");
  }
  const auto garbage = dir.write("garbage.pem", "no certificate here\n");
  auto reply = HttpClient(ServerUrl{"127.0.0.1", "1", true}, {}, std::chrono::seconds(1), ClientTls{garbage})
                   .request("GET", "/");
  ASSERT_FALSE(reply);
  EXPECT_TRUE(contains(reply.error().message, "CA file " + garbage.string() + " holds no usable PEM certificate"));
}

}  // namespace
