// A measurement window on a real RAPL meter over a powercap tree in a temp dir: the counter
// files are the boundary, in the kernel's format (microjoules, wrapping at max_energy_range_uj).

#include "joule/adapters/measurement_window.hpp"

#include <gtest/gtest.h>

#include "../fakes/sysfs_fixtures.hpp"
#include "joule/adapters/rapl_meter.hpp"

using joule::adapters::MeasurementWindow;
using joule::adapters::RaplMeter;
using joule::adapters::RaplOptions;
using joule::testing::set_rapl_energy;
using joule::testing::TempDir;
using namespace std::chrono_literals;

namespace {

constexpr std::uint64_t kMaxUj = 262'143'328'850;

std::unique_ptr<RaplMeter> package_at(const TempDir& root, std::uint64_t start_uj) {
  joule::testing::write_rapl_zone(root, "intel-rapl:0", "package-0", start_uj, kMaxUj);
  joule::testing::write_boot_id(root, "0c6e5e0e-6c3a-4a8f-9d43-1d2f7a4f0b11");
  auto meter = RaplMeter::open(RaplOptions{root / "sys", root / "proc"});
  EXPECT_TRUE(meter) << meter.error().message;
  EXPECT_DOUBLE_EQ((*meter)->read()->value, 0.0);  // a meter counts from its first reading
  return std::move(meter).value();
}

const MeasurementWindow::TimePoint kStart{std::chrono::seconds(1000)};

}  // namespace

TEST(MeasurementWindowTest, a_window_holds_the_joules_and_seconds_since_it_began_with_the_meters_source) {
  TempDir root;
  auto meter = package_at(root, 5'000'000);
  set_rapl_energy(root, "intel-rapl:0", 7'000'000);  // used before the window: not counted
  auto window = MeasurementWindow::begin(*meter, kStart);
  ASSERT_TRUE(window) << window.error().message;
  set_rapl_energy(root, "intel-rapl:0", 19'500'000);  // 12.5 J in the window
  const auto measured = window->read(*meter, kStart + 5s);
  ASSERT_TRUE(measured) << measured.error().message;
  EXPECT_DOUBLE_EQ(measured->joules, 12.5);
  EXPECT_DOUBLE_EQ(measured->seconds, 5.0);
  EXPECT_DOUBLE_EQ(measured->mean_watts(), 2.5);
  EXPECT_EQ(measured->source, "rapl");
  EXPECT_TRUE(measured->is_measurement());
  EXPECT_FALSE(measured->partial);
}

TEST(MeasurementWindowTest, a_window_spans_the_counters_wrap) {
  TempDir root;
  auto meter = package_at(root, kMaxUj - 1'000'000);
  auto window = MeasurementWindow::begin(*meter, kStart, /*partial=*/true);
  ASSERT_TRUE(window);
  set_rapl_energy(root, "intel-rapl:0", 2'000'000);  // 1 J to the wrap, 2 J after it
  const auto measured = window->read(*meter, kStart + 1s);
  ASSERT_TRUE(measured);
  EXPECT_NEAR(measured->joules, 3.0, 1e-6);
  EXPECT_TRUE(measured->partial) << "adopted mid-run: a lower bound";
}

TEST(MeasurementWindowTest, a_sample_taken_for_something_else_is_read_without_a_second_read) {
  TempDir root;
  auto meter = package_at(root, 0);
  set_rapl_energy(root, "intel-rapl:0", 4'000'000);
  auto window = MeasurementWindow::begin(*meter, kStart);
  ASSERT_TRUE(window);
  // The device's periodic sample read 10 J on the meter's counter: the window takes 6 of them.
  EXPECT_DOUBLE_EQ(window->at(10.0, kStart + 2s).joules, 6.0);
  // A counter behind the window's start (a meter reopened) is nothing, not negative energy.
  EXPECT_DOUBLE_EQ(window->at(1.0, kStart + 3s).joules, 0.0);
}

TEST(MeasurementWindowTest, a_meter_that_cannot_be_read_opens_no_window) {
  TempDir root;
  auto meter = package_at(root, 0);
  std::filesystem::remove(root / "sys/class/powercap/intel-rapl:0/energy_uj");
  const auto window = MeasurementWindow::begin(*meter, kStart);
  ASSERT_FALSE(window);
  EXPECT_NE(window.error().message.find("energy_uj"), std::string::npos) << window.error().message;
}
