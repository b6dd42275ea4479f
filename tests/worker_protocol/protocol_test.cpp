#include "joule/worker/protocol.hpp"

#include "joule/common/energy_source.hpp"

#include <gtest/gtest.h>

#include "example_models.hpp"

namespace joule::worker {
namespace {

using nlohmann::json;

json lenet_request() {
  return {{"device", "cpu"},   {"threads", 1},
          {"batch_size", 4},   {"optimizer", "adam"},
          {"warmup_steps", 2}, {"steps_per_repetition", 3},
          {"repetitions", 2},  {"meter", "modelled"},
          {"idle_watts", 5.0}, {"watts_per_busy_core", 7.5},
          {"seed", 42},        {"networks", {testing::example_model("lenet5")}}};
}

ProbeResult sample_result() {
  ProbeResult result;
  result.environment = {"1.13.0", "OpenBLAS 0.3.21 (/usr/lib/libblas.so.3)", 2, "cpu", "Some CPU"};
  result.meter_source = "modelled";
  result.measured = false;
  result.batch_size = 16;
  result.optimizer = "adam";
  result.warmup_steps = 3;
  result.steps_per_repetition = 7;
  result.wall_seconds = 1.5;
  NetworkResult network;
  network.name = "lenet5";
  network.repetitions = {{0.5, 0.01}, {0.6, 0.012}, {0.55, 0.011}};
  network.joules_per_step = 0.55;
  network.seconds_per_step = 0.011;
  network.joules_spread = 0.1 / 0.55;
  network.seconds_spread = 0.002 / 0.011;
  network.final_loss = 2.3;
  result.networks = {network};
  return result;
}

TEST(ProtocolTest, probe_request_round_trips) {
  auto request = parse_probe_request(lenet_request());
  ASSERT_TRUE(request) << request.error().message;
  EXPECT_EQ(request->optimizer, "adam");
  EXPECT_EQ(request->batch_size, 4);
  EXPECT_EQ(request->seed, 42u);
  ASSERT_EQ(request->networks.size(), 1u);
  EXPECT_EQ(request->networks[0].name, "lenet5");
  auto again = parse_probe_request(to_json(*request));
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(to_json(*again), to_json(*request));
}

TEST(ProtocolTest, probe_request_defaults_everything_but_networks) {
  auto request = parse_probe_request({{"networks", {testing::example_model("mlp")}}});
  ASSERT_TRUE(request) << request.error().message;
  const ProbeRequest defaults;
  EXPECT_EQ(request->device, defaults.device);
  EXPECT_EQ(request->threads, defaults.threads);
  EXPECT_EQ(request->steps_per_repetition, defaults.steps_per_repetition);
  EXPECT_EQ(request->meter, "auto");
}

TEST(ProtocolTest, probe_request_errors_name_the_pointer) {
  const auto where = [](json request) {
    auto parsed = parse_probe_request(request);
    EXPECT_FALSE(parsed);
    return parsed ? std::string("(parsed)") : parsed.error().where;
  };
  json request = lenet_request();
  request["threads"] = 0;
  EXPECT_EQ(where(request), "/threads");
  request = lenet_request();
  request["device"] = "gpu";
  EXPECT_EQ(where(request), "/device");
  request = lenet_request();
  request["optimizer"] = "lion";
  EXPECT_EQ(where(request), "/optimizer");
  request = lenet_request();
  request["network_optimizers"] = {"adam", "sgd"};  // two optimizers for one network
  EXPECT_EQ(where(request), "/network_optimizers");
  request = lenet_request();
  request["network_optimizers"] = {"lion"};
  EXPECT_EQ(where(request), "/network_optimizers/0");
  request = lenet_request();
  request["network_optimizers"] = {"rmsprop"};
  auto per_network = parse_probe_request(request);
  ASSERT_TRUE(per_network) << per_network.error().message;
  EXPECT_EQ(per_network->optimizer_of(0), "rmsprop");
  request = lenet_request();
  request["meter"] = "wattmeter";
  EXPECT_EQ(where(request), "/meter");
  request = lenet_request();
  request["repetiton"] = 3;
  EXPECT_EQ(where(request), "/repetiton");
  request = lenet_request();
  request.erase("networks");
  EXPECT_EQ(where(request), "/networks");
  request = lenet_request();
  request["networks"][0]["layers"][3]["out_channels"] = -1;
  EXPECT_EQ(where(request), "/networks/0/layers/3/out_channels");
  // Shapes that do not fit fail at the layer, with the estimator's reason.
  request = lenet_request();
  request["networks"][0]["layers"].erase(6);  // the flatten before the first linear
  auto parsed = parse_probe_request(request);
  ASSERT_FALSE(parsed);
  EXPECT_EQ(parsed.error().where.rfind("/networks/0/layers/6", 0), 0u) << parsed.error().where;
  EXPECT_NE(parsed.error().message.find("layer 6"), std::string::npos) << parsed.error().message;
  EXPECT_EQ(where(json::array()), "");
}

TEST(ProtocolTest, probe_result_round_trips) {
  const ProbeResult result = sample_result();
  const json out = to_json(result);
  EXPECT_EQ(out["environment"]["fingerprint"], result.environment.fingerprint());
  auto parsed = parse_probe_result(out);
  ASSERT_TRUE(parsed) << parsed.error().where << ": " << parsed.error().message;
  EXPECT_EQ(to_json(*parsed), out);
  EXPECT_EQ(parsed->networks[0].repetitions.size(), 3u);
  EXPECT_EQ(parsed->environment.threads, 2);
}

TEST(ProtocolTest, probe_result_errors_name_the_pointer) {
  json out = to_json(sample_result());
  out["networks"][0]["repetitions"][1]["seconds_per_step"] = "fast";
  auto parsed = parse_probe_result(out);
  ASSERT_FALSE(parsed);
  EXPECT_EQ(parsed.error().where, "/networks/0/repetitions/1/seconds_per_step");

  out = to_json(sample_result());
  out["environment"].erase("threads");
  out["environment"]["threads"] = 0;
  parsed = parse_probe_result(out);
  ASSERT_FALSE(parsed);
  EXPECT_EQ(parsed.error().where, "/environment/threads");

  out = to_json(sample_result());
  out.erase("meter_source");
  parsed = parse_probe_result(out);
  ASSERT_FALSE(parsed);
  EXPECT_EQ(parsed.error().where, "/meter_source");
}

TEST(ProtocolTest, modelled_joules_are_never_called_measured) {
  json out = to_json(sample_result());
  out["measured"] = true;
  auto parsed = parse_probe_result(out);
  ASSERT_FALSE(parsed);
  EXPECT_EQ(parsed.error().where, "/measured");
  out["meter_source"] = "rapl";
  EXPECT_TRUE(parse_probe_result(out));
}

TEST(ProtocolTest, median_and_spread) {
  EXPECT_DOUBLE_EQ(median_of({3.0, 1.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(median_of({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_DOUBLE_EQ(median_of({}), 0.0);
  EXPECT_DOUBLE_EQ(spread_of({1.0, 2.0, 3.0}), 1.0);
  EXPECT_DOUBLE_EQ(spread_of({5.0}), 0.0);
  EXPECT_DOUBLE_EQ(spread_of({0.0, 0.0}), 0.0);
}

TEST(ProtocolTest, measured_sources) {
  for (const char* source : {"rapl", "nvml", "ina3221", "hwmon", "battery"}) EXPECT_TRUE(joule::is_measurement(source));
  for (const char* source : {"modelled", "simulated", "", "RAPL"}) EXPECT_FALSE(joule::is_measurement(source));
}

TEST(ProtocolTest, fingerprints_differ_by_blas_and_threads) {
  WorkerEnvironment a{"1.13.0", "OpenBLAS 0.3.21", 1, "cpu", "Xeon"};
  WorkerEnvironment b = a;
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  b.blas = "reference BLAS";
  EXPECT_NE(a.fingerprint(), b.fingerprint());
  b = a;
  b.threads = 2;
  EXPECT_NE(a.fingerprint(), b.fingerprint());
}

TEST(ProtocolTest, runtime_result_round_trips_and_its_errors_name_the_pointer) {
  RuntimeProbeResult result;
  result.environment = sample_result().environment;
  result.interpreter = "/usr/bin/python3";
  result.version = "Python 3.11.2, torch 1.13.0";
  result.meter_source = "rapl";
  result.measured = true;
  result.steps = {
      {3, 4e-3, 4e-4, 2e-3, 2e-4, 0.05}, {9, 9e-3, 9e-4, 5e-3, 5e-4, 0.04}, {10, 9e-3, 9e-4, 5e-3, 5e-4, 0.04}};
  result.steps[2].kind = "conv2d";
  result.steps[2].kind_layers = 8;
  result.starts = {{30.0, 1.5}};
  result.joules = 80.0;
  result.wall_seconds = 9.0;
  const json out = to_json(result);
  auto parsed = parse_runtime_probe_result(out);
  ASSERT_TRUE(parsed) << parsed.error().where << ": " << parsed.error().message;
  EXPECT_EQ(to_json(*parsed), out);

  json bad = out;
  bad["steps"][1]["worker_seconds_per_step"] = "quick";
  auto refused = parse_runtime_probe_result(bad);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().where, "/steps/1/worker_seconds_per_step");
  bad = out;
  bad["starts"][0].erase("seconds");
  refused = parse_runtime_probe_result(bad);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().where, "/starts/0/seconds");
  // A kind's reading says how many of its layers its network holds, no more than its modules.
  bad = out;
  bad["steps"][2].erase("kind_layers");
  refused = parse_runtime_probe_result(bad);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().where, "/steps/2/kind_layers");
  bad["steps"][2]["kind_layers"] = 11;
  refused = parse_runtime_probe_result(bad);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().where, "/steps/2/kind_layers");
  // A modelled meter's joules are never a measurement.
  bad = out;
  bad["meter_source"] = "modelled";
  refused = parse_runtime_probe_result(bad);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().where, "/measured");
}

}  // namespace
}  // namespace joule::worker
