// A job's CPU knobs on cores of its own: where each CPU has a cpufreq policy of its own
// (intel_pstate, amd-pstate), a cap on the job's cores reaches their policies alone, and comes
// back; where one policy clocks several CPUs (a Pi's cluster), a cap on some of them is refused
// rather than reaching the jobs beside it. Fixture cpufreq trees laid out as the kernel does.
#include <gtest/gtest.h>

#include "../fakes/sysfs_fixtures.hpp"
#include "joule/daemon/device_knobs.hpp"
#include "temp_dir.hpp"
#include "text_file.hpp"

namespace joule::daemon {
namespace {

using testing::TempDir;

adapters::CpuFrequencyKnob discovered(const TempDir& root) {
  auto knob = adapters::CpuFrequencyKnob::discover(root / "sys/devices/system/cpu/cpufreq");
  if (!knob) throw std::runtime_error(knob.error().message);
  return *knob;
}

std::string max_of(const TempDir& root, int policy) {
  return testing::read_text(root /
                            ("sys/devices/system/cpu/cpufreq/policy" + std::to_string(policy) + "/scaling_max_freq"));
}

TEST(DeviceKnobsTest, a_cap_on_a_jobs_own_cores_reaches_their_policies_alone_and_comes_back) {
  TempDir root;
  for (int cpu = 0; cpu < 4; ++cpu) testing::write_cpufreq_policy(root, testing::intel_pstate_policy(cpu));
  Device cpu;
  cpu.name = "cpu";
  cpu.shared_cores = 4;
  cpu.cpu_frequency = discovered(root);
  EXPECT_TRUE(clocks_per_cpu(*cpu.cpu_frequency));

  DeviceKnobs knobs(nullptr, nullptr);
  schedulers::Knobs cap;
  cap.cpu_max_frequency_mhz = 2800;
  const auto applied = knobs.apply(cap, cpu, nullptr, false, {1, 2});
  ASSERT_TRUE(applied) << applied.error().message;
  EXPECT_EQ(applied->front(), "cpu_max_frequency_mhz 2800 (policy1 2800 MHz, policy2 2800 MHz)");
  EXPECT_EQ(max_of(root, 0), "4700000\n");
  EXPECT_EQ(max_of(root, 1), "2800000\n");
  EXPECT_EQ(max_of(root, 2), "2800000\n");
  EXPECT_EQ(max_of(root, 3), "4700000\n");
  EXPECT_TRUE(knobs.restore().empty());
  for (int policy = 0; policy < 4; ++policy) EXPECT_EQ(max_of(root, policy), "4700000\n") << policy;

  // Without cores of its own (the job holds the device whole): every policy.
  ASSERT_TRUE(knobs.apply(cap, cpu, nullptr));
  for (int policy = 0; policy < 4; ++policy) EXPECT_EQ(max_of(root, policy), "2800000\n") << policy;
  EXPECT_TRUE(knobs.restore().empty());
}

TEST(DeviceKnobsTest, a_policy_that_clocks_cpus_beyond_the_jobs_is_refused_and_nothing_changes) {
  TempDir root;
  // A table driver's one policy for a cluster of four cores, as on a Raspberry Pi 4.
  testing::CpufreqPolicy cluster = testing::acpi_cpufreq_policy(0);
  cluster.cpus = {0, 1, 2, 3};
  cluster.driver = "cpufreq-dt";
  testing::write_cpufreq_policy(root, cluster);
  Device cpu;
  cpu.name = "cpu";
  cpu.shared_cores = 4;
  cpu.cpu_frequency = discovered(root);
  EXPECT_FALSE(clocks_per_cpu(*cpu.cpu_frequency));

  const auto narrowed = clocks_of_cpus(*cpu.cpu_frequency, {0, 1});
  ASSERT_FALSE(narrowed);
  EXPECT_EQ(narrowed.error().message,
            "policy0 clocks CPUs 0 1 2 3 together, and the job holds only 0-1 of them: a cap would reach the jobs "
            "beside it");
  DeviceKnobs knobs(nullptr, nullptr);
  schedulers::Knobs cap;
  cap.cpu_max_frequency_mhz = 1800;
  EXPECT_FALSE(knobs.apply(cap, cpu, nullptr, false, {0, 1}));
  EXPECT_EQ(max_of(root, 0), "3000000\n");
  ASSERT_TRUE(clocks_of_cpus(*cpu.cpu_frequency, {0, 1, 2, 3})) << "the whole cluster is the job's own";
}

TEST(DeviceKnobsTest, a_cpu_without_a_policy_is_named) {
  TempDir root;
  testing::write_cpufreq_policy(root, testing::amd_pstate_epp_policy(0));
  const auto narrowed = clocks_of_cpus(discovered(root), {0, 5});
  ASSERT_FALSE(narrowed);
  EXPECT_EQ(narrowed.error().message, "CPU 5 has no cpufreq policy to cap");
}

}  // namespace
}  // namespace joule::daemon
