#include "joule/adapters/meter_selection.hpp"
#include "joule/adapters/mig_meter.hpp"

#include <gtest/gtest.h>

#include <cstdlib>

#include "../fakes/sysfs_fixtures.hpp"

using joule::ErrorCode;
using joule::adapters::MeterRequest;
using joule::adapters::MeterRoots;
using joule::adapters::ModelledCpuMeter;
using joule::adapters::ProcessModelledMeter;
using joule::adapters::select_meter;
using joule::testing::TempDir;

namespace {

// Fixture roots with no meter at all but a /proc/stat for the model, and no NVML.
MeterRoots bare(const TempDir& root) {
  root.write("proc/stat", "cpu  100 0 50 1000 0 0 0 0 0 0\ncpu0 100 0 50 1000 0 0 0 0 0 0\n");
  MeterRoots roots;
  roots.sys = root / "sys";
  roots.proc = root / "proc";
  roots.nvml_library = (root / "no-libnvidia-ml.so.1").string();
  return roots;
}

MeterRequest request(std::string device, std::string meter = "auto") {
  MeterRequest r;
  r.device = std::move(device);
  r.meter = std::move(meter);
  return r;
}

std::string sources(const joule::adapters::SelectedMeter& selected) {
  std::string text;
  for (const auto& c : selected.considered) text += c.source + (c.taken ? "+ " : "- ");
  return text;
}

// Points the fake NVML at a script for one test.
struct FakeNvml {
  explicit FakeNvml(const TempDir& dir, const std::string& script) {
    ::setenv("JOULE_FAKE_NVML_SCRIPT", dir.write("nvml.script", script).c_str(), 1);
  }
  ~FakeNvml() { ::unsetenv("JOULE_FAKE_NVML_SCRIPT"); }
};

}  // namespace

TEST(MeterSelectionTest, cpu_takes_readable_rapl_first) {
  TempDir root;
  auto roots = bare(root);
  joule::testing::write_rapl_zone(root, "intel-rapl:0", "package-0", 1000);
  auto selected = select_meter(request("cpu"), roots);
  ASSERT_TRUE(selected) << selected.error().message;
  EXPECT_EQ(selected->meter->source(), "rapl");
  EXPECT_EQ(sources(*selected), "rapl+ ");
  EXPECT_EQ(selected->considered[0].reason, "intel-rapl:0 package-0");
}

TEST(MeterSelectionTest, unreadable_rapl_is_passed_over_with_how_to_grant_access) {
  TempDir root;
  auto roots = bare(root);
  joule::testing::write_rapl_zone(root, "intel-rapl:0", "package-0", 1000);
  roots.reader = joule::testing::denying_reader("energy_uj");
  auto selected = select_meter(request("cpu"), roots);
  ASSERT_TRUE(selected) << selected.error().message;
  EXPECT_EQ(sources(*selected), "rapl- ina3221- battery- modelled+ ");
  EXPECT_NE(selected->considered[0].reason.find("energy_uj: permission denied"), std::string::npos);
  EXPECT_NE(selected->considered[0].reason.find("chmod o+r"), std::string::npos);
  EXPECT_NE(selected->considered[3].reason.find("not a measurement"), std::string::npos);
  EXPECT_NE(dynamic_cast<ModelledCpuMeter*>(selected->meter.get()), nullptr);
}

TEST(MeterSelectionTest, forced_rapl_that_cannot_be_read_fails_with_its_code) {
  TempDir root;
  auto roots = bare(root);
  joule::testing::write_rapl_zone(root, "intel-rapl:0", "package-0", 1000);
  roots.reader = joule::testing::denying_reader("energy_uj");
  auto selected = select_meter(request("cpu", "rapl"), roots);
  ASSERT_FALSE(selected);
  EXPECT_EQ(selected.error().code, ErrorCode::permission_denied);
  EXPECT_NE(selected.error().message.find("no meter for cpu: rapl: "), std::string::npos);
}

