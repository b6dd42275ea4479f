// The server's connection handling, run once over plain TCP and once over TLS: keep-alive,
// Connection: close, the body limit, the connection limit, graceful stop and the timeout.

#include "joule/daemon/http_server.hpp"

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <boost/asio/ssl/context.hpp>
#include <boost/beast/http/error.hpp>

#include "running_http_server.hpp"
#include "temp_dir.hpp"
#include "test_connection.hpp"
#include "test_pki.hpp"

namespace http = boost::beast::http;
using joule::daemon::HttpRequest;
using joule::daemon::HttpResponse;
using joule::daemon::HttpServerOptions;
using joule::daemon::Reply;
using joule::testing::RunningHttpServer;
using joule::testing::TestConnection;
using namespace std::chrono_literals;

namespace {

// Answers "METHOD /target[ body]".
void echo(HttpRequest&& request, const joule::daemon::HttpPeer&, Reply reply) {
  HttpResponse response{http::status::ok, 11};
  response.body() = std::string(request.method_string()) + " " + std::string(request.target());
  if (!request.body().empty()) response.body() += " " + request.body();
  reply(std::move(response));
}

template <class Condition>
bool eventually(Condition condition) {
  for (int i = 0; i < 500; ++i, std::this_thread::sleep_for(10ms))
    if (condition()) return true;
  return false;
}

class HttpServerTest : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new joule::testing::TempDir;
    pki_ = new joule::testing::TestPki(joule::testing::make_test_pki(dir_->path()));
  }
  static void TearDownTestSuite() {
    delete pki_;
    delete dir_;
  }

  bool tls() const { return GetParam(); }

  std::unique_ptr<RunningHttpServer> start(HttpServerOptions options, joule::daemon::HttpHandler handler = echo) {
    if (tls()) {
      auto context = joule::daemon::make_server_tls_context({pki_->server_chain, pki_->server_key});
      EXPECT_TRUE(context) << context.error().message;
      options.tls = *context;
    }
    return std::make_unique<RunningHttpServer>(std::move(handler), std::move(options));
  }

  TestConnection connect(const RunningHttpServer& server) {
    return TestConnection(server.port(), tls() ? &client_tls_ : nullptr);
  }

  static joule::testing::TempDir* dir_;
  static joule::testing::TestPki* pki_;
  boost::asio::ssl::context client_tls_ = joule::testing::client_tls_context(pki_->ca_certificate);
};

joule::testing::TempDir* HttpServerTest::dir_ = nullptr;
joule::testing::TestPki* HttpServerTest::pki_ = nullptr;

TEST_P(HttpServerTest, answers_several_requests_on_one_kept_alive_connection) {
  auto server = start({});
  TestConnection connection = connect(*server);
  ASSERT_FALSE(connection.error()) << connection.error().message();
  for (const std::string target : {"/a", "/b", "/c"}) {
    auto response = connection.request(target);
    ASSERT_TRUE(response) << connection.error().message();
    EXPECT_EQ(response->result(), http::status::ok);
    EXPECT_EQ(response->body(), "GET " + target);
    EXPECT_TRUE(response->keep_alive());
    EXPECT_EQ((*response)[http::field::server], "jouled");
  }
  EXPECT_EQ(server->on_io([](auto& s) { return s.connections(); }), 1u);
}

TEST_P(HttpServerTest, closes_cleanly_after_answering_connection_close) {
  auto server = start({});
  TestConnection connection = connect(*server);
  auto response = connection.request("/last", "", true);
  ASSERT_TRUE(response) << connection.error().message();
  EXPECT_FALSE(response->keep_alive());
  // A clean end (close_notify for TLS), not a truncated stream.
  EXPECT_FALSE(connection.read());
  EXPECT_EQ(connection.error(), http::error::end_of_stream) << connection.error().message();
  EXPECT_TRUE(eventually([&] { return server->on_io([](auto& s) { return s.connections(); }) == 0; }));
}

TEST_P(HttpServerTest, refuses_a_body_over_the_limit_with_413_and_closes) {
  HttpServerOptions options;
  options.max_body_bytes = 16;
  auto server = start(options);
  TestConnection connection = connect(*server);
  auto response = connection.request("/jobs", std::string(100, 'x'));
  ASSERT_TRUE(response) << connection.error().message();
  EXPECT_EQ(response->result(), http::status::payload_too_large);
  EXPECT_NE(response->body().find("limit of 16 bytes"), std::string::npos) << response->body();
  EXPECT_FALSE(response->keep_alive());
  EXPECT_FALSE(connection.read());
}

