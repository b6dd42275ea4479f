#include "joule/daemon/thread_settings.hpp"

#include <gtest/gtest.h>

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
