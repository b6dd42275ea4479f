#include "joule/adapters/modelled_cpu_meter.hpp"

#include <gtest/gtest.h>

#include "temp_dir.hpp"

using joule::adapters::ModelledCpuMeter;
using joule::adapters::ModelledCpuParams;
using joule::testing::TempDir;

namespace {

// /proc/stat as the kernel writes it: aggregate line, one line per CPU, then other counters.
std::string proc_stat(unsigned long user, unsigned long system, unsigned long idle, int cpus = 2) {
  std::string text =
      "cpu  " + std::to_string(user) + " 0 " + std::to_string(system) + " " + std::to_string(idle) + " 0 0 0 0 0 0\n";
  for (int i = 0; i < cpus; ++i) text += "cpu" + std::to_string(i) + " 1 0 1 1 0 0 0 0 0 0\n";
  text += "intr 12345 0 0\nctxt 999\nbtime 1700000000\nprocs_running 1\n";
  return text;
}

}  // namespace

TEST(ModelledCpuMeterTest, first_reading_is_zero_then_energy_follows_the_model) {
  TempDir proc;
  proc.write("stat", proc_stat(1000, 500, 10000));
  ModelledCpuMeter meter(ModelledCpuParams{10.0, 12.0}, proc.path(), 100);
  EXPECT_EQ(meter.source(), "modelled");
  auto first = meter.read();
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_DOUBLE_EQ(first->value, 0.0);
  // 2 CPUs for 10 s = 2000 ticks: 1 core busy for 10 s (1000 ticks), the other idle.
  proc.write("stat", proc_stat(1800, 700, 11000));
  auto second = meter.read();
  ASSERT_TRUE(second);
  EXPECT_NEAR(second->value, 10.0 * 10.0 + 12.0 * 10.0, 1e-9);
}

TEST(ModelledCpuMeterTest, readings_are_cumulative_and_survive_a_counter_reset) {
  TempDir proc;
  proc.write("stat", proc_stat(0, 0, 0));
  ModelledCpuMeter meter(ModelledCpuParams{5.0, 0.0}, proc.path(), 100);
  (void)meter.read();
  proc.write("stat", proc_stat(0, 0, 200));  // 1 s idle on 2 CPUs
  EXPECT_NEAR(meter.read()->value, 5.0, 1e-9);
  proc.write("stat", proc_stat(0, 0, 50));  // went backwards: restart the interval, no negative energy
  EXPECT_NEAR(meter.read()->value, 5.0, 1e-9);
  proc.write("stat", proc_stat(0, 0, 250));
  EXPECT_NEAR(meter.read()->value, 10.0, 1e-9);
}

TEST(ModelledCpuMeterTest, missing_and_malformed_files_are_errors_not_zeros) {
  TempDir proc;
  ModelledCpuMeter missing(ModelledCpuParams{}, proc.path(), 100);
  auto reading = missing.read();
  ASSERT_FALSE(reading);
  EXPECT_EQ(reading.error().code, joule::ErrorCode::unavailable);
  EXPECT_NE(reading.error().message.find("stat"), std::string::npos);

  proc.write("stat", "cpu  1 2\n");
  ModelledCpuMeter malformed(ModelledCpuParams{}, proc.path(), 100);
  EXPECT_FALSE(malformed.read());
  proc.write("stat", "");
  EXPECT_FALSE(malformed.read());
}

TEST(ModelledCpuMeterTest, reads_the_real_proc_stat) {
  ModelledCpuMeter meter(ModelledCpuParams{}, "/proc", 100);
  ASSERT_TRUE(meter.read());
  auto later = meter.read();
  ASSERT_TRUE(later);
  EXPECT_GE(later->value, 0.0);
}

TEST(ModelledCpuMeterTest, a_jobs_own_share_is_idle_power_over_its_run_and_busy_power_over_its_cpu_time) {
  joule::adapters::ModelledCpuMeter meter({10.0, 12.0}, "/nonexistent");
  const auto* model = meter.cpu_time_model();
  ASSERT_NE(model, nullptr);
  EXPECT_DOUBLE_EQ(model->joules(30.0, 45.0), 10.0 * 30.0 + 12.0 * 45.0);  // 1.5 cores busy for 30 s
  EXPECT_DOUBLE_EQ(model->joules(-1.0, -1.0), 0.0);
  EXPECT_NE(model->describe().find("12 W per CPU-second of its processes"), std::string::npos) << model->describe();
}
