#include "joule/adapters/rapl_meter.hpp"

#include <gtest/gtest.h>

#include "../fakes/sysfs_fixtures.hpp"

using joule::ErrorCode;
using joule::adapters::RaplMeter;
using joule::adapters::RaplOptions;
using joule::testing::kIntelDramMaxUj;
using joule::testing::kIntelPackageMaxUj;
using joule::testing::set_rapl_energy;
using joule::testing::TempDir;
using joule::testing::write_boot_id;
using joule::testing::write_rapl_zone;

namespace {

RaplOptions options_for(const TempDir& root) { return RaplOptions{root / "sys", root / "proc"}; }

std::unique_ptr<RaplMeter> open_meter(const TempDir& root) {
  auto meter = RaplMeter::open(options_for(root));
  EXPECT_TRUE(meter) << meter.error().message;
  return meter ? std::move(meter).value() : nullptr;
}

// One package with a counter at `start_uj`, its range `max_uj`, and a boot_id.
std::unique_ptr<RaplMeter> one_package(const TempDir& root, std::uint64_t start_uj,
                                       std::uint64_t max_uj = kIntelPackageMaxUj) {
  write_rapl_zone(root, "intel-rapl:0", "package-0", start_uj, max_uj);
  write_boot_id(root, "0c6e5e0e-6c3a-4a8f-9d43-1d2f7a4f0b11");
  auto meter = open_meter(root);
  EXPECT_DOUBLE_EQ(meter->read()->value, 0.0);
  return meter;
}

}  // namespace

TEST(RaplMeterTest, sums_packages_and_dram_through_class_symlinks_and_skips_mmio_and_core) {
  TempDir root;
  write_rapl_zone(root, "intel-rapl:0", "package-0", 1000000);
  write_rapl_zone(root, "intel-rapl:0:0", "core", 500000);
  write_rapl_zone(root, "intel-rapl:0:1", "uncore", 100000);
  write_rapl_zone(root, "intel-rapl:0:2", "dram", 2000000, kIntelDramMaxUj);
  write_rapl_zone(root, "intel-rapl:1", "package-1", 3000000);
  write_rapl_zone(root, "intel-rapl:2", "psys", 9000000);
  write_rapl_zone(root, "intel-rapl-mmio:0", "package-0", 1000000);
  std::filesystem::create_directory_symlink("../../devices/virtual/powercap/intel-rapl",
                                            root / "sys/class/powercap/intel-rapl");
  write_boot_id(root, "b1");
  auto meter = open_meter(root);
  ASSERT_TRUE(meter);
  EXPECT_EQ(meter->source(), "rapl");
  EXPECT_EQ(meter->description(), "intel-rapl:0 package-0 + intel-rapl:0:2 dram; intel-rapl:1 package-1");
  EXPECT_EQ(meter->boot_id(), "b1");
  EXPECT_DOUBLE_EQ(meter->read()->value, 0.0);

  set_rapl_energy(root, "intel-rapl:0", 2000000);       // +1 J
  set_rapl_energy(root, "intel-rapl:0:0", 900000);      // inside the package: not added
  set_rapl_energy(root, "intel-rapl:0:2", 4000000);     // +2 J
  set_rapl_energy(root, "intel-rapl:1", 6000000);       // +3 J
  set_rapl_energy(root, "intel-rapl:2", 99000000);      // psys: not with packages
  set_rapl_energy(root, "intel-rapl-mmio:0", 9000000);  // duplicate of package-0
  auto reading = meter->read();
  ASSERT_TRUE(reading) << reading.error().message;
  EXPECT_NEAR(reading->value, 6.0, 1e-9);
}

TEST(RaplMeterTest, psys_is_used_only_without_a_package) {
  TempDir root;
  write_rapl_zone(root, "intel-rapl:1", "psys", 5000000);
  auto meter = open_meter(root);
  ASSERT_TRUE(meter);
  EXPECT_EQ(meter->description(), "intel-rapl:1 psys");
  ASSERT_TRUE(meter->read());
  set_rapl_energy(root, "intel-rapl:1", 7500000);
  EXPECT_NEAR(meter->read()->value, 2.5, 1e-9);
}

TEST(RaplMeterTest, wraps_at_max_energy_range) {
  TempDir root;
  auto meter = one_package(root, kIntelPackageMaxUj - 1000);
  set_rapl_energy(root, "intel-rapl:0", 500);  // 1000 µJ to the top, 500 after the wrap
  EXPECT_NEAR(meter->read()->value, 1500e-6, 1e-12);
  set_rapl_energy(root, "intel-rapl:0", 1500);
  EXPECT_NEAR(meter->read()->value, 2500e-6, 1e-12);
}

TEST(RaplMeterTest, wraps_on_the_smaller_amd_range) {
  TempDir root;
  constexpr std::uint64_t kEpyc7543MaxUj = 65532610987ULL;
  auto meter = one_package(root, kEpyc7543MaxUj - 2000000, kEpyc7543MaxUj);
  set_rapl_energy(root, "intel-rapl:0", 3000000);
  EXPECT_NEAR(meter->read()->value, 5.0, 1e-9);
}