TEST(MeterSelectionTest, jetson_cpu_uses_the_input_rail_or_a_configured_one) {
  TempDir root;
  auto roots = bare(root);
  const auto dir = joule::testing::write_ina3221_hwmon(root, "1-0040", 4);
  root.write("sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon4/in1_label", "POM_5V_IN\n");
  root.write("sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon4/in1_input", "5000\n");
  root.write("sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon4/curr1_input", "900\n");
  root.write("sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon4/in2_label", "POM_5V_GPU\n");
  root.write("sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon4/in2_input", "5000\n");
  root.write("sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon4/curr2_input", "100\n");
  auto cpu = select_meter(request("cpu"), roots);
  ASSERT_TRUE(cpu) << cpu.error().message;
  EXPECT_EQ(sources(*cpu), "rapl- ina3221+ ");
  EXPECT_NE(cpu->considered[1].reason.find("POM_5V_IN"), std::string::npos);

  // No NVML on a Jetson: cuda:0 falls to the GPU rail.
  auto gpu = select_meter(request("cuda:0"), roots);
  ASSERT_TRUE(gpu) << gpu.error().message;
  EXPECT_EQ(sources(*gpu), "nvml- ina3221+ ");
  EXPECT_NE(gpu->considered[1].reason.find("POM_5V_GPU"), std::string::npos);

  auto configured = request("cpu", "ina3221");
  configured.rail = "POM_5V_GPU";
  auto forced = select_meter(configured, roots);
  ASSERT_TRUE(forced);
  EXPECT_NE(forced->considered[0].reason.find("POM_5V_GPU"), std::string::npos);
}

TEST(MeterSelectionTest, laptop_cpu_uses_the_battery_when_discharging) {
  TempDir root;
  auto roots = bare(root);
  root.write("sys/class/power_supply/BAT0/type", "Battery\n");
  root.write("sys/class/power_supply/BAT0/status", "Discharging\n");
  root.write("sys/class/power_supply/BAT0/energy_now", "40000000\n");
  auto selected = select_meter(request("cpu"), roots);
  ASSERT_TRUE(selected);
  EXPECT_EQ(sources(*selected), "rapl- ina3221- battery+ ");
  root.write("sys/class/power_supply/BAT0/status", "Charging\n");  // first read fails: passed over
  selected = select_meter(request("cpu"), roots);
  ASSERT_TRUE(selected);
  EXPECT_EQ(sources(*selected), "rapl- ina3221- battery- modelled+ ");
  EXPECT_NE(selected->considered[2].reason.find("charging"), std::string::npos);
}

TEST(MeterSelectionTest, process_scope_gives_the_process_modelled_meter) {
  TempDir root;
  auto roots = bare(root);
  double cpu = 0.0, wall = 0.0;
  roots.process_cpu_seconds = [&] { return cpu; };
  roots.monotonic_seconds = [&] { return wall; };
  auto r = request("cpu", "modelled");
  r.scope = "process";
  r.modelled = {2.0, 10.0};
  auto selected = select_meter(r, roots);
  ASSERT_TRUE(selected) << selected.error().message;
  ASSERT_NE(dynamic_cast<ProcessModelledMeter*>(selected->meter.get()), nullptr);
  EXPECT_NE(selected->considered[0].reason.find("this process"), std::string::npos);
  cpu = 0.25;
  wall = 1.0;
  EXPECT_NEAR(selected->meter->read()->value, 2.0 + 2.5, 1e-12);

  r.scope = "device";
  selected = select_meter(r, roots);
  ASSERT_TRUE(selected);
  EXPECT_NE(dynamic_cast<ModelledCpuMeter*>(selected->meter.get()), nullptr);
}

TEST(MeterSelectionTest, gpu_takes_nvml) {
  TempDir root;
  FakeNvml nvml(root, "devices 2\nname NVIDIA A100-SXM4-40GB\nenergy_mj 100 200\n");
  auto roots = bare(root);
  roots.nvml_library = JOULE_FAKE_NVML;
  auto selected = select_meter(request("cuda:1"), roots);
  ASSERT_TRUE(selected) << selected.error().message;
  EXPECT_EQ(sources(*selected), "nvml+ ");
  EXPECT_EQ(selected->considered[0].reason, "GPU 1 NVIDIA A100-SXM4-40GB, total energy counter");
  EXPECT_FALSE(select_meter(request("cuda:2"), roots));
}

