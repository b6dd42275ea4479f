#include "joule/daemon/model_service.hpp"

#include <chrono>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>

#include "joule/common/energy_source.hpp"
#include "joule/estimator/layer_analysis.hpp"
#include "joule/estimator/simulated_device.hpp"

namespace joule::daemon {

namespace asio = boost::asio;
using nlohmann::json;

ModelService::ModelService(asio::io_context& io, adapters::StorageWriter& storage, Metrics& metrics,
                           std::function<void()> on_change, const Clock& clock)
    : io_(io), storage_(storage), metrics_(metrics), clock_(clock), on_change_(std::move(on_change)) {}

ModelService::~ModelService() {
  *alive_ = false;
  stopping_ = true;
  if (worker_.joinable()) worker_.join();
}

std::vector<estimator::WorkloadItem> ModelService::starter_workload() {
  const char* specs[] = {
      R"({"input": {"shape": [1, 28, 28]}, "layers": [
        {"type": "conv2d", "out_channels": 6, "kernel_size": 5, "padding": 2}, {"type": "relu"},
        {"type": "maxpool2d", "kernel_size": 2}, {"type": "conv2d", "out_channels": 16, "kernel_size": 5},
        {"type": "relu"}, {"type": "maxpool2d", "kernel_size": 2}, {"type": "flatten"},
        {"type": "linear", "out_features": 120}, {"type": "relu"}, {"type": "linear", "out_features": 84},
        {"type": "relu"}, {"type": "linear", "out_features": 10}]})",
      R"({"input": {"shape": [3, 32, 32]}, "layers": [
        {"type": "conv2d", "out_channels": 32, "kernel_size": 3, "padding": 1}, {"type": "relu"},
        {"type": "maxpool2d", "kernel_size": 2}, {"type": "conv2d", "out_channels": 64, "kernel_size": 3, "padding": 1},
        {"type": "relu"}, {"type": "maxpool2d", "kernel_size": 2}, {"type": "flatten"},
        {"type": "linear", "out_features": 10}]})",
      R"({"input": {"shape": [784]}, "layers": [
        {"type": "linear", "out_features": 256}, {"type": "relu"}, {"type": "linear", "out_features": 10}]})"};
  std::vector<estimator::WorkloadItem> out;
  for (const char* text : specs) {
    auto spec = estimator::parse_model_spec(json::parse(text), "/model");
    if (spec) out.push_back(estimator::WorkloadItem{*spec, 64});
  }
  return out;
}

void ModelService::install(const std::string& device, std::shared_ptr<const estimator::DeviceEnergyModel> model,
                           std::int64_t version) {
  for (const auto& [layer, count] : model->sample_counts())
    metrics_.set_model_samples(device, layer, static_cast<double>(count));
  models_[device] = std::move(model);
  versions_[device] = version;
  probing_[device] = false;
  if (on_change_) on_change_();
}

void ModelService::withdraw(const std::string& device) {
  models_.erase(device);
  if (on_change_) on_change_();
}

std::int64_t ModelService::version(const std::string& device) const {
  const auto it = versions_.find(device);
  return it == versions_.end() ? 0 : it->second;
}

void ModelService::keep(const std::string& device, const json& snapshot, std::int64_t version,
                        const std::string& source, std::shared_ptr<const estimator::DeviceEnergyModel> model) {
  adapters::StoredModelSnapshot stored{device, version, clock_.unix_ms(), source, snapshot.dump()};
  storage_.submit([stored](adapters::Database& db) { return db.save_model_snapshot(stored); },
                  [device](Status s) {
                    if (!s) spdlog::error("device {}: saving its model failed: {}", device, s.error().message);
                  });
  install(device, std::move(model), version);
}