TEST_P(HttpServerTest, a_head_answer_has_the_length_of_the_get_answer_and_no_body) {
  auto server = start({});
  TestConnection connection = connect(*server);
  auto head = connection.request("/healthz", {}, false, boost::beast::http::verb::head);
  ASSERT_TRUE(head) << connection.error().message();
  EXPECT_EQ((*head)[http::field::content_length], std::to_string(std::string("HEAD /healthz").size()));
  EXPECT_TRUE(head->body().empty());
  // The connection is still in step: the next answer is the next request's.
  auto next = connection.request("/next");
  ASSERT_TRUE(next) << connection.error().message();
  EXPECT_EQ(next->body(), "GET /next");
}

TEST_P(HttpServerTest, at_the_limit_the_longest_idle_connection_gives_way_to_a_new_one) {
  HttpServerOptions options;
  options.max_connections = 1;
  auto server = start(options);
  TestConnection first = connect(*server);
  ASSERT_TRUE(first.request("/first")) << first.error().message();
  // The first connection is idle now (kept alive): it is closed to let the second in.
  TestConnection second = connect(*server);
  auto answer = second.request("/second");
  ASSERT_TRUE(answer) << second.error().message();
  EXPECT_EQ(answer->body(), "GET /second");
  EXPECT_FALSE(first.request("/again"));
  EXPECT_EQ(server->refused_503(), 0);
}

// Holds every request unanswered until the test lets go, so connections stay busy.
struct HeldReplies {
  std::mutex mutex;
  std::vector<Reply> replies;
  joule::daemon::HttpHandler handler() {
    return [this](HttpRequest&&, const joule::daemon::HttpPeer&, Reply reply) {
      std::lock_guard lock(mutex);
      replies.push_back(std::move(reply));
    };
  }
  std::size_t count() {
    std::lock_guard lock(mutex);
    return replies.size();
  }
};

TEST_P(HttpServerTest, when_every_connection_is_busy_a_newcomer_gets_503_with_retry_after) {
  for (const bool per_client : {false, true}) {
    HttpServerOptions options;
    (per_client ? options.max_connections_per_client : options.max_connections) = 1;
    HeldReplies held;
    auto server = start(options, held.handler());
    TestConnection busy = connect(*server);
    std::future<std::optional<TestConnection::Response>> answer =
        std::async(std::launch::async, [&busy] { return busy.request("/slow"); });
    ASSERT_TRUE(eventually([&] { return held.count() == 1; }));
    TestConnection newcomer(server->port(), tls() ? &client_tls_ : nullptr, false);
    if (tls()) {
      // A TLS client cannot read a plain answer before its handshake: it is closed.
      EXPECT_TRUE(newcomer.error() || !newcomer.read());
    } else {
      auto refused = newcomer.read();
      ASSERT_TRUE(refused) << newcomer.error().message();
      EXPECT_EQ(refused->result_int(), 503u);
      EXPECT_EQ((*refused)[http::field::retry_after], "1");
      EXPECT_EQ((*refused)[http::field::content_type], "application/problem+json");
      EXPECT_NE(refused->body().find("\"status\":503"), std::string::npos) << refused->body();
    }
    EXPECT_TRUE(eventually([&] { return server->refused_503() == 1; }));
    server->on_io([&held](auto&) {
      HttpResponse response{http::status::ok, 11};
      response.body() = "done";
      held.replies.front()(std::move(response));
      return 0;
    });
    auto done = answer.get();
    ASSERT_TRUE(done);
    EXPECT_EQ(done->body(), "done");
    // The held replies keep their sessions alive: they go on the io thread, while the server and
    // its io_context still exist (ASan found sessions destroyed after their io_context).
    server->on_io([&held](auto&) {
      held.replies.clear();
      return 0;
    });
  }
}

