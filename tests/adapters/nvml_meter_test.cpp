#include "joule/adapters/nvml_meter.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "joule/adapters/job_controls.hpp"
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
