// The coordinator's leases on a manual clock: they run on monotonic time, so setting the wall
// clock forward or back loses no node, and a node silent past its lease is lost.

#include "joule/daemon/cluster_service.hpp"

#include <gtest/gtest.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "joule/adapters/storage_writer.hpp"
#include "joule/cluster/sync.hpp"
#include "joule/common/clock.hpp"
#include "joule/daemon/model_service.hpp"
#include "temp_dir.hpp"

using joule::daemon::ClusterCoordinator;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

class ClusterCoordinatorTest : public ::testing::Test {
 protected:
  ClusterCoordinatorTest()
      : writer_(std::move(joule::adapters::Database::open(dir_ / "jouled.db")).value()),
        jobs_(io_, writer_, metrics_, device_table_, options(), {}, clock_),
        models_(io_, writer_, metrics_, [] {}),
        coordinator_(io_, jobs_, device_table_, models_, metrics_, joule::daemon::CoordinatorOptions{0.2, 1.0},
                     clock_) {
    EXPECT_TRUE(jobs_.recover({}, {}));
    coordinator_.start();
  }
  ~ClusterCoordinatorTest() override { coordinator_.stop(); }

  joule::daemon::JobServiceOptions options() const {
    joule::daemon::JobServiceOptions o;
    o.state_directory = dir_.path();
    o.node_name = "coord";
    return o;
  }

  // Runs the loop for `real` time: the lease check is a real timer (every tenth of the lease).
  void run_for(std::chrono::milliseconds real) {
    auto busy = boost::asio::make_work_guard(io_);
    io_.run_for(real);
    io_.restart();
  }

  void sync(const std::string& node) {
    joule::cluster::SyncRequest request;
    request.node = node;
    request.incarnation = "first";
    request.version = "test";
    joule::cluster::ReportedDevice device;
    device.name = "cpu";
    device.source = "rapl";
    request.devices = {device};
    bool answered = false;
    coordinator_.sync(joule::cluster::to_json(request), [&](joule::Result<json> reply) {
      EXPECT_TRUE(reply) << reply.error().message;
      answered = true;
    });
    EXPECT_TRUE(answered);
  }

  std::string state_of(const std::string& node) const {
    const json nodes = coordinator_.nodes(500);
    for (const auto& entry : nodes["nodes"])
      if (entry["name"] == node) return entry["state"];
    return "unknown";
  }

  joule::testing::TempDir dir_;
  joule::ManualClock clock_{1'900'000'000'000};
  boost::asio::io_context io_;
  joule::adapters::StorageWriter writer_;
  joule::daemon::Metrics metrics_;
  joule::daemon::DeviceTable device_table_;  // the agents' devices, as the coordinator hears of them
  joule::daemon::JobService jobs_;
  joule::daemon::ModelService models_;
  ClusterCoordinator coordinator_;
};

}  // namespace

TEST_F(ClusterCoordinatorTest, leases_run_on_monotonic_time_whatever_the_wall_clock_does) {
  sync("a");
  EXPECT_EQ(state_of("a"), "ready");
  clock_.set_wall(clock_.unix_ms() + 3'600'000);  // an hour forward
  run_for(300ms);
  EXPECT_EQ(state_of("a"), "ready");
  clock_.set_wall(clock_.unix_ms() - 7'200'000);  // two hours back
  run_for(300ms);
  EXPECT_EQ(state_of("a"), "ready");
  // Shown in wall time all the same: heard from just now, by the wall clock as it is now.
  const json node = coordinator_.nodes(500)["nodes"][0];
  EXPECT_EQ(node["seconds_since_heartbeat"], 0.0);
  EXPECT_EQ(node["last_heartbeat"], joule::schedulers::format_rfc3339(clock_.unix_ms()));

  clock_.advance(900ms);  // within the lease (1 s)
  run_for(300ms);
  EXPECT_EQ(state_of("a"), "ready");
  clock_.advance(200ms);  // past it
  run_for(300ms);
  EXPECT_EQ(state_of("a"), "lost");
  sync("a");  // back
  EXPECT_EQ(state_of("a"), "ready");
}
