// libFuzzer target: the cluster sync exchange (POST /v1/cluster/sync) from both ends: a request
// as an agent sends it to the coordinator, a reply as the coordinator sends it to an agent, and
// the energy-model snapshots agents upload, which the coordinator loads and estimates with.

#include <cstddef>
#include <cstdint>

#include "fuzz_support.hpp"
#include "joule/cluster/sync.hpp"
#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/model_spec.hpp"

namespace {

using joule::fuzz::require;
namespace est = joule::estimator;

// A small convolutional network to estimate with an uploaded model, as the coordinator does for
// every submission once a device has a model.
const est::ModelSpec& probe_model() {
  static const est::ModelSpec model =
      *est::parse_model_spec(nlohmann::json::parse(R"({"input": {"shape": [1, 28, 28]}, "layers": [
        {"type": "conv2d", "out_channels": 4, "kernel_size": 3}, {"type": "relu"}, {"type": "flatten"},
        {"type": "linear", "out_features": 10}]})"),
                             "/model");
  return model;
}

void exercise_snapshot(const nlohmann::json& snapshot) {
  auto model = est::DeviceEnergyModel::load(snapshot);
  if (!model) return;
  est::TrainingConfig training;
  training.samples_per_epoch = 320;
  if (auto estimate = model->estimate(probe_model(), training)) (void)est::to_json(*estimate).dump();
  (void)model->sample_counts();
  // The coordinator keeps what it loaded and an agent saves it again: it must load back.
  const nlohmann::json saved = model->save();
  auto again = est::DeviceEnergyModel::load(nlohmann::json::parse(saved.dump()));
  require(again.ok(), "a loaded energy model does not load again after save()", again ? "" : again.error().message);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const nlohmann::json body = joule::fuzz::parse_json(data, size);
  if (body.is_discarded()) return 0;

  if (auto request = joule::cluster::parse_sync_request(body)) {
    const nlohmann::json json = joule::cluster::to_json(*request);
    auto again = joule::cluster::parse_sync_request(nlohmann::json::parse(json.dump()));
    require(again.ok(), "a sync request does not parse from its own JSON", again ? json.dump() : again.error().message);
    require(joule::cluster::to_json(*again) == json, "a sync request does not round-trip", json.dump());
    for (const auto& upload : request->models) exercise_snapshot(upload.snapshot);
  }
  if (auto reply = joule::cluster::parse_sync_reply(body)) {
    const nlohmann::json json = joule::cluster::to_json(*reply);
    auto again = joule::cluster::parse_sync_reply(nlohmann::json::parse(json.dump()));
    require(again.ok(), "a sync reply does not parse from its own JSON", again ? json.dump() : again.error().message);
    require(joule::cluster::to_json(*again) == json, "a sync reply does not round-trip", json.dump());
    (void)joule::cluster::digest_of(reply->jobs);
  }
  // A bare snapshot too, so the fuzzer need not wrap every model in a request to reach load().
  if (body.is_object() && body.contains("models") && body.contains("device")) exercise_snapshot(body);
  return 0;
}
