#pragma once
// What a data-parallel job on several GPUs of one kind costs, from one GPU's estimate of it.
//
// Under DDP (torchrun) each of N processes trains on 1/N of every epoch's samples (its
// DistributedSampler's share) at the job's batch size, one GPU each, and the gradients are
// averaged across them after every step. So the work is one GPU's estimate of the whole training
// split N ways: the same joules in 1/N of the time, plus what the all-reduce and the GPUs'
// waiting on each other add on every GPU, a share of energy and a share of time. Until finished
// jobs on several GPUs teach those shares (DataParallelCalibration), they are a prior, and the
// estimate says so.

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "joule/estimator/device_energy_model.hpp"

namespace joule::estimator {

/// The shares of energy and of time that communication and waiting add to a job on several GPUs.
struct DataParallelOverhead {
  Uncertain joules{0.15, 0.15};
  Uncertain seconds{0.15, 0.15};
  std::size_t jobs = 0;  ///< finished jobs it was learnt from; 0: the prior
  /// Where the figures come from, for the estimate's warning.
  std::string basis = "a prior, not yet learnt from finished jobs on several GPUs";
};

/// `one` (the whole training on one GPU alone) on `gpus` GPUs of its kind: joules × (1 + the
/// energy overhead), seconds × (1 + the time overhead) / gpus, both spreads widened by the
/// overhead's; `data_parallel` keeps the one-GPU figures. The per-layer and per-step figures stay
/// one GPU's; a warning says what was assumed. gpus <= 1: `one` unchanged.
Estimate across_gpus(Estimate one, int gpus, std::int64_t batch_size, const DataParallelOverhead& overhead = {});

/// What finished jobs on several GPUs of one kind (one node's GPU model) taught about the
/// overhead, per GPU count. A job's observed overhead is its metered joules over the one-GPU
/// estimate it was made from, less one (and its seconds × N over the one-GPU seconds, less one).
/// The prior counts as one job: the mean is (prior + Σ observed) / (1 + k), the spread
/// sqrt((prior σ² + Σ (observed − mean)²) / (1 + k)): the prior's at first, the jobs' own
/// scatter once there are many. A count no job has run at borrows the nearest count's figures
/// with no less than the prior's spread (the all-reduce grows with the count), and says so.
/// Pure: no I/O, no clock.
class DataParallelCalibration {
 public:
  /// The most recent jobs kept per GPU count.
  static constexpr std::size_t kMaxJobs = 50;

  explicit DataParallelCalibration(DataParallelOverhead prior = {}) : prior_(std::move(prior)) {}

  /// A finished job on `gpus` GPUs: its metered joules (and seconds, where timed) against the
  /// one-GPU figures its estimate was made from. Returns whether it taught anything (gpus > 1,
  /// positive figures).
  bool add(int gpus, double metered_joules, std::optional<double> metered_seconds, const DataParallelLine& estimate);

  /// The overhead to apply on `gpus` GPUs; `group` names the GPUs in the basis.
  DataParallelOverhead overhead(int gpus, const std::string& group) const;

  /// Per GPU count, the jobs it has and what they taught (for GET /v1/devices).
  std::map<int, DataParallelOverhead> learnt(const std::string& group) const;

 private:
  struct Observed {
    std::vector<double> joules;   ///< observed energy overheads, oldest first
    std::vector<double> seconds;  ///< observed time overheads (timed jobs only)
  };
  Uncertain learn(const std::vector<double>& observed, const Uncertain& prior) const;

  DataParallelOverhead prior_;
  std::map<int, Observed> by_count_;
};

}  // namespace joule::estimator
