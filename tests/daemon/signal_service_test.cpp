// The carbon signal jouled keeps: what stands in when the source says nothing (GridSignalFeed),
// and the service that reads a real file on a manual clock or fetches a real HTTP server on
// loopback (SignalService): changes picked up, bad loads keeping the last good signal, the
// metrics and GET /v1/signals' description saying which is in force.

#include <atomic>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>

#include "joule/common/clock.hpp"
#include "joule/daemon/grid_signal_feed.hpp"
#include "joule/daemon/metrics.hpp"
#include "joule/daemon/signal_service.hpp"
#include "running_http_server.hpp"
#include "temp_dir.hpp"

namespace {

using namespace std::chrono_literals;
using joule::ManualClock;
using joule::daemon::GridSignalFeed;
using joule::daemon::SignalService;
using joule::daemon::SignalState;
using joule::schedulers::GridSignal;
using joule::schedulers::UnixMillis;

constexpr UnixMillis kHour = 3'600'000;
constexpr UnixMillis kNoon = 1'800'000'000'000;  // ManualClock's default now

GridSignal hours(UnixMillis from, std::vector<double> values) {
  std::vector<joule::schedulers::SignalPoint> points;
  for (std::size_t i = 0; i < values.size(); ++i)
    points.push_back({from + static_cast<UnixMillis>(i) * kHour, values[i]});
  return GridSignal::from_points(std::move(points), from + static_cast<UnixMillis>(values.size()) * kHour).value();
}

TEST(GridSignalFeedTest, nothing_loaded_and_no_constant_is_no_signal) {
  GridSignalFeed feed("file /x.csv", std::nullopt);
  EXPECT_EQ(feed.in_force(kNoon).signal, nullptr);
  EXPECT_EQ(feed.in_force(kNoon).state, SignalState::none);
  EXPECT_FALSE(feed.amount(3.6e6, kNoon, kNoon + kHour));
  EXPECT_EQ(feed.describe(kNoon)["state"], "none");
}

TEST(GridSignalFeedTest, a_signal_covering_now_is_fresh_and_past_its_end_the_constant_stands_in) {
  GridSignalFeed feed("file /x.csv", 300.0);
  EXPECT_EQ(feed.in_force(kNoon).state, SignalState::constant);
  EXPECT_DOUBLE_EQ(*feed.value_at(kNoon), 300.0);
  feed.loaded(hours(kNoon, {100, 200}), kNoon);
  EXPECT_EQ(feed.in_force(kNoon).state, SignalState::fresh);
  EXPECT_EQ(feed.in_force(kNoon).source, "file /x.csv");
  EXPECT_DOUBLE_EQ(*feed.value_at(kNoon + kHour), 200.0);
  // 1 kWh over the two hours: 150 g.
  EXPECT_DOUBLE_EQ(*feed.amount(3.6e6, kNoon, kNoon + 2 * kHour), 150.0);
  EXPECT_EQ(feed.in_force(kNoon + 2 * kHour).state, SignalState::constant);
  EXPECT_DOUBLE_EQ(*feed.value_at(kNoon + 3 * kHour), 300.0);
  EXPECT_EQ(feed.in_force(kNoon + 2 * kHour).source, "constant 300 g/kWh");
}

TEST(GridSignalFeedTest, without_a_constant_an_ended_signal_is_stale_and_its_last_value_holds) {
  GridSignalFeed feed("url http://x/", std::nullopt);
  feed.loaded(hours(kNoon, {100, 200}), kNoon);
  const auto later = kNoon + 5 * kHour;
  EXPECT_EQ(feed.in_force(later).state, SignalState::stale);
  EXPECT_DOUBLE_EQ(*feed.value_at(later), 200.0);
  // A stale signal offers no cleaner window to wait for: placement never defers on it.
  EXPECT_FALSE(feed.in_force(later).signal->lowest_start(later, later + kHour, kHour / 2));
}

TEST(GridSignalFeedTest, a_failed_load_keeps_the_signal_and_says_why_once_per_new_error) {
  GridSignalFeed feed("file /x.csv", std::nullopt);
  feed.loaded(hours(kNoon, {100}), kNoon);
  EXPECT_TRUE(feed.failed("x.csv:3: bad value", kNoon + 1));
  EXPECT_FALSE(feed.failed("x.csv:3: bad value", kNoon + 2));
  EXPECT_TRUE(feed.failed("x.csv: cannot read it", kNoon + 3));
  EXPECT_EQ(feed.failures(), 3u);
  EXPECT_EQ(feed.in_force(kNoon).state, SignalState::fresh);
  const auto described = feed.describe(kNoon);
  EXPECT_EQ(described["last_error"], "x.csv: cannot read it");
  EXPECT_EQ(described["failures"], 3);
  EXPECT_EQ(described["points"], 1);
  // A later good load clears the error.
  feed.loaded(hours(kNoon, {120}), kNoon + 4);
  EXPECT_TRUE(feed.describe(kNoon)["last_error"].is_null());
}

TEST(GridSignalFeedTest, describe_points_at_the_lowest_value_ahead) {
  GridSignalFeed feed("file /x.csv", std::nullopt);
  feed.loaded(hours(kNoon - kHour, {50, 300, 90, 200}), kNoon);
  const auto described = feed.describe(kNoon + kHour / 2);
  EXPECT_DOUBLE_EQ(described["value_now"].get<double>(), 300.0);
  EXPECT_DOUBLE_EQ(described["lowest_ahead"]["value"].get<double>(), 90.0);
  EXPECT_EQ(described["lowest_ahead"]["at"], joule::schedulers::format_rfc3339(kNoon + kHour));
}

class SignalServiceTest : public ::testing::Test {
 protected:
  void run() {
    io_.restart();
    io_.run_for(20ms);
  }
  // The first sample line of `name` whose labels contain `labels`.
  std::string metric(const std::string& name, const std::string& labels = "") {
    std::istringstream text(metrics_.serialize());
    for (std::string line; std::getline(text, line);)
      if (line.starts_with(name + "{") && line.find(labels) != std::string::npos) return line;
    return "";
  }

