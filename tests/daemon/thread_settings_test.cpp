#include "joule/daemon/thread_settings.hpp"

#include <gtest/gtest.h>

using joule::daemon::set_allocator_variables;
using joule::daemon::set_thread_variables;
using joule::daemon::thread_count_warning;

TEST(ThreadSettingsTest, every_variable_gets_the_devices_count) {
  std::map<std::string, std::string> env{{"OMP_NUM_THREADS", "16"}, {"PATH", "/bin"}};
  set_thread_variables(env, 2);
  EXPECT_EQ(env.at("OMP_NUM_THREADS"), "2");  // jouled's own environment does not leak into jobs
  EXPECT_EQ(env.at("MKL_NUM_THREADS"), "2");
  EXPECT_EQ(env.at("OPENBLAS_NUM_THREADS"), "2");
  EXPECT_EQ(env.at("JOULE_THREADS"), "2");
  std::map<std::string, std::string> unset;
  set_thread_variables(unset, 0);
  EXPECT_TRUE(unset.empty());
}

TEST(ThreadSettingsTest, a_job_asking_for_another_count_is_told_its_estimate_is_outside_the_model) {
  EXPECT_FALSE(thread_count_warning({}, 4));
  EXPECT_FALSE(thread_count_warning({{"OMP_NUM_THREADS", "4"}}, 4));
  EXPECT_FALSE(thread_count_warning({{"OMP_NUM_THREADS", "8"}}, 0));  // a device without a count
  const auto warning = thread_count_warning({{"MKL_NUM_THREADS", "8"}}, 1);
  ASSERT_TRUE(warning);
  EXPECT_EQ(*warning,
            "run.env sets MKL_NUM_THREADS=8, but this device's model is learnt at 1 thread: the estimate "
            "is outside what was probed");
}

TEST(ThreadSettingsTest, jobs_get_the_malloc_thresholds_probes_are_measured_under) {
  std::map<std::string, std::string> env{{"MALLOC_TRIM_THRESHOLD_", "1"}};
  set_allocator_variables(env);
  EXPECT_EQ(env.at("MALLOC_MMAP_THRESHOLD_"), std::to_string(joule::kMallocMmapThresholdBytes));
  EXPECT_EQ(env.at("MALLOC_TRIM_THRESHOLD_"), "1073741824");  // jouled's own environment does not leak
  EXPECT_EQ(env.at("MALLOC_MMAP_MAX_"), "0");
}
