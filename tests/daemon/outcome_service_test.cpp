#include "joule/daemon/outcome_service.hpp"

#include "joule/daemon/metrics.hpp"

#include <gtest/gtest.h>

#include "estimate_rows.hpp"

using joule::EnergySource;
using joule::daemon::DeviceEstimate;
using joule::daemon::EstimateRow;
using joule::daemon::JobFeedback;
using joule::daemon::OutcomeService;
using joule::testing::layer_of;
using joule::testing::no_model_row;
using nlohmann::json;

namespace {

// An estimate on "cpu" from a model learnt on modelled joules: `joules` J over 100 steps, a
// tenth as many seconds, its FLOPs in one layer; learnt under `environment` ("": unnamed).
EstimateRow estimate_row(double joules, double std, const std::string& environment = "") {
  auto row = joule::testing::estimate_row("cpu", "modelled", joules, std, joules / 10.0, 100);
  row.estimate->seconds.std = 1.0;
  row.estimate->environment = environment;
  row.estimate->layers.push_back(layer_of("", joules * 1e6, 0.0));
  return row;
}

JobFeedback finished(double estimated, double metered, int i, EnergySource source = EnergySource::modelled) {
  return JobFeedback{"cpu",   DeviceEstimate::of(estimate_row(estimated, estimated * 0.05)),
                     metered, source,
                     false,   "job-" + std::to_string(i),
                     i,       std::nullopt};
}

}  // namespace

TEST(OutcomeServiceTest, jobs_that_used_twice_their_estimate_double_the_next_estimate_and_keep_the_raw_one) {
  OutcomeService outcomes;
  for (int i = 0; i < 12; ++i) {
    const double estimated = 100.0 + 50.0 * i;
    EXPECT_TRUE(outcomes.record(finished(estimated, 2.0 * estimated * (i % 2 ? 1.02 : 0.98), i)));
  }
  std::vector<EstimateRow> estimates{estimate_row(300.0, 15.0), no_model_row("gpu")};
  outcomes.apply(estimates);
  EXPECT_NEAR(estimates[0].estimate->joules.mean, 600.0, 60.0);
  ASSERT_TRUE(estimates[0].correction);
  EXPECT_EQ(estimates[0].correction->model_joules.mean, 300.0);
  EXPECT_EQ(estimates[0].correction->rows, 12u);
  EXPECT_FALSE(estimates[1].correction);
  // As the API shows it and a job stores it.
  const json shown = joule::daemon::estimate_row_json(estimates[0]);
  EXPECT_EQ(shown["raw_joules"]["mean"], 300.0);
  EXPECT_EQ(shown["calibration"]["rows"], 12);
  EXPECT_EQ(shown["calibration"]["method"], "kernel-ridge+conformal");
  const json view = outcomes.view("cpu");
  EXPECT_EQ(view["correction"], "mean and spread");
  EXPECT_GT(view["error_raw"].get<double>(), 0.4);
  EXPECT_LT(view["error_corrected_leave_one_out"].get<double>(), 0.1);
  // Learning from a corrected row uses the model's own figure, not the corrected one.
  auto again = finished(300.0, 600.0, 13);
  again.estimate = DeviceEstimate::of(estimates[0]);
  EXPECT_NEAR(again.estimate.joules_mean, estimates[0].estimate->joules.mean, 1e-5 * again.estimate.joules_mean);
  EXPECT_EQ(again.estimate.model_joules_mean, 300.0);
  // The same figures read back from the stored form.
  const auto stored = joule::daemon::read_estimates(joule::daemon::stored_estimates({estimates[0]}));
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_TRUE(stored[0].same_figures(again.estimate));
  EXPECT_TRUE(outcomes.record(again));
  EXPECT_EQ(outcomes.view("cpu")["rows"], 13);
}