void ModelService::start(const std::vector<adapters::StoredModelSnapshot>& snapshots,
                         std::vector<ProbeableDevice> devices, std::vector<estimator::WorkloadItem> workload) {
  for (const auto& snapshot : snapshots) {
    auto model = estimator::DeviceEnergyModel::load(json::parse(snapshot.snapshot_json, nullptr, false));
    if (!model) {
      spdlog::warn("device {}: stored energy model is unreadable ({}); it will be learnt again", snapshot.device,
                   model.error().message);
      continue;
    }
    spdlog::info("device {}: energy model version {} loaded ({} source)", snapshot.device, snapshot.version,
                 snapshot.source);
    install(snapshot.device, std::make_shared<const estimator::DeviceEnergyModel>(std::move(model).value()),
            snapshot.version);
  }
  std::erase_if(devices, [this](const ProbeableDevice& d) { return models_.contains(d.name); });
  if (devices.empty()) return;
  for (const auto& device : devices) probing_[device.name] = true;
  auto starter = starter_workload();
  workload.insert(workload.end(), starter.begin(), starter.end());
  // A simulated device learns every optimizer's step too (cheap here; real devices probe the
  // optimizers their jobs name).
  for (const auto& optimizer : estimator::known_optimizers())
    if (optimizer != "sgd" && !starter.empty())
      workload.push_back(estimator::WorkloadItem{starter.front().model, 64, optimizer});
  worker_ = std::thread([this, devices = std::move(devices), workload = std::move(workload), alive = alive_] {
    for (const auto& device : devices) {
      if (stopping_) return;
      const auto started = std::chrono::steady_clock::now();
      auto profile = estimator::find_simulated_profile(device.profile);
      if (!profile) continue;
      estimator::SimulatedDevice simulator(*profile, std::hash<std::string>{}(device.name));
      const estimator::NetworkMeter meter = estimator::simulated_network_meter(simulator);
      auto model = std::make_shared<estimator::DeviceEnergyModel>(device.name, "simulated");
      estimator::CampaignOptions options;
      options.probes = device.probes;
      options.gp.restarts = 1;
      auto report = estimator::run_campaign(*model, workload, meter, options);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      asio::post(io_, [this, alive, device, model, report, seconds]() mutable {
        if (!*alive) return;
        if (!report) {
          probing_[device.name] = false;
          spdlog::error("device {}: probe campaign failed: {}", device.name, report.error().message);
          return;
        }
        const std::int64_t version = versions_[device.name] + 1;
        metrics_.add_probe_runs(device.name, static_cast<double>(report->probes));
        spdlog::info("device {}: energy model version {} learnt from {} simulated probes ({} networks) in {:.1f} s",
                     device.name, version, report->probes, report->networks_measured, seconds);
        adapters::StoredModelSnapshot snapshot{device.name, version, clock_.unix_ms(), "simulated",
                                               model->save().dump()};
        storage_.submit([snapshot](adapters::Database& db) { return db.save_model_snapshot(snapshot); },
                        [name = device.name](Status s) {
                          if (!s) spdlog::error("device {}: saving its model failed: {}", name, s.error().message);
                        });
        install(device.name, std::move(model), version);
      });
    }
  });
}

json ModelService::model_info(const std::string& device) const {
  const auto it = models_.find(device);
  const auto probing = probing_.find(device);
  json info;
  if (it == models_.end() || !it->second) {
    const bool busy = probing != probing_.end() && probing->second;
    info = {{"state", busy ? "probing" : "none"},
            {"samples", 0},
            {"note", busy ? "learning its energy model from probes"
                          : "no energy model yet: it is learnt from probes when the device is idle"}};
  } else {
    std::size_t samples = 0;
    for (const auto& [key, count] : it->second->sample_counts()) samples += count;
    info = {{"state", "ready"},
            {"samples", samples},
            {"version", versions_.at(device)},
            {"source", it->second->source()},
            {"layers", it->second->sample_counts()}};
    if (!it->second->unresolved().empty()) info["unresolved"] = it->second->unresolved();
    // What a job's runtime adds (Python's start-up and per-step work), as measured here.
    json runtimes = json::object();
    for (const auto& [name, cost] : it->second->runtimes()) {
      json entry = estimator::to_json(cost);
      entry["measured"] = is_measurement(cost.source);
      runtimes[name] = std::move(entry);
    }
    info["runtimes"] = std::move(runtimes);
  }
  if (probe_info_) {
    const json probing = probe_info_(device);
    for (const auto& [key, value] : probing.items()) info[key] = value;
  }
  return info;
}

}  // namespace joule::daemon
