#include "joule/estimator/drift.hpp"

#include <gtest/gtest.h>

namespace joule::estimator {

TEST(DriftDetectorTest, jobs_inside_their_two_sigma_band_never_drift) {
  DriftDetector detector;
  for (int i = 0; i < 20; ++i) {
    const auto verdict = detector.observe(i % 2 ? 115.0 : 88.0, 100.0, 10.0);  // ±2σ ≈ ±19 %
    EXPECT_FALSE(verdict.miss);
    EXPECT_FALSE(verdict.drift);
  }
}

TEST(DriftDetectorTest, one_outlier_is_not_drift_two_of_three_are) {
  DriftDetector detector;
  EXPECT_TRUE(detector.observe(150.0, 100.0, 10.0).miss);
  EXPECT_TRUE(detector.observe(150.0, 100.0, 10.0).drift);  // the second miss: drift
  detector.reset();
  EXPECT_FALSE(detector.observe(150.0, 100.0, 10.0).drift);
  EXPECT_FALSE(detector.observe(101.0, 100.0, 10.0).drift);
  EXPECT_FALSE(detector.observe(99.0, 100.0, 10.0).drift);  // the first miss has left the window
  EXPECT_FALSE(detector.observe(40.0, 100.0, 10.0).drift);
  EXPECT_TRUE(detector.observe(45.0, 100.0, 10.0).drift);  // under-use drifts too
}

TEST(DriftDetectorTest, a_very_sure_model_still_allows_ten_percent) {
  DriftDetector detector;
  const auto within = detector.observe(109.0, 100.0, 0.1);
  EXPECT_FALSE(within.miss);
  EXPECT_NEAR(within.relative_error, 0.09, 1e-12);
  EXPECT_TRUE(detector.observe(112.0, 100.0, 0.1).miss);
}

TEST(DriftDetectorTest, nonsense_inputs_are_ignored) {
  DriftDetector detector;
  EXPECT_FALSE(detector.observe(0.0, 100.0, 1.0).miss);
  EXPECT_FALSE(detector.observe(100.0, -1.0, 1.0).miss);
  EXPECT_EQ(detector.misses(), 0u);
}

}  // namespace joule::estimator