// A coordinator's agent syncs are long polls: held, they do not count against max_connections
// (nor the per-client cap: simulated agents share one address), so other clients still get in.
TEST_P(HttpServerTest, held_long_polls_count_apart_from_the_connection_limit) {
  HttpServerOptions options;
  options.max_connections = 2;
  options.max_connections_per_client = 2;
  options.long_poll = [](const HttpRequest& request) { return request.target() == "/v1/cluster/sync"; };
  HeldReplies held;
  auto server = start(options, [&held](HttpRequest&& request, const joule::daemon::HttpPeer& peer, Reply reply) {
    if (request.target() == "/v1/cluster/sync") return held.handler()(std::move(request), peer, std::move(reply));
    echo(std::move(request), peer, std::move(reply));
  });
  std::vector<std::unique_ptr<TestConnection>> polls;
  std::vector<std::future<std::optional<TestConnection::Response>>> answers;
  for (int i = 0; i < 4; ++i) {
    polls.push_back(std::make_unique<TestConnection>(server->port(), tls() ? &client_tls_ : nullptr));
    answers.push_back(std::async(std::launch::async, [&poll = *polls.back()] { return poll.request("/v1/cluster/sync"); }));
    ASSERT_TRUE(eventually([&] { return held.count() == static_cast<std::size_t>(i + 1); }));
  }
  EXPECT_EQ(server->on_io([](auto& s) { return s.long_polls(); }), 4u);
  // Four held polls on a server capped at two connections; an ordinary client is served.
  TestConnection other = connect(*server);
  auto answer = other.request("/v1/jobs");
  ASSERT_TRUE(answer) << other.error().message();
  EXPECT_EQ(answer->body(), "GET /v1/jobs");
  EXPECT_EQ(server->refused_503(), 0);
  // Answered, a poll's connection counts as any other again.
  server->on_io([&held](auto&) {
    for (auto& reply : held.replies) {
      HttpResponse response{http::status::ok, 11};
      response.body() = "synced";
      reply(std::move(response));
    }
    held.replies.clear();
    return 0;
  });
  for (auto& pending : answers) {
    auto done = pending.get();
    ASSERT_TRUE(done);
    EXPECT_EQ(done->body(), "synced");
  }
  EXPECT_EQ(server->on_io([](auto& s) { return s.long_polls(); }), 0u);
}

TEST_P(HttpServerTest, an_idle_kept_alive_connection_is_closed_after_the_idle_timeout) {
  HttpServerOptions options;
  options.idle_timeout_seconds = 0.2;  // the request timeout stays at 30 s
  auto server = start(options);
  TestConnection connection = connect(*server);
  ASSERT_TRUE(connection.request("/one")) << connection.error().message();
  const auto before = std::chrono::steady_clock::now();
  EXPECT_FALSE(connection.read());  // the server closes it
  EXPECT_LT(std::chrono::steady_clock::now() - before, 3s);
  EXPECT_TRUE(eventually([&] { return server->on_io([](auto& s) { return s.connections(); }) == 0; }));
}

TEST_P(HttpServerTest, stop_answers_the_request_in_flight_and_closes_idle_connections) {
  std::promise<Reply> pending;
  auto server = start({}, [&pending](HttpRequest&&, const joule::daemon::HttpPeer&, Reply reply) {
    pending.set_value(std::move(reply));
  });
  TestConnection idle = connect(*server);
  ASSERT_FALSE(idle.error()) << idle.error().message();
  TestConnection busy = connect(*server);
  ASSERT_FALSE(busy.error()) << busy.error().message();
  // The idle connection is known to the server once its handshake (if any) is done.
  EXPECT_TRUE(eventually([&] { return server->on_io([](auto& s) { return s.connections(); }) == 2; }));

  std::future<std::optional<TestConnection::Response>> answer =
      std::async(std::launch::async, [&busy] { return busy.request("/slow"); });
  Reply reply = pending.get_future().get();
  server->on_io([](auto& s) {
    s.stop();
    return 0;
  });
  EXPECT_FALSE(idle.read());
  server->on_io([&reply](auto&) {
    HttpResponse response{http::status::ok, 11};
    response.body() = "late";
    Reply last = std::move(reply);  // a Reply holds its session, as a handler's would until it answers
    last(std::move(response));
    return 0;
  });
  auto response = answer.get();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->body(), "late");
  EXPECT_FALSE(response->keep_alive());
  EXPECT_TRUE(eventually([&] { return server->on_io([](auto& s) { return s.connections(); }) == 0; }));
  EXPECT_TRUE(TestConnection(server->port(), nullptr).error()) << "still accepting after stop()";
}

TEST_P(HttpServerTest, drops_a_silent_client_after_the_timeout) {
  HttpServerOptions options;
  options.timeout_seconds = 0.2;
  auto server = start(options);
  // Connected, but neither a request nor (for TLS) a handshake.
  TestConnection silent(server->port(), tls() ? &client_tls_ : nullptr, false);
  ASSERT_FALSE(silent.error()) << silent.error().message();
  const auto before = std::chrono::steady_clock::now();
  EXPECT_TRUE(eventually([&] { return server->on_io([](auto& s) { return s.connections(); }) == 1; }));
  EXPECT_TRUE(eventually([&] { return server->on_io([](auto& s) { return s.connections(); }) == 0; }));
  EXPECT_LT(std::chrono::steady_clock::now() - before, 3s);
  EXPECT_EQ(server->refused_400(), 0);  // a timeout is no refusal
  TestConnection next = connect(*server);
  EXPECT_TRUE(next.request("/next")) << next.error().message();
}

INSTANTIATE_TEST_SUITE_P(Streams, HttpServerTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Tls" : "Plain"; });

}  // namespace
