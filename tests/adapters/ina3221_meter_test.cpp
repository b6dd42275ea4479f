#include "joule/adapters/ina3221_meter.hpp"

#include <gtest/gtest.h>

#include "../fakes/sysfs_fixtures.hpp"

using joule::ErrorCode;
using joule::adapters::Ina3221Meter;
using joule::adapters::Ina3221Options;
using joule::adapters::kJetsonGpuRails;
using joule::testing::TempDir;
using joule::testing::write_ina3221_hwmon;

namespace {

// A JetPack 5/6 channel: label, bus mV, current mA.
void write_channel(const std::filesystem::path& dir, int ch, const std::string& label, int mv, int ma) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / ("in" + std::to_string(ch) + "_label")) << label << "\n";
  std::ofstream(dir / ("in" + std::to_string(ch) + "_input")) << mv << "\n";
  std::ofstream(dir / ("curr" + std::to_string(ch) + "_input")) << ma << "\n";
}

// Xavier NX under JetPack 5: VDD_IN, VDD_CPU_GPU_CV, VDD_SOC on 0x40 (1-based channels).
std::filesystem::path xavier_nx(const TempDir& root, int hwmon_number) {
  const auto dir = write_ina3221_hwmon(root, "7-0040", hwmon_number);
  write_channel(dir, 1, "VDD_IN", 5000, 1200);  // 6 W
  write_channel(dir, 2, "VDD_CPU_GPU_CV", 5000, 400);
  write_channel(dir, 3, "VDD_SOC", 5000, 300);
  std::ofstream(dir / "in7_input") << "40\n";  // sum of shunt voltages: not a rail
  return dir;
}

// JetPack 4 IIO: zero-based channels, power in mW.
std::filesystem::path nano_jp4(const TempDir& root) {
  const std::string dir = "sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0/";
  const char* rails[] = {"POM_5V_IN", "POM_5V_GPU", "POM_5V_CPU"};
  const int power_mw[] = {2500, 700, 900};
  for (int ch = 0; ch < 3; ++ch) {
    root.write(dir + "rail_name_" + std::to_string(ch), std::string(rails[ch]) + "\n");
    root.write(dir + "in_power" + std::to_string(ch) + "_input", std::to_string(power_mw[ch]) + "\n");
    root.write(dir + "in_voltage" + std::to_string(ch) + "_input", "5000\n");
    root.write(dir + "polling_delay_" + std::to_string(ch), "0 ms\n");
  }
  return root / dir;
}

Ina3221Options options_for(const TempDir& root, double& now) {
  Ina3221Options options;
  options.sys_root = root / "sys";
  options.now_seconds = [&now] { return now; };
  return options;
}

}  // namespace

TEST(Ina3221MeterTest, jp5_meters_the_input_rail_from_millivolts_and_milliamps) {
  TempDir root;
  const auto dir = xavier_nx(root, 3);
  double now = 10.0;
  auto meter = Ina3221Meter::open(options_for(root, now));
  ASSERT_TRUE(meter) << meter.error().message;
  EXPECT_EQ((*meter)->source(), "ina3221");
  EXPECT_EQ((*meter)->rail(), "VDD_IN");
  EXPECT_NE((*meter)->description().find("hwmon ina3221 channel 1"), std::string::npos);
  EXPECT_NEAR((*meter)->read_power()->value, 6.0, 1e-12);
  EXPECT_DOUBLE_EQ((*meter)->read()->value, 0.0);
  std::ofstream(dir / "curr1_input") << "1800\n";  // 9 W
  now = 12.0;
  EXPECT_NEAR((*meter)->read()->value, 15.0, 1e-9);  // (6 + 9) / 2 × 2 s; other rails never added
}

TEST(Ina3221MeterTest, finds_the_hwmon_by_name_whatever_its_number) {
  for (const int number : {0, 2, 7}) {
    TempDir root;
    for (int other = 0; other < 3; ++other) {
      if (other == number) continue;
      root.write("sys/devices/virtual/thermal/hwmon" + std::to_string(other) + "/name", "cpu_thermal\n");
      std::filesystem::create_directories(root / "sys/class/hwmon");
      std::filesystem::create_directory_symlink("../../devices/virtual/thermal/hwmon" + std::to_string(other),
                                                root / ("sys/class/hwmon/hwmon" + std::to_string(other)));
    }
    xavier_nx(root, number);
    double now = 0.0;
    auto meter = Ina3221Meter::open(options_for(root, now));
    ASSERT_TRUE(meter) << "hwmon" << number << ": " << meter.error().message;
    EXPECT_NE((*meter)->description().find("hwmon" + std::to_string(number)), std::string::npos);
  }
}

