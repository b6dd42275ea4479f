// Bad input gets a clear error and changes nothing; no input crashes the daemon.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "daemon_process.hpp"

using joule::testing::DaemonProcess;
using nlohmann::json;

namespace {

int connect_raw(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) return -1;
  timeval limit{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  return fd;
}

std::string read_all(int fd) {
  std::string out;
  char buffer[4096];
  ssize_t n = 0;
  while ((n = ::recv(fd, buffer, sizeof buffer, 0)) > 0) out.append(buffer, static_cast<std::size_t>(n));
  return out;
}

}  // namespace

TEST(BadInputTest, each_bad_submission_is_refused_with_its_pointer_and_nothing_is_stored) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"run": {"command": []}})", "/run/command"},
      {R"({"run": {"command": "python3 train.py"}})", "/run/command"},
      {R"({"run": {"command": ["true"]}, "priority": "high"})", "/priority"},
      {R"({"name": "x"})", "/run"},
      {R"({"run": {"command": ["true"], "workdir": "/does/not/exist"}})", "/run/workdir"},
      {R"({"run": {"command": ["definitely-not-a-program"]}})", "/run/command/0"},
      {R"({"run": {"command": ["true"]}, "model": {"input": {"shape": [1]}, "layers": [{"type": "linear"}]}})",
       "/model/layers/0/out_features"},
      {R"({"run": {"command": ["true"]}, "constraints": {"devices": ["cuda:*"]}})", "/constraints/devices"},
      {R"({"run": {"command": ["true"]}, "model": {"input": {"shape": [1, 28, 28]},
           "layers": [{"type": "flatten"}, {"type": "conv2d", "out_channels": 6, "kernel_size": 5}]}})",
       "/model/layers/1"},
  };
  for (const auto& [body, pointer] : cases) {
    auto [status, problem] = daemon.call("POST", "/v1/jobs", body);
    EXPECT_EQ(status, 400u) << body;
    ASSERT_TRUE(problem.is_object()) << body;
    EXPECT_EQ(problem["errors"][0]["pointer"], pointer) << body << " -> " << problem.dump();
    EXPECT_FALSE(problem["detail"].get<std::string>().empty());
  }
  auto [status, malformed] = daemon.call("POST", "/v1/jobs", "{\"run\": ");
  EXPECT_EQ(status, 400u);
  EXPECT_NE(malformed["detail"].get<std::string>().find("malformed JSON"), std::string::npos);
  EXPECT_EQ(daemon.call("GET", "/v1/jobs").second["total"], 0);
  EXPECT_EQ(daemon.call("GET", "/metrics").first, 200u);
}

TEST(BadInputTest, oversized_bodies_get_413) {
  DaemonProcess daemon({.config_toml = "[server]\nmax_body_bytes = 2048\n"});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const std::string big = R"({"name": ")" + std::string(4096, 'x') + R"(", "run": {"command": ["true"]}})";
  auto [status, body] = daemon.call("POST", "/v1/jobs", big);
  EXPECT_EQ(status, 413u);
  EXPECT_EQ(daemon.call("GET", "/v1/jobs").second["total"], 0);
}

TEST(BadInputTest, garbage_and_half_open_connections_do_not_hurt_the_daemon) {
  DaemonProcess daemon({.config_toml = "[server]\nrequest_timeout_seconds = 1\n"});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const int garbage = connect_raw(daemon.port());
  ASSERT_GE(garbage, 0);
  const std::string noise = "\x16\x03\x01 not http at all\r\n\r\n";
  ::send(garbage, noise.data(), noise.size(), 0);
  EXPECT_NE(read_all(garbage).find("400"), std::string::npos);
  ::close(garbage);

  // Half a request line, then silence: the server hangs up after its timeout.
  const int slow = connect_raw(daemon.port());
  ::send(slow, "GET /v1/jo", 10, 0);
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(read_all(slow), "");
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(15));
  ::close(slow);
  EXPECT_EQ(daemon.call("GET", "/healthz").first, 200u);
}

// Each of these once stopped jouled (exit 1) with a single request, before authentication.
TEST(BadInputTest, the_requests_that_once_stopped_the_daemon_get_a_problem_and_it_serves_on) {
  DaemonProcess daemon({.config_toml = "[auth]\ntoken_sha256 = [\"" + std::string(64, 'a') + "\"]\n"});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const auto post = [](const std::string& target, const std::string& body) {
    return "POST " + target +
           " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
           body;
  };
  const std::vector<std::string> requests = {
      post("/v1/jobs/x/progress", R"({"epoch": 1e400})"),
      "GET /\xff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
      post("/v1/jobs/x/progress", "{\"epoch\":\"\xff\"}"),
      "GET /v1/jobs/%ff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
      "GET /v1/jobs/%ff HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer x\r\nConnection: close\r\n\r\n",
  };
  for (const auto& request : requests) {
    const int fd = connect_raw(daemon.port());
    ASSERT_GE(fd, 0);
    ::send(fd, request.data(), request.size(), 0);
    const std::string answer = read_all(fd);
    ::close(fd);
    EXPECT_EQ(answer.rfind("HTTP/1.1 4", 0), 0u) << answer;
    EXPECT_NE(answer.find("application/problem+json"), std::string::npos) << answer;
    ASSERT_TRUE(daemon.running()) << "stopped by: " << request << "\n" << daemon.log();
  }
  EXPECT_EQ(daemon.call("GET", "/healthz").first, 200u);
}