TEST(RaplMeterTest, counter_exactly_at_max_and_just_below_is_not_a_wrap) {
  TempDir root;
  auto meter = one_package(root, kIntelPackageMaxUj - 2000);
  set_rapl_energy(root, "intel-rapl:0", kIntelPackageMaxUj - 1);  // just below max: +1999
  EXPECT_NEAR(meter->read()->value, 1999e-6, 1e-12);
  set_rapl_energy(root, "intel-rapl:0", kIntelPackageMaxUj - 1);  // unchanged: +0, not a wrap
  EXPECT_NEAR(meter->read()->value, 1999e-6, 1e-12);
  set_rapl_energy(root, "intel-rapl:0", kIntelPackageMaxUj);  // exactly max: +1
  EXPECT_NEAR(meter->read()->value, 2000e-6, 1e-12);
  set_rapl_energy(root, "intel-rapl:0", 0);  // max -> 0 is the wrap itself: 0 + (max - max)
  EXPECT_NEAR(meter->read()->value, 2000e-6, 1e-12);
  set_rapl_energy(root, "intel-rapl:0", 10);
  EXPECT_NEAR(meter->read()->value, 2010e-6, 1e-12);
}

TEST(RaplMeterTest, boot_id_change_is_a_reset_not_a_wrap) {
  TempDir root;
  auto meter = one_package(root, 50000000);
  set_rapl_energy(root, "intel-rapl:0", 60000000);
  EXPECT_NEAR(meter->read()->value, 10.0, 1e-9);
  // The counter restarted with a new boot: count the 2 J since the restart, not max - 58 J.
  write_boot_id(root, "7f1d2c3b-0000-4000-8000-000000000002");
  set_rapl_energy(root, "intel-rapl:0", 2000000);
  EXPECT_NEAR(meter->read()->value, 12.0, 1e-9);
  EXPECT_EQ(meter->boot_id(), "7f1d2c3b-0000-4000-8000-000000000002");
  set_rapl_energy(root, "intel-rapl:0", 3000000);
  EXPECT_NEAR(meter->read()->value, 13.0, 1e-9);
}

TEST(RaplMeterTest, permission_denied_says_how_to_grant_read_access) {
  TempDir root;
  write_rapl_zone(root, "intel-rapl:0", "package-0", 1000);
  auto options = options_for(root);
  options.reader = joule::testing::denying_reader("energy_uj");
  auto meter = RaplMeter::open(options);  // name and max_energy_range_uj are world-readable
  ASSERT_TRUE(meter) << meter.error().message;
  auto reading = (*meter)->read();
  ASSERT_FALSE(reading);
  EXPECT_EQ(reading.error().code, ErrorCode::permission_denied);
  const std::string& message = reading.error().message;
  EXPECT_NE(message.find("intel-rapl:0/energy_uj: permission denied"), std::string::npos) << message;
  EXPECT_NE(message.find("chmod o+r"), std::string::npos) << message;
  EXPECT_NE(message.find("udev"), std::string::npos) << message;
  EXPECT_NE(message.find("CAP_DAC_READ_SEARCH"), std::string::npos) << message;
}

TEST(RaplMeterTest, bad_counter_content_is_an_error_and_keeps_the_baseline) {
  TempDir root;
  auto meter = one_package(root, 1000000);
  root.write("sys/class/powercap/intel-rapl:0/energy_uj", "");
  auto empty = meter->read();
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.error().code, ErrorCode::io);
  EXPECT_NE(empty.error().message.find("empty"), std::string::npos);
  root.write("sys/class/powercap/intel-rapl:0/energy_uj", "12ab\n");
  EXPECT_FALSE(meter->read());
  set_rapl_energy(root, "intel-rapl:0", kIntelPackageMaxUj + 1);  // above the range: not a reading
  EXPECT_FALSE(meter->read());
  std::filesystem::remove(root / "sys/class/powercap/intel-rapl:0/energy_uj");
  auto missing = meter->read();
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::unavailable);
  set_rapl_energy(root, "intel-rapl:0", 4000000);
  EXPECT_NEAR(meter->read()->value, 3.0, 1e-9);
}

TEST(RaplMeterTest, missing_tree_or_range_fails_to_open) {
  TempDir root;
  auto none = RaplMeter::open(options_for(root));
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, ErrorCode::unavailable);
  EXPECT_NE(none.error().message.find("powercap"), std::string::npos);

  write_rapl_zone(root, "intel-rapl-mmio:0", "package-0", 1000);  // mmio alone is not a meter
  EXPECT_FALSE(RaplMeter::open(options_for(root)));

  write_rapl_zone(root, "intel-rapl:0", "package-0", 1000);
  root.write("sys/class/powercap/intel-rapl:0/max_energy_range_uj", "\n");
  auto no_range = RaplMeter::open(options_for(root));
  ASSERT_FALSE(no_range);
  EXPECT_NE(no_range.error().message.find("max_energy_range_uj"), std::string::npos);
}

TEST(RaplMeterTest, works_without_a_boot_id) {
  TempDir root;
  write_rapl_zone(root, "intel-rapl:0", "package-0", 100);
  auto meter = open_meter(root);
  ASSERT_TRUE(meter);
  EXPECT_EQ(meter->boot_id(), "");
  ASSERT_TRUE(meter->read());
  set_rapl_energy(root, "intel-rapl:0", 1000100);
  EXPECT_NEAR(meter->read()->value, 1.0, 1e-9);
}
