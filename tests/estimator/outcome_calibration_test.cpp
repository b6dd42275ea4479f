#include "joule/estimator/outcome_calibration.hpp"

#include <cmath>
#include <random>

#include <gtest/gtest.h>

using joule::estimator::OutcomeCalibration;
using joule::estimator::OutcomeRow;

namespace {

// Jobs of varied size on one device: the estimate says `estimated` ± `relative_std`, the meter
// reads `truth(estimated)` times log-normal noise of `noise` (log-space σ).
struct Device {
  double relative_std = 0.1;
  double noise = 0.05;
  double bias = 1.0;  // metered = bias × estimate × noise
  std::mt19937 random{7};

  OutcomeRow job(int i) {
    std::uniform_real_distribution<double> size(std::log(50.0), std::log(5000.0));
    std::normal_distribution<double> error(0.0, noise);
    const double estimated = std::exp(size(random));
    OutcomeRow row;
    row.job_id = "job-" + std::to_string(i);
    row.finished_ms = i;
    row.estimated_joules = estimated;
    row.estimated_std = estimated * relative_std;
    row.estimated_seconds = estimated / 20.0;
    row.flops_per_step = estimated * 1e7;
    row.steps = 100 + i;
    row.metered_joules = bias * estimated * std::exp(error(random));
    return row;
  }
};

OutcomeCalibration learn(Device& device, int jobs) {
  OutcomeCalibration calibration;
  for (int i = 0; i < jobs; ++i) EXPECT_TRUE(calibration.add(device.job(i)));
  return calibration;
}

}  // namespace

TEST(OutcomeCalibrationTest, below_the_minimum_rows_nothing_changes) {
  Device device;
  OutcomeCalibration calibration = learn(device, static_cast<int>(OutcomeCalibration::kMinRows) - 1);
  EXPECT_FALSE(calibration.summary().raw_error);
  const auto applied = calibration.apply(100.0, 10.0, 5.0, 1e9, 100);
  EXPECT_DOUBLE_EQ(applied.joules.mean, 100.0);
  EXPECT_DOUBLE_EQ(applied.joules.std, 10.0);
}

TEST(OutcomeCalibrationTest, a_device_that_always_uses_more_than_estimated_gets_corrected_means) {
  Device device{.relative_std = 0.1, .noise = 0.05, .bias = 1.5};
  const OutcomeCalibration calibration = learn(device, 30);
  const auto& summary = calibration.summary();
  ASSERT_TRUE(summary.raw_error && summary.corrected_error);
  EXPECT_NEAR(*summary.raw_error, 1.0 / 3.0, 0.05);  // every raw estimate was a third too low
  EXPECT_LT(*summary.corrected_error, 0.1);
  EXPECT_TRUE(summary.correction_active);
  // A new job inside the range of the rows: its estimate is raised to what such jobs used.
  const auto applied = calibration.apply(400.0, 40.0, 20.0, 400.0 * 1e7, 120);
  EXPECT_NEAR(applied.mean_factor, 1.5, 0.15);
  EXPECT_NEAR(applied.joules.mean, 600.0, 60.0);
}

TEST(OutcomeCalibrationTest, an_overconfident_model_gets_a_wider_band_that_covers_most_jobs) {
  // Claims ±1 %, is off by ±30 % (log σ): the raw ±2σ band almost never holds the truth.
  Device device{.relative_std = 0.01, .noise = 0.3, .bias = 1.0};
  const OutcomeCalibration calibration = learn(device, 60);
  const auto& summary = calibration.summary();
  ASSERT_TRUE(summary.raw_coverage && summary.calibrated_coverage);
  EXPECT_LT(*summary.raw_coverage, 0.2);
  EXPECT_GE(*summary.calibrated_coverage, 0.85);
  EXPECT_GT(summary.sigma_scale, 10.0);
  const auto applied = calibration.apply(100.0, 1.0, 5.0, 1e9, 100);
  EXPECT_GT(applied.joules.std, 30.0);
}

TEST(OutcomeCalibrationTest, an_underconfident_model_gets_a_narrower_band) {
  // Claims ±100 %, is off by ±2 %.
  Device device{.relative_std = 1.0, .noise = 0.02, .bias = 1.0};
  const OutcomeCalibration calibration = learn(device, 40);
  EXPECT_LT(calibration.summary().sigma_scale, 0.2);
  EXPECT_DOUBLE_EQ(*calibration.summary().raw_coverage, 1.0);
  const auto applied = calibration.apply(100.0, 100.0, 5.0, 1e9, 100);
  EXPECT_LT(applied.joules.std, 20.0);
}

