#include "joule/daemon/estimate_service.hpp"

#include <fmt/format.h>

#include "joule/daemon/thread_settings.hpp"
#include "joule/estimator/data_parallel.hpp"
#include "joule/estimator/runtime_cost.hpp"
#include "joule/estimator/thread_count.hpp"

namespace joule::daemon {

EstimateService::EstimateService(const DeviceTable& devices, const OutcomeService* outcomes,
                                 std::map<std::string, std::string> model_sources)
    : devices_(devices), outcomes_(outcomes), model_sources_(std::move(model_sources)) {}

void EstimateService::set_models(const DeviceModels& learnt) {
  auto models = std::make_shared<DeviceModels>(learnt);
  for (const auto& [slot, source] : model_sources_)
    if (const auto it = learnt.find(source); it != learnt.end()) (*models)[slot] = it->second;
  models_ = std::move(models);
}

const std::string& EstimateService::model_source(const std::string& device) const {
  const auto it = model_sources_.find(device);
  return it == model_sources_.end() ? device : it->second;
}

std::optional<nlohmann::json> EstimateService::model_info(const std::string& device) const {
  if (!describe_) return std::nullopt;
  auto info = describe_(model_source(device));
  if (outcomes_) {
    info["calibration"] = outcomes_->view(device);
    if (const Device* found = devices_.find(device); found && !found->gpu_group.empty())
      info["calibration"]["data_parallel"] = outcomes_->data_parallel_view(found->gpu_group);
  }
  return info;
}

namespace {
// A built-in job trains in joule-worker (LibTorch, as probes do); a command's runtime is what its
// program says it is: Python's start-up and per-step cost are measured per device.
std::string runtime_of(const schedulers::JobSpec& spec) {
  return spec.run.builtin ? "" : estimator::runtime_of_command(spec.run.argv);
}
}  // namespace

std::vector<EstimateRow> EstimateService::estimate_job(const schedulers::JobSpec& spec) const {
  std::vector<EstimateRow> rows = start_estimate(spec)();
  finish_estimate(spec, rows);
  return rows;
}

JobEstimator::ModelWork EstimateService::start_estimate(const schedulers::JobSpec& spec) const {
  if (!spec.model || !spec.training) return [] { return std::vector<EstimateRow>{}; };
  std::vector<std::string> names;
  for (const auto& device : devices_)
    if (schedulers::device_allowed(spec.constraints, device.name)) names.push_back(device.name);
  return [request = EstimateRequest{*spec.model, *spec.training, runtime_of(spec), {}}, names = std::move(names),
          models = models_] {
    auto answer = estimate_on(request, names, *models);
    return answer ? std::move(answer->rows) : std::vector<EstimateRow>{};
  };
}

void EstimateService::finish_estimate(const schedulers::JobSpec& spec, std::vector<EstimateRow>& rows) const {
  if (rows.empty()) return;
  const std::string runtime = runtime_of(spec);
  if (outcomes_) outcomes_->apply(rows);
  for (auto& row : rows) {
    if (!row.estimate) continue;
    auto& warnings = row.estimate->warnings;
    const Device* device = devices_.find(row.device);
    if (auto warning = thread_count_warning(spec.run.env, device ? device->threads : 0)) warnings.push_back(*warning);
    // At its own cores' thread count, where networks were measured at it (else a warning).
    if (spec.resources.cores && device) {
      if (spec.chooses_cores())
        estimator::over_core_range(*row.estimate, *spec.resources.cores, *spec.resources.cores_max, device->threads);
      else
        estimator::at_thread_count(*row.estimate, *spec.resources.cores, device->threads);
    }
    if (spec.resources.gpus) {
      if (!device || device->gpu_group.empty())
        warnings.push_back(
            fmt::format("{} is not a GPU of this node: a job asking for resources.gpus does not run here", row.device));
      else
        *row.estimate = estimator::across_gpus(
            std::move(*row.estimate), *spec.resources.gpus, spec.training->batch_size,
            outcomes_ ? outcomes_->data_parallel_overhead(device->gpu_group, *spec.resources.gpus)
                      : estimator::DataParallelOverhead{});
    }
    if (runtime.empty() && !spec.run.builtin && !spec.run.argv.empty())
      warnings.push_back(fmt::format(
          "{} is not a runtime Joule measures (Python is): the program's start-up and any per-step work beyond "
          "the model's layers are not in this estimate until finished jobs teach them",
          spec.run.argv.front()));
    else if (!runtime.empty() && !row.estimate->runtime)
      if (auto why = runtime_problem_ ? runtime_problem_(row.device) : std::nullopt) warnings.push_back(*why);
    if (probe_caveats_)
      for (auto& caveat : probe_caveats_(row.device, *spec.model, *spec.training))
        warnings.push_back(std::move(caveat));
  }
}

Result<EstimateAnswer> EstimateService::estimate(const EstimateRequest& request) const {
  auto answer = estimate_on(request, devices_.names(), *models_);
  if (answer && outcomes_) outcomes_->apply(answer->rows);
  if (answer && probe_caveats_)
    for (auto& row : answer->rows)
      if (row.estimate)
        for (auto& caveat : probe_caveats_(row.device, request.model, request.training))
          row.estimate->warnings.push_back(std::move(caveat));
  return answer;
}

}  // namespace joule::daemon
