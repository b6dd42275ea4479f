#include "joule/adapters/nvml_meter.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "joule/adapters/job_controls.hpp"
#include "joule/adapters/mig_meter.hpp"
#include "joule/adapters/nvml_library.hpp"
#include "joule/adapters/simulated_meter.hpp"
#include "temp_dir.hpp"

using joule::ErrorCode;
using joule::adapters::NvmlLibrary;
using joule::adapters::NvmlMeter;
using joule::testing::TempDir;

namespace {

// Points the fake libnvidia-ml (tests/fakes/fake_nvml.cpp) at a script for one test.
class FakeNvmlScript {
 public:
  explicit FakeNvmlScript(const std::string& text) {
    const std::string script = text + "log " + log().string() + "\n";
    ::setenv("JOULE_FAKE_NVML_SCRIPT", dir_.write("nvml.script", script).c_str(), 1);
  }
  ~FakeNvmlScript() { ::unsetenv("JOULE_FAKE_NVML_SCRIPT"); }
  std::filesystem::path log() const { return dir_ / "nvml.log"; }
  std::string log_text() const {
    std::ostringstream text;
    text << std::ifstream(log()).rdbuf();
    return text.str();
  }

 private:
  TempDir dir_;
};

std::shared_ptr<NvmlLibrary> open_fake() {
  auto library = NvmlLibrary::open(JOULE_FAKE_NVML);
  EXPECT_TRUE(library) << library.error().message;
  return library ? *library : nullptr;
}

std::unique_ptr<NvmlMeter> open_gpu(
    unsigned index, joule::adapters::SecondsClock clock = [] { return 0.0; }) {
  auto meter = NvmlMeter::open(open_fake(), index, std::move(clock));
  EXPECT_TRUE(meter) << meter.error().message;
  return meter ? std::move(meter).value() : nullptr;
}

}  // namespace

TEST(NvmlLibraryTest, missing_library_is_unavailable) {
  auto library = NvmlLibrary::open("/nonexistent/libnvidia-ml.so.1");
  ASSERT_FALSE(library);
  EXPECT_EQ(library.error().code, ErrorCode::unavailable);
  EXPECT_NE(library.error().message.find("/nonexistent/libnvidia-ml.so.1"), std::string::npos);
}

TEST(NvmlLibraryTest, init_failure_names_the_nvml_error) {
  FakeNvmlScript script("init 9\n");
  auto library = NvmlLibrary::open(JOULE_FAKE_NVML);
  ASSERT_FALSE(library);
  EXPECT_EQ(library.error().code, ErrorCode::unavailable);
  EXPECT_NE(library.error().message.find("nvmlInit_v2 failed: Driver Not Loaded"), std::string::npos)
      << library.error().message;
}

TEST(NvmlLibraryTest, shuts_nvml_down_when_the_last_user_lets_go) {
  FakeNvmlScript script("");
  auto library = open_fake();
  ASSERT_TRUE(library);
  auto meter = std::move(NvmlMeter::open(library, 0)).value();
  library.reset();
  EXPECT_EQ(script.log_text(), "init\n");  // the meter still holds the library
  meter.reset();
  EXPECT_EQ(script.log_text(), "init\nshutdown\n");
}

