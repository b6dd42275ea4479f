#include "joule/daemon/job_estimate.hpp"

#include <gtest/gtest.h>

using joule::daemon::find_estimate;
using joule::daemon::read_estimates;
using nlohmann::json;

TEST(JobEstimateTest, rows_are_read_once_into_the_figures_the_daemon_decides_with) {
  const json rows = json::array({{{"device", "cpu"},
                                  {"status", "ok"},
                                  {"source", "modelled"},
                                  {"steps", 400},
                                  {"joules", {{"mean", 600.0}, {"std", 30.0}}},
                                  {"raw_joules", {{"mean", 300.0}, {"std", 15.0}}},
                                  {"seconds", {{"mean", 42.0}, {"std", 2.0}}},
                                  {"baseline", {{"method", "flops"}, {"joules", 900.0}}},
                                  {"layers", json::array({{{"flops_per_step", 1.5e9}}, {{"flops_per_step", 0.5e9}}})}},
                                 {{"device", "cuda:0"}, {"status", "no-model"}, {"detail", "no energy model yet"}},
                                 {{"status", "ok"}}});  // no device: not a row
  const auto estimates = read_estimates(rows);
  ASSERT_EQ(estimates.size(), 2u);
  const auto* cpu = find_estimate(estimates, "cpu");
  ASSERT_NE(cpu, nullptr);
  EXPECT_TRUE(cpu->ok);
  EXPECT_EQ(cpu->source, "modelled");
  EXPECT_EQ(cpu->joules_mean, 600.0);
  EXPECT_EQ(cpu->joules_std, 30.0);
  EXPECT_EQ(cpu->model_joules_mean, 300.0);  // the model's own figure, before the correction
  EXPECT_EQ(cpu->model_joules_std, 15.0);
  EXPECT_EQ(cpu->seconds_mean, 42.0);
  EXPECT_EQ(cpu->baseline_joules, 900.0);
  EXPECT_EQ(cpu->flops_per_step, 2.0e9);
  EXPECT_EQ(cpu->steps, 400);
  EXPECT_EQ(cpu->placement().joules_mean, 600.0);
  const auto* gpu = find_estimate(estimates, "cuda:0");
  ASSERT_NE(gpu, nullptr);
  EXPECT_FALSE(gpu->ok);
  EXPECT_EQ(find_estimate(estimates, "cuda:1"), nullptr);
}

TEST(JobEstimateTest, an_uncorrected_row_is_its_own_model_figure_and_bad_text_reads_as_none) {
  const auto estimates = read_estimates(std::string(
      R"([{"device": "cpu", "status": "ok", "source": "simulated", "joules": {"mean": 10.0, "std": 1.0}}])"));
  ASSERT_EQ(estimates.size(), 1u);
  EXPECT_EQ(estimates[0].model_joules_mean, 10.0);
  EXPECT_FALSE(estimates[0].baseline_joules);
  EXPECT_TRUE(read_estimates(std::string()).empty());
  EXPECT_TRUE(read_estimates(std::string("{not json")).empty());
  EXPECT_TRUE(read_estimates(json::object()).empty());
}