// RFC 9112's framing rules that Beast's parser leaves to the server: each gets its status and a
// problem, and nothing is stored; blank lines before a request line are skipped.
TEST(BadInputTest, requests_framed_against_rfc_9112_are_refused_and_leading_blank_lines_are_skipped) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const std::string job = R"({"run": {"command": ["true"]}})";
  const std::string chunked_job = fmt::format("{:x}\r\n{}\r\n0\r\n\r\n", job.size(), job);
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"400", "GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n"},
      {"400", "GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n"},
      {"501", "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n" +
                  chunked_job},
      {"400", "POST /v1/jobs HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked_job},
  };
  for (const auto& [status, request] : refused) {
    const int fd = connect_raw(daemon.port());
    ASSERT_GE(fd, 0);
    ::send(fd, request.data(), request.size(), 0);
    const std::string answer = read_all(fd);
    ::close(fd);
    EXPECT_NE(answer.find(" " + status + " "), std::string::npos) << request << "\n" << answer;
    EXPECT_NE(answer.find("application/problem+json"), std::string::npos) << answer;
  }
  EXPECT_EQ(daemon.call("GET", "/v1/jobs").second["total"], 0) << "a refused request stored a job";

  // HTTP/1.0 needs no Host; a CRLF before the request line is ignored (RFC 9112 2.2), and a
  // chunked body on HTTP/1.1 is read.
  for (const std::string& request : std::vector<std::string>{std::string("GET /healthz HTTP/1.0\r\n\r\n"), "\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" +
            chunked_job}) {
    const int fd = connect_raw(daemon.port());
    ASSERT_GE(fd, 0);
    ::send(fd, request.data(), request.size(), 0);
    const std::string answer = read_all(fd);
    ::close(fd);
    EXPECT_TRUE(answer.rfind("HTTP/1.1 200", 0) == 0 || answer.rfind("HTTP/1.1 201", 0) == 0 ||
                answer.rfind("HTTP/1.0 200", 0) == 0)
        << request << "\n" << answer;
  }
  EXPECT_EQ(daemon.call("GET", "/v1/jobs").second["total"], 1);
}

TEST(BadInputTest, refuses_a_public_address_without_tokens) {
  DaemonProcess daemon({.extra_args = {"--listen", "0.0.0.0:0"}, .listen_loopback_any_port = false});
  EXPECT_FALSE(daemon.start(std::chrono::seconds(5)));
  EXPECT_EQ(daemon.wait_exit(), 1);
  EXPECT_NE(daemon.log().find("refusing to listen on 0.0.0.0"), std::string::npos) << daemon.log();
}

TEST(BadInputTest, with_tokens_a_public_address_is_allowed_and_guarded) {
  // sha256("s3cret")
  DaemonProcess daemon({.config_toml = "[server]\nlisten = \"0.0.0.0:0\"\n[auth]\nlocal_users = \"none\"\n"
                                       "token_sha256 = "
                                       "[\"1ec1c26b50d5d3c58d9583181af8076655fe00756bf7285940ba3670f99fcba0\"]\n",
                        .listen_loopback_any_port = false});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  if (::geteuid() == 0) {
    // Without a token only root and jouled's own user get in (the kernel names them), and with
    // local_users = "none" no other local user does.
    auto [code, refused] = joule::testing::curl_as_nobody(daemon, "GET", "/v1/jobs");
    EXPECT_NE(refused.find("\"status\":401"), std::string::npos) << refused;
  } else {
    EXPECT_EQ(daemon.call("GET", "/v1/jobs").first, 200u) << "jouled's own user administers it";
  }
  auto with_token = daemon.client("s3cret").request("GET", "/v1/jobs");
  ASSERT_TRUE(with_token);
  EXPECT_EQ(with_token->status, 200u);
  EXPECT_EQ(daemon.client("wrong").request("GET", "/v1/jobs")->status, 401u);
  EXPECT_EQ(daemon.call("GET", "/healthz").first, 200u);
}

TEST(BadInputTest, a_bad_config_file_is_named_with_its_line) {
  DaemonProcess daemon({.config_toml = "[server]\nlisten = \"127.0.0.1:0\"\n[log]\nlevel = \"chatty\"\n",
                        .listen_loopback_any_port = false});
  EXPECT_FALSE(daemon.start(std::chrono::seconds(5)));
  EXPECT_EQ(daemon.wait_exit(), 1);
  EXPECT_NE(daemon.log().find("jouled.toml:4: log.level"), std::string::npos) << daemon.log();
}
