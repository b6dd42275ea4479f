// A device model's estimates at its knob settings, from whole networks measured at a setting and
// at the defaults (DeviceEnergyModel::settings, SettingLine), on the simulated laptop CPU whose
// frequency cap changes a step's time and energy as its hidden curve says.
#include <gtest/gtest.h>

#include <cmath>

#include "example_models.hpp"
#include "noise_free_meter.hpp"

#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/probe_campaign.hpp"
#include "joule/estimator/simulated_device.hpp"

using namespace joule::estimator;
using joule::testing::noise_free_meter;

namespace {

ModelSpec example(const std::string& name) { return *parse_model_spec(joule::testing::example_model(name), "/model"); }

TrainingConfig steps_of(std::int64_t batch, std::int64_t steps) {
  return TrainingConfig{batch, 1, batch * steps, "sgd", std::nullopt};
}

struct LaptopWithKnob {
  SimulatedDevice device{*find_simulated_profile("laptop-cpu"), 4};
  DeviceEnergyModel model{"sim:laptop-cpu", "simulated"};
  const SimulatedKnob& knob = device.profile().knob;
  LaptopWithKnob() {
    CampaignOptions options;
    options.probes = 60;
    options.gp.restarts = 1;
    EXPECT_TRUE(run_campaign(model, {WorkloadItem{example("lenet5"), 64}, WorkloadItem{example("mlp"), 64}},
                             noise_free_meter(device), options));
  }
  KnobSetting setting(std::size_t index) const {
    return KnobSetting{knob.name, knob.settings.at(index).value, knob.settings.at(index).label};
  }
  // One network read on the simulated hardware for a few steps, at a setting (0: the defaults).
  WholeNetworkSample measure(const std::string& name, std::int64_t batch, std::size_t setting) {
    WholeNetworkSample sample;
    sample.model = example(name);
    sample.signature = network_signature(sample.model);
    const auto layers = *analyze_model(sample.model, batch);
    sample.family = network_family(layers);
    sample.batch_size = batch;
    const StepCost step = device.step_cost(layers, sample.model.loss, "sgd", knob.settings.at(setting));
    sample.joules_per_step = step.joules;
    sample.seconds_per_step = step.seconds;
    sample.joules_spread = 0.06;
    sample.seconds_spread = 0.06;
    sample.measured_ms = 1'700'000'000'000 + static_cast<std::int64_t>(setting);
    if (setting > 0) sample.setting = this->setting(setting);
    return sample;
  }
  double true_ratio(const std::string& name, std::int64_t batch, std::size_t setting, bool energy) {
    const auto layers = *analyze_model(example(name), batch);
    const std::string loss = example(name).loss;
    const StepCost base = device.step_cost(layers, loss, "sgd", knob.settings.at(0));
    const StepCost at = device.step_cost(layers, loss, "sgd", knob.settings.at(setting));
    return energy ? at.joules / base.joules : at.seconds / base.seconds;
  }
};

const SettingLine* line_at(const Estimate& estimate, const KnobSetting& setting) {
  for (const auto& line : estimate.settings)
    if (line.setting == setting) return &line;
  return nullptr;
}

}  // namespace

