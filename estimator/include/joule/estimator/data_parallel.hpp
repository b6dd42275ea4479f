#pragma once
// What a data-parallel job on several GPUs of one kind costs, from one GPU's estimate of it.
//
// Under DDP (torchrun) each of N processes trains on 1/N of every epoch's samples (its
// DistributedSampler's share) at the job's batch size, one GPU each, and the gradients are
// averaged across them after every step. So the work is one GPU's estimate of the whole training
// split N ways: the same joules in 1/N of the time, plus what the all-reduce and the GPUs'
// waiting on each other add on every GPU, a share of time and of energy. Until finished jobs on
// several GPUs teach that share, it is a prior, and the estimate says so.

#include <string>

#include "joule/estimator/device_energy_model.hpp"

namespace joule::estimator {

/// The share of time and energy that communication and waiting add to a job on several GPUs.
struct DataParallelOverhead {
  double mean = 0.15;
  double std = 0.15;
  /// Where the figure comes from, for the estimate's warning.
  std::string basis = "a prior, not yet learnt from finished jobs on several GPUs";
};

/// `one` (the whole training on one GPU alone) on `gpus` GPUs of its kind: joules × (1 + the
/// overhead), seconds × (1 + the overhead) / gpus, both spreads widened by the overhead's. The
/// per-layer and per-step figures stay one GPU's; a warning says what was assumed. gpus <= 1:
/// `one` unchanged.
Estimate across_gpus(Estimate one, int gpus, std::int64_t batch_size, const DataParallelOverhead& overhead = {});

}  // namespace joule::estimator