TEST(OutcomeCalibrationTest, unbiased_noise_is_not_corrected_into_a_bias) {
  Device device{.relative_std = 0.2, .noise = 0.2, .bias = 1.0};
  const OutcomeCalibration calibration = learn(device, 60);
  const auto applied = calibration.apply(400.0, 80.0, 20.0, 400.0 * 1e7, 120);
  EXPECT_GT(applied.mean_factor, 0.85);
  EXPECT_LT(applied.mean_factor, 1.15);
  // Whatever it decides, both errors are reported, and it corrects only when that helps.
  ASSERT_TRUE(calibration.summary().raw_error && calibration.summary().corrected_error);
  EXPECT_EQ(calibration.summary().correction_active,
            *calibration.summary().corrected_error < *calibration.summary().raw_error);
}

TEST(OutcomeCalibrationTest, unusable_rows_are_refused_and_only_the_latest_rows_are_kept) {
  OutcomeCalibration calibration;
  Device device;
  OutcomeRow bad = device.job(0);
  bad.metered_joules = 0.0;
  EXPECT_FALSE(calibration.add(bad));
  bad = device.job(1);
  bad.estimated_joules = std::nan("");
  EXPECT_FALSE(calibration.add(bad));
  bad = device.job(2);
  bad.steps = 0;
  EXPECT_FALSE(calibration.add(bad));
  for (int i = 0; i < static_cast<int>(OutcomeCalibration::kMaxRows) + 10; ++i) calibration.add(device.job(i));
  EXPECT_EQ(calibration.rows().size(), OutcomeCalibration::kMaxRows);
  EXPECT_EQ(calibration.rows().front().job_id, "job-10");
}