TEST(NvmlLibraryTest, device_names_and_bad_indices) {
  FakeNvmlScript script("devices 3\nname NVIDIA A100-SXM4-40GB\nname_of 2 NVIDIA L4\n");
  auto library = open_fake();
  ASSERT_TRUE(library);
  auto gpu1 = library->device(1);
  ASSERT_TRUE(gpu1);
  EXPECT_EQ(*library->name(*gpu1), "NVIDIA A100-SXM4-40GB");  // identical GPUs share a name
  EXPECT_EQ(*library->name(*library->device(2)), "NVIDIA L4");
  auto gpu2 = library->device(3);
  ASSERT_FALSE(gpu2);
  EXPECT_EQ(gpu2.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(gpu2.error().message.find("Invalid Argument"), std::string::npos);
  EXPECT_FALSE(NvmlMeter::open(library, 5));
}

TEST(NvmlLibraryTest, gets_and_sets_the_power_limit_within_its_constraints) {
  FakeNvmlScript script("limit_mw 250000\nlimit_constraints_mw 100000 300000\n");
  auto library = open_fake();
  ASSERT_TRUE(library);
  auto gpu = *library->device(0);
  EXPECT_EQ(*library->power_limit_mw(gpu), 250000U);
  auto constraints = library->power_limit_constraints(gpu);
  ASSERT_TRUE(constraints);
  EXPECT_EQ(constraints->min_mw, 100000U);
  EXPECT_EQ(constraints->max_mw, 300000U);
  ASSERT_TRUE(library->set_power_limit_mw(gpu, 200000));
  EXPECT_EQ(*library->power_limit_mw(gpu), 200000U);
  EXPECT_NE(script.log_text().find("set_limit 200000"), std::string::npos);
  auto too_low = library->set_power_limit_mw(gpu, 50000);
  ASSERT_FALSE(too_low);
  EXPECT_EQ(too_low.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(*library->power_limit_mw(gpu), 200000U);
}

TEST(NvmlLibraryTest, setting_the_limit_without_root_is_permission_denied) {
  FakeNvmlScript script("set_limit_return 4\n");
  auto library = open_fake();
  ASSERT_TRUE(library);
  auto denied = library->set_power_limit_mw(*library->device(0), 200000);
  ASSERT_FALSE(denied);
  EXPECT_EQ(denied.error().code, ErrorCode::permission_denied);
  EXPECT_NE(denied.error().message.find("nvmlDeviceSetPowerManagementLimit"), std::string::npos);
}

TEST(NvmlMeterTest, reads_the_energy_counter_in_millijoules) {
  FakeNvmlScript script("name Tesla V100\nenergy_mj 1000 3500 6000\n");
  auto meter = open_gpu(0);
  ASSERT_TRUE(meter);
  EXPECT_EQ(meter->source(), "nvml");
  EXPECT_DOUBLE_EQ(meter->read()->value, 0.0);
  EXPECT_DOUBLE_EQ(meter->read()->value, 2.5);
  EXPECT_DOUBLE_EQ(meter->read()->value, 5.0);
  EXPECT_FALSE(meter->integrates_power());
  EXPECT_EQ(meter->description(), "GPU 0 Tesla V100, total energy counter");
}

TEST(NvmlMeterTest, counter_decrease_is_a_driver_reload_not_a_wrap) {
  FakeNvmlScript script("energy_mj 1000 5000 200 700\n");
  auto meter = open_gpu(0);
  ASSERT_TRUE(meter);
  EXPECT_DOUBLE_EQ(meter->read()->value, 0.0);
  EXPECT_DOUBLE_EQ(meter->read()->value, 4.0);
  EXPECT_DOUBLE_EQ(meter->read()->value, 4.2);  // restarted at 0: 200 mJ since the reload
  EXPECT_DOUBLE_EQ(meter->read()->value, 4.7);
}

TEST(NvmlMeterTest, each_gpu_has_its_own_counter) {
  FakeNvmlScript script("devices 2\nenergy_mj 0 1000 2000\n");
  auto library = open_fake();
  auto gpu0 = std::move(NvmlMeter::open(library, 0)).value();
  auto gpu1 = std::move(NvmlMeter::open(library, 1)).value();
  (void)gpu0->read();
  (void)gpu1->read();
  EXPECT_DOUBLE_EQ(gpu0->read()->value, 1.0);
  EXPECT_DOUBLE_EQ(gpu1->read()->value, 1.0);
}

TEST(NvmlMeterTest, integrates_power_when_the_energy_counter_is_not_supported) {
  FakeNvmlScript script("name Tesla P100-PCIE-16GB\nenergy_mj not_supported\npower_mw 100000 300000 300000\n");
  double now = 50.0;
  auto meter = open_gpu(0, [&] { return now; });
  ASSERT_TRUE(meter);
  EXPECT_DOUBLE_EQ(meter->read()->value, 0.0);
  EXPECT_TRUE(meter->integrates_power());
  now = 52.0;
  EXPECT_DOUBLE_EQ(meter->read()->value, 400.0);  // (100 W + 300 W) / 2 × 2 s
  now = 53.0;
  EXPECT_DOUBLE_EQ(meter->read()->value, 700.0);
  EXPECT_EQ(meter->description(), "GPU 0 Tesla P100-PCIE-16GB, power integrated");
}

// The daemon asks a meter for capabilities instead of asking which kind of meter it holds: an
// NVML meter offers its GPU's power limit, in watts; a simulated one a modelled load.
TEST(NvmlMeterTest, offers_its_gpus_power_limit_as_a_capability) {
  FakeNvmlScript script("limit_mw 250000\nlimit_constraints_mw 100000 300000\n");
  auto meter = open_gpu(0);
  ASSERT_TRUE(meter);
  const joule::adapters::EnergyMeter& as_meter = *meter;
  EXPECT_EQ(as_meter.battery_gauge(), nullptr);
  const auto* gpu = as_meter.gpu_power_control();
  ASSERT_NE(gpu, nullptr);
  auto range = gpu->power_limit_range_watts();
  ASSERT_TRUE(range) << range.error().message;
  EXPECT_DOUBLE_EQ(range->first, 100.0);
  EXPECT_DOUBLE_EQ(range->second, 300.0);
  joule::adapters::GpuPowerLimit limit(*gpu, 0);
  auto current = limit.current_watts();
  ASSERT_TRUE(current) << current.error().message;
  EXPECT_DOUBLE_EQ(*current, 250.0);

  joule::adapters::SimulatedMeter simulated(10.0, [] { return 0.0; });
  joule::adapters::EnergyMeter& simulated_meter = simulated;
  EXPECT_EQ(simulated_meter.gpu_power_control(), nullptr);
  ASSERT_NE(simulated_meter.modelled_load(), nullptr);
}

// MIG (issue 36): a GPU in MIG mode lists its MIG devices, and its counter is shared among them
// by the stated rule: to those with work by their compute slices, to all by slices while none has.
TEST(NvmlLibraryTest, a_gpu_in_mig_mode_lists_its_mig_devices_with_uuids_names_and_slices) {
  FakeNvmlScript script("devices 2\nname NVIDIA A100-SXM4-40GB\nmig 0 3g.20gb 1g.5gb\n");
  auto library = open_fake();
  ASSERT_TRUE(library);
  EXPECT_TRUE(*library->mig_enabled(*library->device(0)));
  EXPECT_FALSE(*library->mig_enabled(*library->device(1)));
  const auto devices = library->mig_devices(*library->device(0));
  ASSERT_TRUE(devices) << devices.error().message;
  ASSERT_EQ(devices->size(), 2u);
  EXPECT_EQ((*devices)[1].index, 1u);
  EXPECT_EQ((*devices)[1].name, "NVIDIA A100-SXM4-40GB MIG 1g.5gb");
  EXPECT_EQ((*devices)[1].uuid.rfind("MIG-", 0), 0u) << (*devices)[1].uuid;
  EXPECT_NE((*devices)[0].uuid, (*devices)[1].uuid);
  EXPECT_EQ((*devices)[0].compute_slices, 3u);
  EXPECT_EQ((*devices)[0].memory_mb, 20u * 1024);
  EXPECT_TRUE(library->mig_devices(*library->device(1))->empty());
}

TEST(MigMeterTest, the_gpus_counter_goes_to_the_mig_devices_with_work_by_their_slices) {
  // 7 J more at every reading of GPU 0's counter.
  FakeNvmlScript script(
      "name NVIDIA A100-SXM4-40GB\nmig 0 3g.20gb 3g.20gb 1g.5gb\nenergy_mj 0 7000 14000 21000 28000 35000\n");
  auto partition = joule::adapters::MigPartition::open(open_fake(), 0);
  ASSERT_TRUE(partition) << partition.error().message;
  auto& gpu = **partition;
  EXPECT_DOUBLE_EQ(gpu.read(0)->value, 3.0) << "none has work: 7 J by slices, 3:3:1";
  gpu.set_busy(1, true);  // the 7 J before it still went 3:3:1
  EXPECT_DOUBLE_EQ(gpu.read(1)->value, 6.0 + 7.0) << "alone with work, it gets the whole GPU";
  gpu.set_busy(2, true);
  EXPECT_DOUBLE_EQ(gpu.read(2)->value, 2.0 + 1.75);  // 7 J split 3:1 between the two with work
  EXPECT_DOUBLE_EQ(gpu.read(0)->value, 6.0) << "no work, no share";
  EXPECT_DOUBLE_EQ(gpu.read(1)->value + gpu.read(2)->value + gpu.read(0)->value, 35.0)
      << "the MIG devices' joules add up to the GPU's counter";
  EXPECT_TRUE(gpu.others_busy(0));
  EXPECT_TRUE(gpu.others_busy(1)) << "2 has work";
  gpu.set_busy(2, false);
  EXPECT_TRUE(gpu.others_busy(2)) << "1 still has work";
  gpu.set_busy(1, false);
  EXPECT_FALSE(gpu.others_busy(2));
  EXPECT_NE(gpu.rule(0).find("3 of the 7 its 3 MIG devices have"), std::string::npos) << gpu.rule(0);
  EXPECT_FALSE(gpu.read(5)) << "no MIG device 5";

  auto meter = joule::adapters::MigMeter::open(*partition, 1);
  ASSERT_TRUE(meter) << meter.error().message;
  EXPECT_EQ((*meter)->source(), "nvml");
  EXPECT_EQ((*meter)->gpu_power_control(), nullptr) << "the GPU's limit is its siblings' too";
  ASSERT_NE((*meter)->shared_gpu_counter(), nullptr);
  EXPECT_EQ((*meter)->cuda_visible().rfind("MIG-", 0), 0u);
  EXPECT_NE((*meter)->description().find("NVIDIA A100-SXM4-40GB MIG 3g.20gb (MIG-"), std::string::npos)
      << (*meter)->description();
  const auto missing = joule::adapters::MigMeter::open(*partition, 4);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("mig:0.2 (NVIDIA A100-SXM4-40GB MIG 1g.5gb)"), std::string::npos)
      << missing.error().message;
}

TEST(MigMeterTest, a_gpu_not_in_mig_mode_or_without_mig_devices_is_no_partition) {
  FakeNvmlScript script("devices 2\nname NVIDIA A100-SXM4-40GB\n");
  const auto whole = joule::adapters::MigPartition::open(open_fake(), 1);
  ASSERT_FALSE(whole);
  EXPECT_NE(whole.error().message.find("GPU 1 is not in MIG mode"), std::string::npos) << whole.error().message;
  EXPECT_EQ(joule::adapters::parse_mig_name("mig:1.2")->index, 2u);
  EXPECT_FALSE(joule::adapters::parse_mig_name("mig:1"));
  EXPECT_FALSE(joule::adapters::parse_mig_name("mig:1.x"));
  EXPECT_FALSE(joule::adapters::parse_mig_name("cuda:1"));
}
