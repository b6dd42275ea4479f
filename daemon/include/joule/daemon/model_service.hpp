#pragma once
// Keeps each device's energy model for estimates: loaded from its SQLite snapshot at start;
// simulated devices ("sim:<profile>") learn theirs by a simulated probe campaign on a worker
// thread (never on the event loop); real devices get theirs from the ProbeService.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include "joule/adapters/database.hpp"
#include "joule/adapters/storage_writer.hpp"
#include "joule/common/clock.hpp"
#include "joule/daemon/estimates.hpp"
#include "joule/daemon/metrics.hpp"
#include "joule/estimator/probe_campaign.hpp"

namespace joule::daemon {

/// A device whose model can be learnt here: a simulated profile and a probe budget.
struct ProbeableDevice {
  std::string name;     ///< "sim:jetson-orin"
  std::string profile;  ///< "jetson-orin"
  std::size_t probes = 200;
};

class ModelService {
 public:
  /// `on_change` runs on the loop whenever a model is installed (to refresh the API's view).
  /// `clock`: the wall time stamped on saved snapshots.
  ModelService(boost::asio::io_context& io, adapters::StorageWriter& storage, Metrics& metrics,
               std::function<void()> on_change, const Clock& clock = system_clock());
  ~ModelService();  ///< waits for a campaign in progress (seconds at most)

  /// Installs stored snapshots, then probes every probeable device that has none, learning
  /// the layers of `workload` (recent jobs' models plus a starter set).
  void start(const std::vector<adapters::StoredModelSnapshot>& snapshots, std::vector<ProbeableDevice> devices,
             std::vector<estimator::WorkloadItem> workload);

  const DeviceModels& models() const { return models_; }
  /// Publishes a device's fitted model for estimates (on the loop thread).
  void install(const std::string& device, std::shared_ptr<const estimator::DeviceEnergyModel> model,
               std::int64_t version);
  /// Installs a model learnt elsewhere (an agent's, uploaded to its coordinator) and saves it, so
  /// that a restarted coordinator has it at once instead of asking every agent again.
  void keep(const std::string& device, const nlohmann::json& snapshot, std::int64_t version, const std::string& source,
            std::shared_ptr<const estimator::DeviceEnergyModel> model);
  /// Stops estimating with a device's model (learnt under conditions that no longer hold).
  void withdraw(const std::string& device);
  std::int64_t version(const std::string& device) const;
  /// Adds a device's probing state (from the ProbeService) to model_info().
  void set_probe_info(std::function<nlohmann::json(const std::string&)> info) { probe_info_ = std::move(info); }
  /// {"state": "none" | "probing" | "ready", "samples": N, "version": V, "source": ...}
  nlohmann::json model_info(const std::string& device) const;
  /// The networks a new node learns first: LeNet-5, a small CNN and an MLP.
  static std::vector<estimator::WorkloadItem> starter_workload();

 private:
  std::function<nlohmann::json(const std::string&)> probe_info_;

  boost::asio::io_context& io_;
  adapters::StorageWriter& storage_;
  Metrics& metrics_;
  const Clock& clock_;
  std::function<void()> on_change_;
  DeviceModels models_;
  std::map<std::string, std::int64_t> versions_;
  std::map<std::string, bool> probing_;
  std::thread worker_;
  std::atomic<bool> stopping_{false};
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace joule::daemon
