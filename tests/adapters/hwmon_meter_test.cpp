#include "joule/adapters/hwmon_meter.hpp"

#include <gtest/gtest.h>

#include "temp_dir.hpp"

using joule::ErrorCode;
using joule::adapters::HwmonMeter;
using joule::adapters::HwmonOptions;
using joule::testing::TempDir;

namespace {

HwmonOptions options_for(const TempDir& root, double& now) {
  HwmonOptions options;
  options.sys_root = root / "sys";
  options.now_seconds = [&now] { return now; };
  return options;
}

// amd_energy (out-of-tree DKMS): per-core counters, then per-socket ones, µJ.
void amd_energy(const TempDir& root, const std::string& hwmon, std::uint64_t socket0_uj, std::uint64_t socket1_uj) {
  const std::string dir = "sys/class/hwmon/" + hwmon + "/";
  root.write(dir + "name", "amd_energy\n");
  root.write(dir + "energy1_label", "Ecore000\n");
  root.write(dir + "energy1_input", "5000000\n");
  root.write(dir + "energy2_label", "Ecore001\n");
  root.write(dir + "energy2_input", "6000000\n");
  root.write(dir + "energy3_label", "Esocket0\n");
  root.write(dir + "energy3_input", std::to_string(socket0_uj) + "\n");
  root.write(dir + "energy4_label", "Esocket1\n");
  root.write(dir + "energy4_input", std::to_string(socket1_uj) + "\n");
}

}  // namespace

TEST(HwmonMeterTest, amd_energy_sums_the_socket_counters_only) {
  TempDir root;
  root.write("sys/class/hwmon/hwmon0/name", "k10temp\n");
  root.write("sys/class/hwmon/hwmon0/temp1_input", "45000\n");
  amd_energy(root, "hwmon3", 10000000, 20000000);
  double now = 0.0;
  auto meter = HwmonMeter::open(options_for(root, now));
  ASSERT_TRUE(meter) << meter.error().message;
  EXPECT_EQ((*meter)->source(), "hwmon");
  EXPECT_NE((*meter)->description().find("energy3_input (Esocket0) + energy4_input (Esocket1)"), std::string::npos)
      << (*meter)->description();
  EXPECT_DOUBLE_EQ((*meter)->read()->value, 0.0);
  amd_energy(root, "hwmon3", 11000000, 22500000);
  EXPECT_NEAR((*meter)->read()->value, 3.5, 1e-9);
  amd_energy(root, "hwmon3", 500000, 22500000);  // socket 0 restarted: 0.5 J since
  EXPECT_NEAR((*meter)->read()->value, 4.0, 1e-9);
}

TEST(HwmonMeterTest, a_configured_label_and_device_name_pick_one_channel) {
  TempDir root;
  amd_energy(root, "hwmon1", 0, 0);
  double now = 0.0;
  auto options = options_for(root, now);
  options.device_name = "amd_energy";
  options.label = "Ecore001";
  auto meter = HwmonMeter::open(options);
  ASSERT_TRUE(meter);
  EXPECT_NE((*meter)->description().find("energy2_input (Ecore001)"), std::string::npos);
  options.label = "Esocket7";
  auto missing = HwmonMeter::open(options);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::unavailable);
  EXPECT_NE(missing.error().message.find("labelled Esocket7"), std::string::npos);
}

TEST(HwmonMeterTest, integrates_microwatts_without_an_energy_channel) {
  TempDir root;
  root.write("sys/class/hwmon/hwmon2/name", "ltc2945\n");
  root.write("sys/class/hwmon/hwmon2/power1_input", "20000000\n");  // 20 W
  root.write("sys/class/hwmon/hwmon2/power2_input", "99000000\n");
  double now = 5.0;
  auto meter = std::move(HwmonMeter::open(options_for(root, now))).value();
  EXPECT_DOUBLE_EQ(meter->read()->value, 0.0);
  root.write("sys/class/hwmon/hwmon2/power1_input", "30000000\n");
  now = 7.0;
  EXPECT_NEAR(meter->read()->value, 50.0, 1e-9);
  root.write("sys/class/hwmon/hwmon2/power1_input", "\n");
  EXPECT_FALSE(meter->read());
}

TEST(HwmonMeterTest, nothing_to_meter_is_unavailable) {
  TempDir root;
  root.write("sys/class/hwmon/hwmon0/name", "acpitz\n");
  double now = 0.0;
  auto meter = HwmonMeter::open(options_for(root, now));
  ASSERT_FALSE(meter);
  EXPECT_EQ(meter.error().code, ErrorCode::unavailable);
}