TEST(Ina3221MeterTest, orin_has_no_input_rail_and_nc_channels_are_skipped) {
  TempDir root;
  const auto first = write_ina3221_hwmon(root, "1-0040", 1);
  write_channel(first, 1, "VDD_GPU_SOC", 5000, 1000);
  write_channel(first, 2, "VDD_CPU_CV", 5000, 500);
  write_channel(first, 3, "VIN_SYS_5V0", 5000, 800);
  const auto second = write_ina3221_hwmon(root, "1-0041", 2);
  write_channel(second, 1, "NC", 0, 0);
  write_channel(second, 2, "VDDQ_VDD2_1V8AO", 5000, 100);
  write_channel(second, 3, "NC", 0, 0);
  double now = 0.0;
  auto options = options_for(root, now);
  auto none = Ina3221Meter::open(options);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, ErrorCode::unavailable);
  EXPECT_NE(none.error().message.find("VDD_IN or POM_5V_IN"), std::string::npos) << none.error().message;
  EXPECT_NE(none.error().message.find("VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0, VDDQ_VDD2_1V8AO)"), std::string::npos)
      << none.error().message;

  options.rails = {"NC"};
  EXPECT_FALSE(Ina3221Meter::open(options));
  options.rails = {"VDDQ_VDD2_1V8AO"};  // a configured rail overrides
  auto configured = Ina3221Meter::open(options);
  ASSERT_TRUE(configured);
  EXPECT_NEAR((*configured)->read_power()->value, 0.5, 1e-12);
  options.rails = kJetsonGpuRails;
  auto gpu = Ina3221Meter::open(options);
  ASSERT_TRUE(gpu);
  EXPECT_EQ((*gpu)->rail(), "VDD_GPU_SOC");
}

TEST(Ina3221MeterTest, jp4_iio_channels_are_zero_based_and_in_milliwatts) {
  TempDir root;
  const auto dir = nano_jp4(root);
  double now = 0.0;
  auto options = options_for(root, now);
  auto meter = Ina3221Meter::open(options);
  ASSERT_TRUE(meter) << meter.error().message;
  EXPECT_EQ((*meter)->rail(), "POM_5V_IN");
  EXPECT_NE((*meter)->description().find("IIO ina3221x channel 0"), std::string::npos);
  EXPECT_DOUBLE_EQ((*meter)->read()->value, 0.0);
  std::ofstream(dir / "in_power0_input") << "3500\n";
  now = 1.0;
  EXPECT_NEAR((*meter)->read()->value, 3.0, 1e-12);

  options.rails = kJetsonGpuRails;
  auto gpu = Ina3221Meter::open(options);
  ASSERT_TRUE(gpu);
  EXPECT_EQ((*gpu)->rail(), "POM_5V_GPU");
  EXPECT_NEAR((*gpu)->read_power()->value, 0.7, 1e-12);  // in_power1_input
}

TEST(Ina3221MeterTest, bad_readings_are_errors_then_integration_resumes) {
  TempDir root;
  const auto dir = xavier_nx(root, 0);
  double now = 0.0;
  auto meter = std::move(Ina3221Meter::open(options_for(root, now))).value();
  ASSERT_TRUE(meter->read());
  std::ofstream(dir / "curr1_input") << "";
  now = 1.0;
  auto empty = meter->read();
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.error().code, ErrorCode::io);
  std::ofstream(dir / "curr1_input") << "n/a\n";
  EXPECT_FALSE(meter->read());
  std::filesystem::remove(dir / "in1_input");
  auto missing = meter->read();
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::unavailable);
  std::ofstream(dir / "in1_input") << "5000\n";
  std::ofstream(dir / "curr1_input") << "1200\n";
  now = 2.0;
  EXPECT_NEAR(meter->read()->value, 12.0, 1e-9);
}

TEST(Ina3221MeterTest, no_ina3221_is_unavailable) {
  TempDir root;
  root.write("sys/class/hwmon/hwmon0/name", "acpitz\n");
  double now = 0.0;
  auto meter = Ina3221Meter::open(options_for(root, now));
  ASSERT_FALSE(meter);
  EXPECT_EQ(meter.error().code, ErrorCode::unavailable);
  EXPECT_NE(meter.error().message.find("no INA3221"), std::string::npos);
}