TEST(OutcomeServiceTest, partial_mismatched_and_failed_estimates_teach_nothing) {
  OutcomeService outcomes;
  auto partial = finished(100.0, 200.0, 1);
  partial.partial = true;
  EXPECT_FALSE(outcomes.record(partial));
  EXPECT_FALSE(outcomes.record(finished(100.0, 200.0, 2, EnergySource::rapl)));  // modelled estimate, rapl joules
  auto no_model = finished(100.0, 200.0, 3);
  no_model.estimate = DeviceEstimate::of(no_model_row("cpu"));
  EXPECT_FALSE(outcomes.record(no_model));
  auto on_two = finished(100.0, 200.0, 4);
  on_two.gpus = 2;  // two GPUs' joules: nothing one GPU's model should learn
  EXPECT_FALSE(outcomes.record(on_two));
  EXPECT_EQ(outcomes.record_all({on_two}), 0u);
  EXPECT_EQ(outcomes.view("cpu")["rows"], 0);
  // Below the minimum rows an estimate is left as the model made it.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(outcomes.record(finished(100.0, 200.0, 10 + i)));
  std::vector<EstimateRow> estimates{estimate_row(300.0, 15.0)};
  outcomes.apply(estimates);
  EXPECT_EQ(estimates[0].estimate->joules.mean, 300.0);
  EXPECT_FALSE(estimates[0].correction);
  EXPECT_EQ(outcomes.view("cpu")["correction"], "none");
}

TEST(OutcomeServiceTest, the_history_at_start_gives_the_same_rows_as_jobs_one_by_one) {
  std::vector<JobFeedback> history;
  for (int i = 0; i < 12; ++i) history.push_back(finished(100.0 + 50.0 * i, 2.0 * (100.0 + 50.0 * i), i));
  history.push_back(finished(100.0, 200.0, 99, EnergySource::rapl));  // teaches nothing
  OutcomeService at_start, live;
  EXPECT_EQ(at_start.record_all(history), 12u);
  for (const auto& feedback : history) live.record(feedback);
  EXPECT_EQ(at_start.view("cpu"), live.view("cpu"));
}

TEST(OutcomeServiceTest, a_start_up_every_job_pays_is_its_own_line_in_the_next_estimates) {
  OutcomeService outcomes;
  // Jobs of 50-1150 J of steps (as estimated, ±2 %) that each spent 80 J and 4 s starting.
  for (int i = 0; i < 12; ++i) {
    const double estimated = 50.0 + 100.0 * i;
    auto feedback = finished(estimated, estimated * (i % 2 ? 1.02 : 0.98) + 80.0, i);
    feedback.seconds = estimated / 10.0 + 4.0;
    EXPECT_TRUE(outcomes.record(feedback));
  }
  std::vector<EstimateRow> estimates{estimate_row(100.0, 5.0)};
  outcomes.apply(estimates);
  const json row = joule::daemon::estimate_row_json(estimates[0]);
  ASSERT_TRUE(row.contains("overhead")) << row.dump(2);
  EXPECT_NEAR(row["overhead"]["joules"].get<double>(), 80.0, 15.0);
  EXPECT_NEAR(row["overhead"]["seconds"].get<double>(), 4.0, 1.0);
  EXPECT_EQ(row["overhead"]["learnt_from"], 12);
  EXPECT_NEAR(row["joules"]["mean"].get<double>(), 180.0, 20.0);  // the steps' 100 J and the start
  EXPECT_EQ(row["raw_seconds"]["mean"], 10.0);
  EXPECT_NEAR(row["seconds"]["mean"].get<double>(), 14.0, 1.0);
  const json view = outcomes.view("cpu");
  EXPECT_NEAR(view["overhead"]["joules"]["per_job"].get<double>(), 80.0, 15.0);
  EXPECT_TRUE(view["overhead"]["seconds_applied"].get<bool>());
  // A corrected row teaches with the model's own seconds and joules, not the served ones.
  const auto again = DeviceEstimate::of(estimates[0]);
  EXPECT_EQ(again.model_seconds_mean, 10.0);
  EXPECT_EQ(again.model_joules_mean, 100.0);
  // Applying twice gives the same row (an estimate corrected again after a refit).
  auto twice = estimates;
  outcomes.apply(twice);
  EXPECT_EQ(joule::daemon::estimate_row_json(twice[0]), row);
}

