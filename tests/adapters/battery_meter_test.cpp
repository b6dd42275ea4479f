#include "joule/adapters/battery_meter.hpp"

#include <gtest/gtest.h>

#include "temp_dir.hpp"

using joule::ErrorCode;
using joule::adapters::BatteryMeter;
using joule::adapters::BatteryOptions;
using joule::testing::TempDir;

namespace {

// A supply as ACPI lays it out: the class entry links to the device directory.
std::string supply(const TempDir& root, const std::string& name, const std::string& type) {
  const std::string relative = "devices/LNXSYSTM:00/LNXSYBUS:00/PNP0C0A:00/power_supply/" + name;
  root.write("sys/" + relative + "/type", type + "\n");
  std::filesystem::create_directories(root / "sys/class/power_supply");
  std::filesystem::create_directory_symlink("../../" + relative, root / ("sys/class/power_supply/" + name));
  return "sys/class/power_supply/" + name + "/";
}

BatteryOptions options_for(const TempDir& root, double& now) {
  BatteryOptions options;
  options.sys_root = root / "sys";
  options.now_seconds = [&now] { return now; };
  return options;
}

// A laptop on battery: AC offline, BAT0 with energy_now.
std::string laptop(const TempDir& root) {
  const std::string ac = supply(root, "AC", "Mains");
  root.write(ac + "online", "0\n");
  const std::string bat = supply(root, "BAT0", "Battery");
  root.write(bat + "status", "Discharging\n");
  root.write(bat + "energy_now", "50000000\n");
  root.write(bat + "energy_full", "57000000\n");
  root.write(bat + "power_now", "9000000\n");
  root.write(bat + "capacity", "87\n");
  return bat;
}

}  // namespace

TEST(BatteryMeterTest, consumption_is_the_decrease_of_energy_now) {
  TempDir root;
  const std::string bat = laptop(root);
  double now = 0.0;
  auto meter = BatteryMeter::open(options_for(root, now));
  ASSERT_TRUE(meter) << meter.error().message;
  EXPECT_EQ((*meter)->source(), "battery");
  EXPECT_EQ((*meter)->description(), "BAT0 energy_now");
  EXPECT_DOUBLE_EQ((*meter)->read()->value, 0.0);
  root.write(bat + "energy_now", "49999000\n");  // 1000 µWh = 3.6 J
  EXPECT_NEAR((*meter)->read()->value, 3.6, 1e-9);
  EXPECT_DOUBLE_EQ(*(*meter)->capacity_percent(), 87.0);
}

TEST(BatteryMeterTest, charging_is_an_error_not_a_figure) {
  TempDir root;
  const std::string bat = laptop(root);
  double now = 0.0;
  auto meter = std::move(BatteryMeter::open(options_for(root, now))).value();
  ASSERT_TRUE(meter->read());
  root.write(bat + "status", "Charging\n");
  root.write(bat + "energy_now", "52000000\n");
  auto charging = meter->read();
  ASSERT_FALSE(charging);
  EXPECT_EQ(charging.error().code, ErrorCode::unavailable);
  EXPECT_NE(charging.error().message.find("BAT0 is charging"), std::string::npos);
  // Discharging again: a new baseline, the charge is not counted either way.
  root.write(bat + "status", "Discharging\n");
  EXPECT_DOUBLE_EQ(meter->read()->value, 0.0);
  root.write(bat + "energy_now", "51999000\n");
  EXPECT_NEAR(meter->read()->value, 3.6, 1e-9);
}

TEST(BatteryMeterTest, full_or_not_charging_on_ac_cannot_measure) {
  TempDir root;
  const std::string bat = laptop(root);
  double now = 0.0;
  auto meter = std::move(BatteryMeter::open(options_for(root, now))).value();
  for (const char* status : {"Full", "Not charging"}) {
    root.write(bat + "status", std::string(status) + "\n");
    auto reading = meter->read();
    ASSERT_FALSE(reading);
    EXPECT_NE(reading.error().message.find(std::string("BAT0: ") + status), std::string::npos);
    EXPECT_NE(reading.error().message.find("external power"), std::string::npos);
  }
}

TEST(BatteryMeterTest, integrates_power_now_without_energy_now) {
  TempDir root;
  const std::string bat = supply(root, "BAT1", "Battery");
  root.write(bat + "status", "Discharging\n");
  root.write(bat + "power_now", "10000000\n");  // 10 W
  double now = 100.0;
  auto meter = std::move(BatteryMeter::open(options_for(root, now))).value();
  EXPECT_EQ(meter->description(), "BAT1 power_now integrated");
  EXPECT_DOUBLE_EQ(meter->read()->value, 0.0);
  root.write(bat + "power_now", "12000000\n");
  now = 110.0;
  EXPECT_NEAR(meter->read()->value, 110.0, 1e-9);
}

TEST(BatteryMeterTest, integrates_voltage_times_current_of_either_sign) {
  TempDir root;
  const std::string bat = supply(root, "battery", "Battery");
  root.write(bat + "status", "Discharging\n");
  root.write(bat + "voltage_now", "12000000\n");  // 12 V
  root.write(bat + "current_now", "-1000000\n");  // 1 A, signed negative by this driver
  root.write(bat + "charge_now", "3000000\n");
  double now = 0.0;
  auto meter = std::move(BatteryMeter::open(options_for(root, now))).value();
  ASSERT_TRUE(meter->read());
  now = 5.0;
  EXPECT_NEAR(meter->read()->value, 60.0, 1e-9);
  root.write(bat + "current_now", "\n");
  EXPECT_FALSE(meter->read());
}

TEST(BatteryMeterTest, two_batteries_add_up) {
  TempDir root;
  const std::string bat0 = laptop(root);
  const std::string bat1 = supply(root, "BAT1", "Battery");
  root.write(bat1 + "status", "Unknown\n");
  root.write(bat1 + "energy_now", "20000000\n");
  root.write(bat1 + "capacity", "43\n");
  double now = 0.0;
  auto meter = std::move(BatteryMeter::open(options_for(root, now))).value();
  EXPECT_EQ(meter->description(), "BAT0 energy_now + BAT1 energy_now");
  ASSERT_TRUE(meter->read());
  root.write(bat0 + "energy_now", "49000000\n");
  root.write(bat0 + "status", "Unknown\n");
  root.write(bat1 + "status", "Discharging\n");
  root.write(bat1 + "energy_now", "19000000\n");
  EXPECT_NEAR(meter->read()->value, 7200.0, 1e-6);
  EXPECT_DOUBLE_EQ(*meter->capacity_percent(), 65.0);
}

TEST(BatteryMeterTest, no_usable_battery_is_unavailable) {
  TempDir root;
  double now = 0.0;
  supply(root, "AC", "Mains");
  auto none = BatteryMeter::open(options_for(root, now));
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, ErrorCode::unavailable);
  const std::string bat = supply(root, "BAT0", "Battery");
  root.write(bat + "charge_now", "3000000\n");
  auto unreadable = BatteryMeter::open(options_for(root, now));
  ASSERT_FALSE(unreadable);
  EXPECT_NE(unreadable.error().message.find("no energy_now"), std::string::npos);
}
