#include <gtest/gtest.h>

#include "joule/adapters/modelled_cpu_meter.hpp"

using joule::adapters::ModelledCpuParams;
using joule::adapters::ProcessModelledMeter;

TEST(ProcessModelledMeterTest, counts_this_process_cpu_time_and_wall_time) {
  double cpu = 5.0, wall = 1000.0;
  ProcessModelledMeter meter(
      ModelledCpuParams{10.0, 12.0}, [&] { return cpu; }, [&] { return wall; });
  EXPECT_EQ(meter.source(), "modelled");
  EXPECT_DOUBLE_EQ(meter.read()->value, 0.0);
  cpu += 0.5;  // half a core-second of this process over one wall second
  wall += 1.0;
  EXPECT_NEAR(meter.read()->value, 10.0 * 1.0 + 12.0 * 0.5, 1e-12);
  cpu += 0.1;  // a 100 ms probe reading: milliseconds matter
  wall += 0.1;
  EXPECT_NEAR(meter.read()->value, 16.0 + 1.0 + 1.2, 1e-12);
}

TEST(ProcessModelledMeterTest, other_processes_do_not_count) {
  // A busy node but an idle process: only idle power over wall time.
  double cpu = 0.0, wall = 0.0;
  ProcessModelledMeter meter(
      ModelledCpuParams{4.0, 12.0}, [&] { return cpu; }, [&] { return wall; });
  wall = 2.0;
  EXPECT_NEAR(meter.read()->value, 8.0, 1e-12);
}

TEST(ProcessModelledMeterTest, clocks_that_go_back_give_no_negative_energy) {
  double cpu = 3.0, wall = 3.0;
  ProcessModelledMeter meter(
      ModelledCpuParams{1.0, 1.0}, [&] { return cpu; }, [&] { return wall; });
  cpu = 1.0;
  wall = 2.0;
  EXPECT_DOUBLE_EQ(meter.read()->value, 0.0);
}

TEST(ProcessModelledMeterTest, real_process_clock_sees_a_few_milliseconds_of_work) {
  ProcessModelledMeter meter(ModelledCpuParams{0.0, 1.0});
  const double start = joule::adapters::process_cpu_seconds();
  volatile double sink = 0.0;
  while (joule::adapters::process_cpu_seconds() - start < 0.002) sink = sink + 1.0;  // 2 ms: under one procfs tick
  auto reading = meter.read();
  ASSERT_TRUE(reading);
  EXPECT_GE(reading->value, 0.002);
  EXPECT_LT(reading->value, 1.0);
}
