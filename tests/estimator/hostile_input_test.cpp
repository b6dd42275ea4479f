// Inputs that libFuzzer found to break the estimator (fuzz/README.md): absurd training counts,
// and energy-model snapshots (from SQLite or an agent's upload) whose parts do not fit together.

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/gaussian_process.hpp"
#include "joule/estimator/model_spec.hpp"

using namespace joule::estimator;
using nlohmann::json;

namespace {

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// A fitted model of one layer kind: three samples of a linear layer at three widths.
DeviceEnergyModel small_model() {
  DeviceEnergyModel model("cpu", "simulated");
  for (double width : {16.0, 64.0, 256.0}) {
    LayerSample sample;
    sample.key = LayerKey{"linear", LayerPosition::output};
    sample.features = {{"in_features", width}, {"out_features", 10.0}, {"batch_size", 32.0}};
    sample.joules_per_step = 1e-4 * width;
    sample.seconds_per_step = 1e-5 * width;
    EXPECT_TRUE(model.add_sample(sample));
  }
  GpFitOptions options;
  options.restarts = 0;
  EXPECT_TRUE(model.fit(options).ok());
  return model;
}

}  // namespace

TEST(TrainingConfigTest, absurd_step_counts_are_refused_not_overflowed) {
  // Found by fuzz/model_spec: ceil(samples / batch) as (samples + batch - 1) / batch, and
  // epochs × that, overflowed int64 (undefined behaviour) for counts near INT64_MAX.
  const auto huge =
      parse_training_config(json::parse(R"({"batch_size": 9223372036854775807, "epochs": 9223372036854775807,
                      "samples_per_epoch": 9223372036854775807})"),
                            "/training");
  ASSERT_FALSE(huge);
  EXPECT_EQ(huge.error().where, "/training");
  EXPECT_NE(huge.error().message.find("steps"), std::string::npos) << huge.error().message;

  json at_limit = {{"batch_size", 1}, {"epochs", 1}, {"samples_per_epoch", kMaxTrainingSteps}};
  ASSERT_TRUE(parse_training_config(at_limit, "/training"));
  at_limit["samples_per_epoch"] = kMaxTrainingSteps + 1;
  EXPECT_FALSE(parse_training_config(at_limit, "/training"));

  TrainingConfig in_code;
  in_code.batch_size = kInt64Max;
  in_code.samples_per_epoch = kInt64Max;
  in_code.epochs = 3;
  EXPECT_EQ(steps_of(in_code), 3);
  in_code.batch_size = 1;
  EXPECT_EQ(steps_of(in_code), kInt64Max);  // saturated
  in_code.samples_per_epoch = 0;
  EXPECT_EQ(steps_of(in_code), 0);
}

TEST(GaussianProcessTest, load_refuses_dimensions_its_rows_do_not_have) {
  // Found by fuzz/cluster_sync: "dimensions": 2^62 sized an n × 2^62 matrix before any row was
  // checked, and std::bad_alloc escaped load() (an agent's upload reaches it).
  json saved = small_model().save()["models"]["linear@output"]["energy"];
  ASSERT_TRUE(GaussianProcess::load(saved));
  saved["dimensions"] = std::int64_t{1} << 62;
  const auto loaded = GaussianProcess::load(saved);
  ASSERT_FALSE(loaded);
  EXPECT_NE(loaded.error().message.find("wrong size"), std::string::npos) << loaded.error().message;
}

TEST(DeviceEnergyModelTest, load_refuses_snapshots_whose_parts_disagree) {
  const json saved = small_model().save();
  ASSERT_TRUE(DeviceEnergyModel::load(saved));

  json fewer_names = saved;
  fewer_names["models"]["linear@output"]["names"].erase(0);
  json short_energies = saved;
  short_energies["models"]["linear@output"]["log_joules"].erase(0);
  json long_row = saved;
  long_row["models"]["linear@output"]["x"][1].push_back(1.0);
  json no_time = saved;  // estimate() would have predicted with an empty std::optional
  no_time["models"]["linear@output"].erase("time");
  for (const auto& bad : {fewer_names, short_energies, long_row, no_time}) {
    const auto loaded = DeviceEnergyModel::load(bad);
    ASSERT_FALSE(loaded) << bad.dump();
    EXPECT_NE(loaded.error().message.find("linear@output"), std::string::npos) << loaded.error().message;
  }
}