// The work mix comes from the estimates' layers: a device that under-estimates recurrent layers
// corrects the next LSTM's estimate and not the next CNN's.
TEST(OutcomeServiceTest, the_work_mix_of_the_estimates_layers_tells_which_jobs_to_correct) {
  const auto row_of = [](double joules, const std::string& model) {
    auto row = estimate_row(joules, 0.05 * joules);
    row.estimate->layers = {layer_of(model, joules * 1e6, 0.9 * joules / 100),
                            layer_of("linear@output", 0.0, 0.1 * joules / 100)};
    return row;
  };
  OutcomeService outcomes;
  for (int i = 0; i < 16; ++i) {
    const bool recurrent = i % 2 == 1;
    const double estimated = 200.0 + 40.0 * (i / 2);
    auto feedback = finished(estimated, 0.0, i);
    feedback.estimate = DeviceEstimate::of(row_of(estimated, recurrent ? "lstm@hidden" : "conv2d@hidden"));
    ASSERT_TRUE(feedback.estimate.mix);
    feedback.joules = (recurrent ? 1.5 : 0.7) * estimated * (i % 4 < 2 ? 1.01 : 0.99);
    EXPECT_TRUE(outcomes.record(feedback));
  }
  EXPECT_EQ(outcomes.view("cpu")["uses_work_mix"], true);
  std::vector<EstimateRow> estimates{row_of(300.0, "lstm@hidden"), row_of(300.0, "conv2d@hidden")};
  outcomes.apply(estimates);
  EXPECT_NEAR(estimates[0].estimate->joules.mean, 450.0, 45.0);
  EXPECT_NEAR(estimates[1].estimate->joules.mean, 210.0, 25.0);
  // A stored row whose layers were left out (a job with many candidate devices: only the 8
  // cheapest keep them) has no mix.
  std::vector<EstimateRow> many(joule::daemon::kDetailedRows, row_of(100.0, "conv2d@hidden"));
  many.push_back(row_of(300.0, "lstm@hidden"));
  const auto stored = joule::daemon::read_estimates(joule::daemon::stored_estimates(many));
  ASSERT_EQ(stored.size(), many.size());
  EXPECT_TRUE(stored[0].mix);
  EXPECT_FALSE(stored.back().mix);
}

// A LibTorch, BLAS or thread change re-probes the device under a new environment: what jobs
// taught about the old model's estimates must not correct the new one's. Rows of estimates
// stored before estimates named their environment count for every environment.
TEST(OutcomeServiceTest, what_jobs_taught_under_one_environment_does_not_correct_another) {
  const auto finished_under = [&](double estimated, double metered, int i, const std::string& environment) {
    auto feedback = finished(estimated, metered, i);
    feedback.estimate = DeviceEstimate::of(estimate_row(estimated, estimated * 0.05, environment));
    return feedback;
  };
  OutcomeService outcomes;
  // Under "old" jobs used twice their estimates.
  for (int i = 0; i < 12; ++i) {
    const double estimated = 100.0 + 50.0 * i;
    EXPECT_TRUE(outcomes.record(finished_under(estimated, 2.0 * estimated * (i % 2 ? 1.02 : 0.98), i, "old")));
  }
  std::vector<EstimateRow> estimates{estimate_row(300.0, 15.0, "old"), estimate_row(300.0, 15.0, "new")};
  outcomes.apply(estimates);
  EXPECT_NEAR(estimates[0].estimate->joules.mean, 600.0, 60.0);
  EXPECT_EQ(estimates[1].estimate->joules.mean, 300.0) << "the new environment's model has no rows of its own";
  EXPECT_FALSE(estimates[1].correction);
  outcomes.set_environment("cpu", "new");
  EXPECT_EQ(outcomes.view("cpu")["rows"], 0);
  EXPECT_EQ(outcomes.view("cpu")["rows_other_environments"], 12);
  EXPECT_EQ(outcomes.summaries().at("cpu").rows, 0u);
  EXPECT_FALSE(outcomes.summaries().at("cpu").raw_error);

  // Rows that name no environment (stored before estimates did) count for both.
  OutcomeService upgraded;
  std::vector<JobFeedback> history;
  for (int i = 0; i < 8; ++i) history.push_back(finished(100.0 + 50.0 * i, 2.0 * (100.0 + 50.0 * i), i));
  EXPECT_EQ(upgraded.record_all(history), 8u);
  EXPECT_TRUE(upgraded.record(finished_under(300.0, 600.0, 20, "new")));
  std::vector<EstimateRow> later{estimate_row(300.0, 15.0, "new"), estimate_row(300.0, 15.0)};
  upgraded.apply(later);
  EXPECT_EQ(later[0].correction->rows, 9u);
  EXPECT_EQ(later[1].correction->rows, 8u);
  EXPECT_NEAR(later[0].estimate->joules.mean, 600.0, 60.0);
  upgraded.set_environment("cpu", "new");
  EXPECT_EQ(upgraded.view("cpu")["rows"], 9);
  EXPECT_EQ(upgraded.view("cpu")["rows_other_environments"], 0);
}