TEST(SettingEstimatesTest, a_network_measured_at_a_setting_and_at_the_defaults_is_estimated_there_by_their_ratio) {
  LaptopWithKnob laptop;
  ASSERT_EQ(laptop.knob.name, "cpu_max_frequency_mhz");
  // At the setting alone: nothing to compare it with, so nothing is said of it.
  ASSERT_TRUE(laptop.model.add_whole_network(laptop.measure("lenet5", 64, 3)));
  auto alone = laptop.model.estimate(example("lenet5"), steps_of(64, 100));
  ASSERT_TRUE(alone);
  EXPECT_TRUE(alone->settings.empty());
  ASSERT_EQ(laptop.model.settings().size(), 1u);
  EXPECT_EQ(laptop.model.settings().begin()->second.networks, 0u);

  ASSERT_TRUE(laptop.model.add_whole_network(laptop.measure("lenet5", 64, 0)));
  auto estimate = laptop.model.estimate(example("lenet5"), steps_of(64, 100));
  ASSERT_TRUE(estimate) << estimate.error().message;
  ASSERT_EQ(estimate->settings.size(), 1u);
  const SettingLine& line = estimate->settings.front();
  EXPECT_EQ(line.basis, "measured");
  EXPECT_EQ(line.setting.label, laptop.knob.settings[3].label);
  EXPECT_NEAR(line.joules_ratio, laptop.true_ratio("lenet5", 64, 3, true), 1e-9);
  EXPECT_NEAR(line.seconds_ratio, laptop.true_ratio("lenet5", 64, 3, false), 1e-9);
  // A lower clock: slower; the simulated laptop's voltage falls enough that it saves energy.
  EXPECT_GT(line.seconds_ratio, 1.05);
  EXPECT_LT(line.joules_ratio, 0.95);
  // The job at the setting: its estimate at the defaults times the ratio, its spread both's.
  EXPECT_NEAR(line.joules.mean, estimate->joules.mean * line.joules_ratio, 1e-9 * line.joules.mean);
  EXPECT_NEAR(line.seconds.mean, estimate->seconds.mean * line.seconds_ratio, 1e-9 * line.seconds.mean);
  EXPECT_GT(line.joules.std / line.joules.mean, estimate->joules.std / estimate->joules.mean);
  EXPECT_NEAR(line.joules_log_std, std::hypot(0.03, 0.03), 1e-9);  // half of each reading's spread
  EXPECT_EQ(to_json(*estimate)["settings"][0]["basis"], "measured");
  EXPECT_EQ(to_json(*estimate)["settings"][0]["knob"], "cpu_max_frequency_mhz");

  // The device's drift between two readings widens the ratio's spread; a measurement at a
  // setting is no whole measurement of the network's cost, and joins no family gap.
  laptop.model.set_speed_spread(0.05);
  auto drifting = laptop.model.estimate(example("lenet5"), steps_of(64, 100));
  EXPECT_NEAR(drifting->settings.front().joules_log_std, std::hypot(0.03, 0.03, std::sqrt(2.0) * 0.05), 1e-9);
  EXPECT_EQ(laptop.model.whole_network(network_signature(example("lenet5")), 64, "sgd")->setting, std::nullopt);
  ASSERT_TRUE(laptop.model.fit({}, 3));
  EXPECT_TRUE(laptop.model.whole_network_gaps().empty());
  // Another batch size was not measured at the setting: nothing there.
  EXPECT_TRUE(laptop.model.estimate(example("lenet5"), steps_of(32, 100))->settings.empty());
}

TEST(SettingEstimatesTest, networks_measured_at_a_setting_teach_its_response_to_one_that_was_not) {
  LaptopWithKnob laptop;
  for (const char* name : {"mlp", "mlp_wide", "cnn5", "vgg_small", "lenet5_wide"}) {
    ASSERT_TRUE(laptop.model.add_whole_network(laptop.measure(name, 32, 0)));
    ASSERT_TRUE(laptop.model.add_whole_network(laptop.measure(name, 32, 4)));
  }
  const KnobSetting lowest = laptop.setting(4);
  ASSERT_EQ(laptop.model.settings().at(lowest.key()).networks, 5u);
  ASSERT_TRUE(laptop.model.settings().at(lowest.key()).response);

  auto estimate = laptop.model.estimate(example("lenet5"), steps_of(64, 100));
  ASSERT_TRUE(estimate) << estimate.error().message;
  const SettingLine* line = line_at(*estimate, lowest);
  ASSERT_NE(line, nullptr);
  EXPECT_EQ(line->basis, "response");
  EXPECT_EQ(line->samples, 5u);
  const double time_truth = laptop.true_ratio("lenet5", 64, 4, false);
  const double energy_truth = laptop.true_ratio("lenet5", 64, 4, true);
  // Within its own stated spread (2σ) of the hidden truth, and no tighter than the floor.
  EXPECT_LT(std::abs(std::log(line->seconds_ratio / time_truth)), 2.0 * line->seconds_log_std + 0.05)
      << line->seconds_ratio << " vs " << time_truth;
  EXPECT_LT(std::abs(std::log(line->joules_ratio / energy_truth)), 2.0 * line->joules_log_std + 0.05)
      << line->joules_ratio << " vs " << energy_truth;
  EXPECT_GE(line->seconds_log_std, kResponseFloorSigma);

  // The snapshot carries the measurements; the response is learnt again from them.
  auto loaded = DeviceEnergyModel::load(laptop.model.save());
  ASSERT_TRUE(loaded) << loaded.error().message;
  ASSERT_TRUE(loaded->settings().at(lowest.key()).response);
  auto again = loaded->estimate(example("lenet5"), steps_of(64, 100));
  ASSERT_TRUE(again);
  ASSERT_NE(line_at(*again, lowest), nullptr);
  EXPECT_NEAR(line_at(*again, lowest)->joules_ratio, line->joules_ratio, 1e-9);
}

TEST(SettingEstimatesTest, a_saved_sample_with_a_bad_setting_is_refused_naming_the_field) {
  LaptopWithKnob laptop;
  auto sample = to_json(laptop.measure("mlp", 32, 2));
  EXPECT_EQ(sample["setting"]["knob"], "cpu_max_frequency_mhz");
  ASSERT_TRUE(whole_network_sample_from_json(sample));
  EXPECT_EQ(whole_network_sample_from_json(sample)->setting, laptop.setting(2));
  sample["setting"]["value"] = -3;
  auto refused = whole_network_sample_from_json(sample, "/whole_networks/0");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().where, "/whole_networks/0/setting/value");
}