  joule::testing::TempDir dir_;
  boost::asio::io_context io_;
  ManualClock clock_;
  joule::daemon::Metrics metrics_;
};

TEST_F(SignalServiceTest, a_file_is_read_at_start_and_again_when_it_changes_and_a_bad_one_keeps_the_last) {
  const auto file = dir_.write("carbon.csv", "time,value\n2027-01-15T08:00:00Z,200\n2027-01-15T09:00:00Z,100\n");
  clock_.set_wall(joule::schedulers::parse_rfc3339("2027-01-15T08:30:00Z").value());
  joule::config::SignalConfig config;
  config.file = file;
  config.refresh_seconds = 60;
  SignalService service(io_, metrics_, config, joule::config::SignalKind::carbon, clock_);
  service.start();
  EXPECT_EQ(service.feed().in_force(clock_.unix_ms()).state, SignalState::fresh);
  EXPECT_DOUBLE_EQ(*service.feed().value_at(clock_.unix_ms()), 200.0);
  EXPECT_NE(metric("joule_grid_carbon_intensity_grams_per_kwh").find(" 200"), std::string::npos);

  // A bad edit: reported, counted, the last good signal stays.
  dir_.write("carbon.csv", "time,value\n2027-01-15T08:00:00Z,-5\n");
  std::filesystem::last_write_time(file, std::filesystem::last_write_time(file) + 1s);
  clock_.advance(60s);
  run();
  EXPECT_NE(service.feed().last_error().find("carbon.csv"), std::string::npos) << service.feed().last_error();
  EXPECT_DOUBLE_EQ(*service.feed().value_at(clock_.unix_ms()), 200.0);
  EXPECT_NE(metric("joule_grid_carbon_signal_failures_total").find(" 1"), std::string::npos);

  // Unchanged, it is not read again (one failure, not one per period).
  clock_.advance(60s);
  run();
  EXPECT_EQ(service.feed().failures(), 1u);

  // Fixed: the new values are in force.
  dir_.write("carbon.csv", "time,value\n2027-01-15T08:00:00Z,50\n2027-01-15T10:00:00Z,60\n");
  std::filesystem::last_write_time(file, std::filesystem::last_write_time(file) + 2s);
  clock_.advance(60s);
  run();
  EXPECT_DOUBLE_EQ(*service.feed().value_at(clock_.unix_ms()), 50.0);
  EXPECT_TRUE(service.feed().last_error().empty());
  EXPECT_EQ(service.describe()["carbon"]["state"], "fresh");
  EXPECT_EQ(service.describe()["carbon"]["refresh_seconds"], 60.0);
  service.stop();
}

TEST_F(SignalServiceTest, a_missing_file_leaves_the_constant_in_force) {
  joule::config::SignalConfig config;
  config.file = dir_ / "absent.json";
  config.constant = 420.0;
  SignalService service(io_, metrics_, config, joule::config::SignalKind::carbon, clock_);
  service.start();
  EXPECT_EQ(service.feed().in_force(clock_.unix_ms()).state, SignalState::constant);
  EXPECT_NE(service.feed().last_error().find("absent.json"), std::string::npos);
  EXPECT_NE(metric("joule_grid_carbon_signal_state", "state=\"constant\"").find(" 1"), std::string::npos);
  service.stop();
}

TEST_F(SignalServiceTest, a_reload_switches_the_source_and_keeps_the_signal_when_only_settings_change) {
  joule::config::SignalConfig config;
  config.constant = 250.0;
  SignalService service(io_, metrics_, config, joule::config::SignalKind::carbon, clock_);
  service.start();
  EXPECT_EQ(service.feed().in_force(clock_.unix_ms()).state, SignalState::constant);
  int changes = 0;
  service.on_change([&] { ++changes; });

  const auto file = dir_.write("carbon.csv", "time,value\n2027-01-15T08:00:00Z,200\n2027-01-15T09:00:00Z,100\n");
  clock_.set_wall(joule::schedulers::parse_rfc3339("2027-01-15T08:30:00Z").value());
  config.file = file;
  service.reconfigure(config);
  EXPECT_EQ(service.feed().in_force(clock_.unix_ms()).state, SignalState::fresh);
  EXPECT_DOUBLE_EQ(*service.feed().value_at(clock_.unix_ms()), 200.0);
  EXPECT_GE(changes, 1);

  // Only the period changes: the signal stays (the file, gone now, is a failed load that keeps it).
  std::filesystem::remove(file);
  config.refresh_seconds = 60;
  service.reconfigure(config);
  EXPECT_DOUBLE_EQ(*service.feed().value_at(clock_.unix_ms()), 200.0);
  EXPECT_EQ(service.describe()["carbon"]["refresh_seconds"], 60.0);

  // [carbon] removed: no signal.
  service.reconfigure({});
  EXPECT_EQ(service.feed().in_force(clock_.unix_ms()).state, SignalState::none);
  EXPECT_EQ(service.describe()["carbon"]["state"], "none");
  service.stop();
}

// A real HTTP server on loopback answers as the UK National Grid's API does, then fails.
TEST_F(SignalServiceTest, a_url_is_fetched_off_the_loop_and_an_http_error_keeps_the_last_signal) {
  std::atomic<int> status = 200;
  const std::string body =
      R"({"data": [{"from": "2027-01-15T08:00Z", "to": "2027-01-15T08:30Z", "intensity": {"forecast": 180, "actual": 175}},
                   {"from": "2027-01-15T08:30Z", "to": "2027-01-15T09:00Z", "intensity": {"forecast": 140, "actual": null}}]})";
  std::atomic<int> requests = 0;
  std::string target_seen, key_seen;
  joule::testing::RunningHttpServer server(
      [&](joule::daemon::HttpRequest&& request, const joule::daemon::HttpPeer&, joule::daemon::Reply reply) {
        target_seen = std::string(request.target());
        key_seen = std::string(request["auth-token"]);
        ++requests;
        joule::daemon::HttpResponse response{static_cast<boost::beast::http::status>(status.load()), 11};
        response.body() = status == 200 ? body : "upstream down";
        reply(std::move(response));
      },
      {});
  clock_.set_wall(joule::schedulers::parse_rfc3339("2027-01-15T08:10:00Z").value());
  joule::config::SignalConfig config;
  config.url = "http://127.0.0.1:" + std::to_string(server.port()) + "/intensity/{now}/fw24h";
  config.refresh_seconds = 300;
  config.token_file = dir_.write("key", "s3cret\n");
  config.token_header = "auth-token";  // ElectricityMaps' way
  SignalService service(io_, metrics_, config, joule::config::SignalKind::carbon, clock_);
  service.start();
  const auto wait_for = [&](auto done) {
    for (int i = 0; i < 500 && !done(); ++i) run();
  };
  wait_for([&] { return service.feed().in_force(clock_.unix_ms()).state == SignalState::fresh; });
  EXPECT_EQ(target_seen, "/intensity/2027-01-15T08:10Z/fw24h");           // {now}, to the minute
  EXPECT_DOUBLE_EQ(*service.feed().value_at(clock_.unix_ms()), 175.0);    // the actual where there is one
  EXPECT_EQ(key_seen, "s3cret");

  status = 503;
  clock_.advance(300s);
  wait_for([&] { return service.feed().failures() > 0; });
  EXPECT_NE(service.feed().last_error().find("HTTP 503"), std::string::npos) << service.feed().last_error();
  EXPECT_DOUBLE_EQ(*service.feed().value_at(clock_.unix_ms()), 175.0);
  service.stop();
  EXPECT_EQ(requests.load(), 2);
}

}  // namespace