TEST(MeterSelectionTest, gpu_without_a_meter_fails_listing_every_candidate) {
  TempDir root;
  FakeNvml nvml(root, "init 9\n");
  auto roots = bare(root);
  roots.nvml_library = JOULE_FAKE_NVML;
  auto selected = select_meter(request("cuda:0"), roots);
  ASSERT_FALSE(selected);
  EXPECT_EQ(selected.error().code, ErrorCode::unavailable);
  const std::string& message = selected.error().message;
  EXPECT_NE(message.find("no meter for cuda:0: nvml: "), std::string::npos) << message;
  EXPECT_NE(message.find("Driver Not Loaded"), std::string::npos) << message;
  EXPECT_NE(message.find("; ina3221: no INA3221"), std::string::npos) << message;
}

TEST(MeterSelectionTest, rejects_unknown_devices_meters_scopes_and_mismatches) {
  TempDir root;
  auto roots = bare(root);
  EXPECT_EQ(select_meter(request("tpu:0"), roots).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(select_meter(request("cuda:x"), roots).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(select_meter(request("cpu", "likwid"), roots).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(select_meter(request("cpu", "nvml"), roots).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(select_meter(request("cuda:0", "rapl"), roots).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(select_meter(request("cuda:0", "modelled"), roots).error().code, ErrorCode::invalid_argument);
  auto bad_scope = request("cpu");
  bad_scope.scope = "node";
  EXPECT_EQ(select_meter(bad_scope, roots).error().code, ErrorCode::invalid_argument);
}

TEST(MeterSelectionTest, forced_hwmon_is_tried_alone) {
  TempDir root;
  auto roots = bare(root);
  root.write("sys/class/hwmon/hwmon0/name", "ltc2945\n");
  root.write("sys/class/hwmon/hwmon0/power1_input", "1000000\n");
  auto selected = select_meter(request("cpu", "hwmon"), roots);
  ASSERT_TRUE(selected) << selected.error().message;
  EXPECT_EQ(sources(*selected), "hwmon+ ");
  EXPECT_EQ(selected->meter->source(), "hwmon");
}

// A MIG device is metered by its share of its GPU's counter; its siblings, selected with the same
// roots, share one partition; a probe (scope "process") reads the GPU's counter whole; a GPU in
// MIG mode named whole is refused, naming its MIG devices.
TEST(MeterSelectionTest, mig_devices_share_their_gpus_counter_and_a_whole_gpu_in_mig_mode_is_refused) {
  TempDir root;
  FakeNvml nvml(root, "name NVIDIA A100-SXM4-40GB\nmig 0 3g.20gb 3g.20gb\nenergy_mj 0 1000 2000 3000 4000 5000\n");
  auto roots = bare(root);
  roots.nvml_library = JOULE_FAKE_NVML;
  roots.mig_partitions = std::make_shared<joule::adapters::MigPartitions>();
  auto first = select_meter(request("mig:0.0"), roots);
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_EQ(sources(*first), "nvml+ ");
  EXPECT_NE(first->considered[0].reason.find("its share of GPU 0's energy counter"), std::string::npos)
      << first->considered[0].reason;
  auto second = select_meter(request("mig:0.1"), roots);
  ASSERT_TRUE(second) << second.error().message;
  first->meter->shared_gpu_counter()->set_busy(true);
  EXPECT_TRUE(second->meter->shared_gpu_counter()->others_busy()) << "one partition for the GPU";

  auto probe = request("mig:0.1");
  probe.scope = "process";
  auto whole = select_meter(probe, roots);
  ASSERT_TRUE(whole) << whole.error().message;
  EXPECT_NE(whole->considered[0].reason.find("whole, for mig:0.1 while the GPU's other MIG devices have no work"),
            std::string::npos)
      << whole->considered[0].reason;

  const auto gpu = select_meter(request("cuda:0"), roots);
  ASSERT_FALSE(gpu);
  EXPECT_NE(gpu.error().message.find("GPU 0 is in MIG mode: a job cannot use it whole; name its MIG devices as "
                                     "devices instead: mig:0.0 (NVIDIA A100-SXM4-40GB MIG 3g.20gb), mig:0.1"),
            std::string::npos)
      << gpu.error().message;
  EXPECT_EQ(select_meter(request("mig:0.7"), roots).error().code, ErrorCode::unavailable);
  EXPECT_EQ(select_meter(request("mig:0.1", "ina3221"), roots).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(select_meter(request("mig:0"), roots).error().code, ErrorCode::invalid_argument);
}
