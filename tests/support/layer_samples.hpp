#pragma once
// Probe samples written by hand for estimator tests: a layer's features and counts as a real
// probe plan analyses them, with the joules a test chooses.

#include <cstdint>

#include <gtest/gtest.h>

#include "joule/estimator/thor_probes.hpp"

namespace joule::testing {

/// A sample of a linear output layer (10 classes) on `features` inputs at batch 32 that cost
/// `joules` per step, and a tenth of that in seconds.
inline estimator::LayerSample linear_output_sample(std::int64_t features, double joules) {
  estimator::ProbeTarget target;
  target.layer = estimator::LayerSpec{"linear", {{"out_features", 10}}, {}, {}};
  target.input_shape = {features};
  target.batch_size = 32;
  target.position = estimator::LayerPosition::output;
  auto plan = estimator::plan_probe(target);
  EXPECT_TRUE(plan);
  estimator::LayerSample sample;
  sample.key = estimator::LayerKey{"linear", estimator::LayerPosition::output};
  sample.features = plan->analyzed.features;
  sample.features["batch_size"] = 32;
  sample.cost = plan->analyzed.cost;
  sample.joules_per_step = joules;
  sample.seconds_per_step = joules / 10.0;
  return sample;
}

}  // namespace joule::testing
