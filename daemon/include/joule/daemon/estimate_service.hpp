#pragma once
// One place that estimates for this node: the device models in force (a Slurm slot estimates
// with its node type's model), the correction by what finished jobs taught (OutcomeService) and
// each device's caveats (a thread count the model was not learnt at, a runtime not measured).
// The job book asks it for every job it accepts or estimates again; POST /v1/estimate and
// /v1/advise answer from it. Typed in and out: the routes read requests and write answers.
// Lives on the event loop.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"
#include "joule/daemon/device_table.hpp"
#include "joule/daemon/estimates.hpp"
#include "joule/daemon/job_links.hpp"
#include "joule/daemon/outcome_service.hpp"
#include "joule/schedulers/job.hpp"

namespace joule::daemon {

class EstimateService final : public JobEstimator {
 public:
  /// `devices`: the node's device table (estimates cover its devices, an agent's too);
  /// `outcomes`: the correction, nullptr for raw estimates; `model_sources`: devices that
  /// estimate with another one's model, by name (a Slurm slot "node/0": its node type's model).
  explicit EstimateService(const DeviceTable& devices, const OutcomeService* outcomes = nullptr,
                           std::map<std::string, std::string> model_sources = {});

  /// The models learnt or loaded, by device (ModelService's); slots get their source's.
  void set_models(const DeviceModels& learnt);
  /// The models estimates are made with, slots included.
  const DeviceModels& models() const { return *models_; }
  /// The device whose model `device` estimates with: itself, unless it is a slot.
  const std::string& model_source(const std::string& device) const;
  /// Why a device's estimates have no Python runtime lines (probing's answer: not measured yet,
  /// the probe failed, no interpreter configured); nothing once they do.
  void set_runtime_problem(std::function<std::optional<std::string>(const std::string& device)> why) {
    runtime_problem_ = std::move(why);
  }
  /// What probing says of an estimate of a network on a device (ProbeService::estimate_caveats):
  /// added to its warnings, for jobs and POST /v1/estimate alike.
  using ProbeCaveats = std::function<std::vector<std::string>(
      const std::string& device, const estimator::ModelSpec& model, const estimator::TrainingConfig& training)>;
  void set_probe_caveats(ProbeCaveats caveats) { probe_caveats_ = std::move(caveats); }

  /// How a device's energy model is described (ModelService::model_info, by the device whose
  /// model it is); unset: model_info() describes none.
  void set_model_descriptions(std::function<nlohmann::json(const std::string& source)> describe) {
    describe_ = std::move(describe);
  }
  /// A device's energy model for GET /v1/devices and /v1/nodes: its source's (a slot's node
  /// type's) description with this device's calibration by finished jobs; nothing where unset.
  std::optional<nlohmann::json> model_info(const std::string& device) const;

  /// A job's estimate on every device it may use (constraints.devices), corrected, each with its
  /// device's caveats; none where nothing could be estimated (no model spec).
  std::vector<EstimateRow> estimate_job(const schedulers::JobSpec& spec) const override;
  /// The predictions of estimate_job with the models in force now (kept alive by the work, so a
  /// model installed meanwhile changes nothing in it); finish_estimate corrects and adds caveats.
  ModelWork start_estimate(const schedulers::JobSpec& spec) const override;
  void finish_estimate(const schedulers::JobSpec& spec, std::vector<EstimateRow>& rows) const override;
  /// POST /v1/estimate: the estimates on every device of the node the request's patterns allow,
  /// corrected; errors name the field by JSON pointer.
  Result<EstimateAnswer> estimate(const EstimateRequest& request) const;
  /// The names of the devices estimates cover (POST /v1/advise advises on them).
  std::vector<std::string> device_names() const { return devices_.names(); }

 private:
  const DeviceTable& devices_;
  const OutcomeService* outcomes_;
  std::map<std::string, std::string> model_sources_;
  // Replaced whole, never changed in place: work started off the loop holds the set it began with.
  std::shared_ptr<const DeviceModels> models_ = std::make_shared<const DeviceModels>();
  std::function<std::optional<std::string>(const std::string&)> runtime_problem_;
  ProbeCaveats probe_caveats_;
  std::function<nlohmann::json(const std::string&)> describe_;
};

}  // namespace joule::daemon
