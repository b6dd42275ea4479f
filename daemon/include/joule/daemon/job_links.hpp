#pragma once
// The small interfaces through which the job book and the services that learn from jobs meet:
// what the book asks of the estimator, what it tells of placements and finished jobs, and what
// probing asks of the queue. The book is given them at construction (JobServiceLinks); none of
// them names the book, so the estimates and probing rooms include this header, not its.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "joule/common/energy_source.hpp"
#include "joule/daemon/job_estimate.hpp"
#include "joule/estimator/probe_campaign.hpp"
#include "joule/schedulers/job.hpp"

namespace joule::daemon {

class GridSignalFeed;

/// What a finished job tells the device's energy model: its estimate there and its metered energy.
struct JobFeedback {
  std::string device;
  DeviceEstimate estimate;  ///< the job's estimate on that device
  double joules = 0.0;
  std::optional<EnergySource> source;  ///< of the joules (the device's meter); nothing: unknown
  bool partial = false;  ///< adopted after a restart: part of its energy was not metered
  std::string job_id;
  std::int64_t finished_ms = 0;
  std::optional<double> seconds;  ///< how long the run lasted, where this daemon timed it
  /// Devices it ran on at once (resources.gpus): the joules of several GPUs teach a one-GPU
  /// model nothing, only the overhead of running on several (DataParallelCalibration).
  int gpus = 1;
  /// The GPU model those devices are (Device::gpu_group); empty on a CPU.
  std::string gpu_group;
};

/// What the book asks of the estimator (EstimateService): a job's estimate on each device it
/// may use; none where nothing could be estimated.
class JobEstimator {
 public:
  /// The models' part of an estimate, as work any thread may run: it holds what it reads.
  using ModelWork = std::function<std::vector<EstimateRow>()>;

  virtual ~JobEstimator() = default;
  virtual std::vector<EstimateRow> estimate_job(const schedulers::JobSpec& spec) const = 0;
  /// estimate_job in two halves, so the book can keep the models' predictions (a coordinator's
  /// on every device of its cluster) off the loop: `start_estimate` on the loop, its work on any
  /// thread, then `finish_estimate` on the loop with the rows (corrections and caveats, which
  /// read what the loop changes). By default the whole estimate is made at the start.
  virtual ModelWork start_estimate(const schedulers::JobSpec& spec) const {
    return [rows = estimate_job(spec)] { return rows; };
  }
  virtual void finish_estimate(const schedulers::JobSpec&, std::vector<EstimateRow>&) const {}
};

/// What the book tells the services that share its devices and learn from its jobs (probing, the
/// outcome correction).
class JobListener {
 public:
  virtual ~JobListener() = default;
  /// Just before a job is placed on `device`: probing there must stop at once.
  virtual void placing_on(const std::string& device) = 0;
  /// A job that ran to its end here and was metered.
  virtual void finished(const JobFeedback& feedback) = 0;
  /// Whether a probe runs on `device` now (a device whose meter shares its counter counts it as
  /// work).
  virtual bool probing(const std::string& /*device*/) const { return false; }
};

/// What probing asks of the queue (the book answers).
class JobDemand {
 public:
  virtual ~JobDemand() = default;
  /// Whether any queued job may run on the device (probing must then leave it alone).
  virtual bool work_waiting_for(const std::string& device) const = 0;
  /// The models of queued jobs and of the latest `recent` finished ones, with their batch sizes:
  /// what the probe planner should learn.
  virtual std::vector<estimator::WorkloadItem> workload(std::size_t recent) const = 0;
  /// Whether placement chooses knob settings for jobs (the policy's knobs.goal): only then are
  /// networks worth measuring at the devices' settings.
  virtual bool chooses_settings() const { return false; }
  /// The numbers of cores queued jobs that may run on `device` ask for (resources.cores), in
  /// increasing order: the thread counts its networks are worth measuring at.
  virtual std::vector<int> core_counts(const std::string& /*device*/) const { return {}; }
};

/// The collaborators the book is built with; each may be null (tests, tools) and outlives it.
struct JobServiceLinks {
  /// Estimates every job submitted, assigned or estimated again (the estimate is stored with
  /// the job); null: jobs have no estimates.
  const JobEstimator* estimator = nullptr;
  /// Told of placements and finished jobs.
  JobListener* listener = nullptr;
  /// The node's carbon signal ([carbon]): placement's min-carbon reads it for every device the
  /// book places on (an agent's too: the coordinator's signal stands for them), and each job that
  /// ends metered is accounted in grams under it.
  const GridSignalFeed* carbon = nullptr;
  /// The node's price signal ([price]): min-cost and budgets in money read it as min-carbon and
  /// budgets in grams read the carbon signal, and each job that ends metered is costed under it.
  const GridSignalFeed* price = nullptr;
};

}  // namespace joule::daemon