// The metrics follow: once the model's environment has no rows, the old figures go.
TEST(OutcomeServiceTest, a_new_environments_empty_calibration_clears_the_old_figures_from_the_metrics) {
  OutcomeService outcomes;
  for (int i = 0; i < 8; ++i) outcomes.record(finished(100.0 + 50.0 * i, 2.0 * (100.0 + 50.0 * i), i));
  joule::daemon::Metrics metrics;
  for (const auto& [device, summary] : outcomes.summaries()) metrics.set_calibration(device, summary);
  EXPECT_NE(metrics.serialize().find("joule_calibration_error_ratio{device=\"cpu\",estimate=\"raw\"}"),
            std::string::npos)
      << metrics.serialize();
  // The rows above name no environment and count for every one; rows of another do not.
  OutcomeService named;
  for (int i = 0; i < 8; ++i) {
    auto feedback = finished(100.0 + 50.0 * i, 2.0 * (100.0 + 50.0 * i), i);
    feedback.estimate.environment = "old";
    named.record(feedback);
  }
  named.set_environment("cpu", "new");
  for (const auto& [device, summary] : named.summaries()) metrics.set_calibration(device, summary);
  const auto text = metrics.serialize();
  EXPECT_EQ(text.find("joule_calibration_error_ratio{device=\"cpu\""), std::string::npos) << text;
  EXPECT_NE(text.find("joule_calibration_rows{device=\"cpu\"} 0"), std::string::npos) << text;
}

// A job on several GPUs teaches the overhead of its GPU model, not the model of the device it
// started on; what it taught moves the next estimate on several GPUs, also from the stored
// rows read back at start.
TEST(OutcomeServiceTest, jobs_on_several_gpus_teach_their_gpu_models_overhead) {
  auto one_gpu = joule::testing::estimate_row("cuda:0", "nvml", 1000.0, 50.0, 400.0, 100);
  joule::estimator::Estimate on_two = joule::estimator::across_gpus(*one_gpu.estimate, 2, 32);
  EstimateRow two_row{"cuda:0", on_two, "", std::nullopt};
  // Read back as a finished job's stored estimate is.
  const auto stored = joule::daemon::read_estimates(joule::daemon::stored_estimates({two_row}));
  ASSERT_EQ(stored.size(), 1u);
  ASSERT_TRUE(stored[0].data_parallel);
  EXPECT_EQ(stored[0].data_parallel->one_gpu_joules.mean, 1000.0);
  EXPECT_TRUE(stored[0].same_figures(DeviceEstimate::of(two_row)));
  const auto job = [&](double joules, double seconds, int i) {
    JobFeedback feedback{"cuda:0", stored[0], joules, EnergySource::nvml, false, "job-" + std::to_string(i),
                         i,        seconds};
    feedback.gpus = 2;
    feedback.gpu_group = "NVIDIA A100";
    return feedback;
  };
  OutcomeService outcomes;
  EXPECT_EQ(outcomes.data_parallel_overhead("NVIDIA A100", 2).jobs, 0u);
  auto modelled = job(1300.0, 260.0, 0);
  modelled.source = EnergySource::modelled;
  EXPECT_FALSE(outcomes.record(modelled)) << "an nvml estimate against modelled joules";
  auto partial = job(1300.0, 260.0, 0);
  partial.partial = true;
  EXPECT_FALSE(outcomes.record(partial));
  std::vector<JobFeedback> history;
  for (int i = 0; i < 6; ++i) history.push_back(job(1300.0, 260.0, i));  // +30 % energy, 2 × 260 / 400: +30 % time
  EXPECT_EQ(outcomes.record_all(history), 6u);
  const auto learnt = outcomes.data_parallel_overhead("NVIDIA A100", 2);
  EXPECT_EQ(learnt.jobs, 6u);
  EXPECT_NEAR(learnt.joules.mean, (0.15 + 6 * 0.30) / 7, 1e-9);
  EXPECT_NEAR(learnt.seconds.mean, (0.15 + 6 * 0.30) / 7, 1e-9);
  EXPECT_EQ(outcomes.data_parallel_overhead("NVIDIA H100", 2).jobs, 0u) << "another model's GPUs learn apart";
  EXPECT_EQ(outcomes.view("cuda:0")["rows"], 0) << "the one-GPU model learns nothing from them";
  const json view = outcomes.data_parallel_view("NVIDIA A100");
  EXPECT_EQ(view["2"]["jobs"], 6);
  EXPECT_NE(view["2"]["basis"].get<std::string>().find("6 finished jobs on 2 NVIDIA A100 GPUs"), std::string::npos)
      << view.dump();
}