namespace {

// Jobs of varied size that each pay a start-up cost the model knows nothing of (a process start
// and a framework import) and run for `epochs` epochs; the meter sees the steps (as estimated,
// with 3 % noise) plus the start-up, and the run lasts the estimated seconds plus its start.
std::vector<OutcomeRow> jobs_with_a_start_up(int count, double start_joules, double start_seconds) {
  std::mt19937 random{5};
  std::uniform_real_distribution<double> size(std::log(50.0), std::log(5000.0));
  std::normal_distribution<double> error(0.0, 0.03);
  std::vector<OutcomeRow> rows;
  for (int i = 0; i < count; ++i) {
    OutcomeRow row;
    row.job_id = "job-" + std::to_string(i);
    row.finished_ms = i;
    row.estimated_joules = std::exp(size(random));
    row.estimated_std = 0.1 * row.estimated_joules;
    row.estimated_seconds = row.estimated_joules / 20.0;
    row.flops_per_step = row.estimated_joules * 1e7;
    row.steps = 100 + i;
    row.epochs = 1 + i % 4;
    row.metered_joules = row.estimated_joules * std::exp(error(random)) + start_joules;
    row.metered_seconds = row.estimated_seconds * std::exp(error(random)) + start_seconds;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace

TEST(OutcomeCalibrationTest, a_start_up_cost_every_job_pays_becomes_a_line_of_its_own) {
  OutcomeCalibration calibration;
  EXPECT_EQ(calibration.add_all(jobs_with_a_start_up(30, 100.0, 5.0)), 30u);
  const auto& summary = calibration.summary();
  ASSERT_TRUE(summary.overhead_joules && summary.overhead_seconds);
  EXPECT_NEAR(summary.overhead_joules->at(2), 100.0, 25.0);
  EXPECT_NEAR(summary.overhead_seconds->at(2), 5.0, 1.5);
  EXPECT_TRUE(summary.correction_active);
  EXPECT_LT(*summary.corrected_error, 0.5 * *summary.raw_error);
  EXPECT_TRUE(summary.seconds_correction_active);
  EXPECT_LT(*summary.seconds_corrected_error, *summary.seconds_raw_error);
  // A small job: the start-up is most of it, and a factor on the steps could not say so.
  const auto small = calibration.apply(60.0, 6.0, 3.0, 60.0 * 1e7, 110, 2);
  EXPECT_FALSE(small.far_from_rows);
  EXPECT_NEAR(small.overhead_joules, 100.0, 25.0);
  EXPECT_NEAR(small.joules.mean, 160.0, 30.0);
  EXPECT_NEAR(small.overhead_seconds, 5.0, 1.5);
  EXPECT_NEAR(small.seconds, 8.0, 1.5);
  // A large one: the start-up is a few per cent.
  const auto large = calibration.apply(4000.0, 400.0, 200.0, 4000.0 * 1e7, 120, 2);
  EXPECT_NEAR(large.joules.mean, 4100.0, 200.0);
}

TEST(OutcomeCalibrationTest, a_job_far_from_every_row_keeps_the_models_mean) {
  OutcomeCalibration calibration;
  calibration.add_all(jobs_with_a_start_up(30, 100.0, 5.0));
  ASSERT_TRUE(calibration.summary().correction_active);
  // A thousand times the largest job any row had, at a hundred times the steps.
  const auto far = calibration.apply(5e6, 5e5, 2.5e5, 5e6 * 1e7, 100000, 2);
  EXPECT_TRUE(far.far_from_rows);
  EXPECT_DOUBLE_EQ(far.joules.mean, 5e6);
  EXPECT_DOUBLE_EQ(far.overhead_joules, 0.0);
  EXPECT_TRUE(std::isfinite(far.joules.std));
  EXPECT_GT(far.joules.std, 0.0);
}

TEST(OutcomeCalibrationTest, work_mix_sums_each_family_of_layer_kinds) {
  const auto mix = joule::estimator::work_mix({{"conv2d@input", 2.0},
                                               {"conv2d_grouped@hidden", 1.0},
                                               {"linear@output", 1.0},
                                               {"lstm@hidden", 2.0},
                                               {"transformer_encoder_layer@hidden", 1.0},
                                               {"optimizer:adam@output", 1.0},
                                               {"relu@hidden", 2.0},
                                               {"add@hidden", -1.0}});  // a negative line adds nothing
  ASSERT_TRUE(mix);
  EXPECT_DOUBLE_EQ(mix->convolution, 0.3);
  EXPECT_DOUBLE_EQ(mix->linear, 0.1);
  EXPECT_DOUBLE_EQ(mix->recurrent, 0.2);
  EXPECT_DOUBLE_EQ(mix->attention, 0.1);
  EXPECT_DOUBLE_EQ(mix->optimizer, 0.1);  // the other 0.2 is the activation's
  EXPECT_FALSE(joule::estimator::work_mix({}));
  EXPECT_FALSE(joule::estimator::work_mix({{"relu@hidden", 0.0}}));
}

// A device whose model over-estimates its convolutions and under-estimates its recurrent layers,
// on jobs of the same sizes: their size cannot tell them apart, their work mix can.
TEST(OutcomeCalibrationTest, a_model_that_misjudges_one_family_of_layers_is_corrected_by_the_jobs_work_mix) {
  std::mt19937 random{11};
  std::uniform_real_distribution<double> size(std::log(100.0), std::log(1000.0));
  std::normal_distribution<double> noise(0.0, 0.03);
  joule::estimator::WorkMix convolutions, recurrent;
  convolutions.convolution = 0.9;
  convolutions.linear = 0.1;
  recurrent.recurrent = 0.8;
  recurrent.linear = 0.2;
  const auto job = [&](int i, bool is_recurrent) {
    const double estimated = std::exp(size(random));
    OutcomeRow row;
    row.job_id = "job-" + std::to_string(i);
    row.estimated_joules = estimated;
    row.estimated_std = 0.1 * estimated;
    row.estimated_seconds = estimated / 20.0;
    row.flops_per_step = estimated * 1e7;
    row.steps = 100;
    row.metered_joules = (is_recurrent ? 1.5 : 0.7) * estimated * std::exp(noise(random));
    row.mix = is_recurrent ? recurrent : convolutions;
    return row;
  };
  OutcomeCalibration calibration;
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(calibration.add(job(i, i % 2 == 1)));
  const auto& summary = calibration.summary();
  EXPECT_TRUE(summary.correction_active);
  EXPECT_TRUE(summary.uses_work_mix);
  EXPECT_LT(*summary.corrected_error, 0.1);
  EXPECT_GT(*summary.raw_error, 0.3);
  const auto lstm = calibration.apply(300.0, 30.0, 15.0, 3e9, 100, 1, recurrent);
  const auto cnn = calibration.apply(300.0, 30.0, 15.0, 3e9, 100, 1, convolutions);
  EXPECT_NEAR(lstm.mean_factor, 1.5, 0.15);
  EXPECT_NEAR(cnn.mean_factor, 0.7, 0.1);

  // Rows that lost their layers: the size alone, and a job without a mix gets the rows' mean.
  OutcomeCalibration without;
  for (int i = 0; i < 20; ++i) {
    auto row = job(i, i % 2 == 1);
    row.mix.reset();
    ASSERT_TRUE(without.add(row));
  }
  EXPECT_FALSE(without.summary().uses_work_mix);
  EXPECT_GT(*without.summary().corrected_error, 0.2);
}
