#include "joule/estimator/data_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace joule::estimator {

namespace {

// `value` × `factor`, its relative spread and the factor's added in quadrature.
Uncertain scaled(const Uncertain& value, double factor, double factor_relative_std) {
  const double relative = value.mean > 0 ? value.std / value.mean : 0.0;
  const double mean = value.mean * factor;
  return {mean, mean * std::hypot(relative, factor_relative_std)};
}

void keep_recent(std::vector<double>& observed, double value) {
  observed.push_back(value);
  if (observed.size() > DataParallelCalibration::kMaxJobs) observed.erase(observed.begin());
}

}  // namespace

Estimate across_gpus(Estimate one, int gpus, std::int64_t batch_size, const DataParallelOverhead& overhead) {
  if (gpus <= 1) return one;
  DataParallelLine line{gpus,          one.joules,    one.seconds, overhead.joules, overhead.seconds,
                        overhead.jobs, overhead.basis};
  const double joules_factor = 1.0 + overhead.joules.mean;
  const double seconds_factor = 1.0 + overhead.seconds.mean;
  one.joules = scaled(one.joules, joules_factor, overhead.joules.std / joules_factor);
  one.seconds = scaled(one.seconds, seconds_factor / gpus, overhead.seconds.std / seconds_factor);
  // A setting runs on every GPU the job holds (each at the same power limit: they run in step,
  // so one GPU left faster only waits). Its ratios are one GPU's measured or predicted ones,
  // applied to the whole, all-reduce included: that part is link-bound and a limit saves little
  // of it, so the saving is a little overstated, by the overhead's share at most.
  for (auto& line : one.settings) {
    line.joules = scaled(line.joules, joules_factor, overhead.joules.std / joules_factor);
    line.seconds = scaled(line.seconds, seconds_factor / gpus, overhead.seconds.std / seconds_factor);
  }
  one.warnings.push_back(fmt::format(
      "on {} GPUs: one GPU's estimate of the whole training split {} ways (each trains 1/{} of every epoch at "
      "batch size {}, as DDP's DistributedSampler does), plus {:.0f}% ± {:.0f}% energy and {:.0f}% ± {:.0f}% time "
      "for the gradients' all-reduce and waiting ({}); the host's CPU energy is not in it; per-layer and per-step "
      "figures are one GPU's",
      gpus, gpus, gpus, batch_size, overhead.joules.mean * 100.0, overhead.joules.std * 100.0,
      overhead.seconds.mean * 100.0, overhead.seconds.std * 100.0, overhead.basis));
  one.data_parallel = std::move(line);
  return one;
}

bool DataParallelCalibration::add(int gpus, double metered_joules, std::optional<double> metered_seconds,
                                  const DataParallelLine& estimate) {
  if (gpus <= 1 || !(metered_joules > 0.0) || !(estimate.one_gpu_joules.mean > 0.0)) return false;
  Observed& observed = by_count_[gpus];
  keep_recent(observed.joules, metered_joules / estimate.one_gpu_joules.mean - 1.0);
  if (metered_seconds && *metered_seconds > 0.0 && estimate.one_gpu_seconds.mean > 0.0)
    keep_recent(observed.seconds, *metered_seconds * gpus / estimate.one_gpu_seconds.mean - 1.0);
  return true;
}

Uncertain DataParallelCalibration::learn(const std::vector<double>& observed, const Uncertain& prior) const {
  if (observed.empty()) return prior;
  double sum = prior.mean;
  for (double value : observed) sum += value;
  const double count = 1.0 + static_cast<double>(observed.size());
  const double mean = sum / count;
  double squares = prior.std * prior.std;
  for (double value : observed) squares += (value - mean) * (value - mean);
  return {mean, std::sqrt(squares / count)};
}

DataParallelOverhead DataParallelCalibration::overhead(int gpus, const std::string& group) const {
  if (by_count_.empty()) return prior_;
  auto nearest = by_count_.begin();
  for (auto it = by_count_.begin(); it != by_count_.end(); ++it)
    if (std::abs(it->first - gpus) < std::abs(nearest->first - gpus)) nearest = it;
  const Observed& observed = nearest->second;
  DataParallelOverhead out;
  out.joules = learn(observed.joules, prior_.joules);
  out.seconds = learn(observed.seconds, prior_.seconds);
  out.jobs = observed.joules.size();
  if (nearest->first == gpus) {
    out.basis =
        fmt::format("learnt from {} finished job{} on {} {} GPUs", out.jobs, out.jobs == 1 ? "" : "s", gpus, group);
  } else {
    out.joules.std = std::max(out.joules.std, prior_.joules.std);
    out.seconds.std = std::max(out.seconds.std, prior_.seconds.std);
    out.basis = fmt::format("learnt from {} finished job{} on {} {} GPUs, none yet on {}; the prior's spread kept",
                            out.jobs, out.jobs == 1 ? "" : "s", nearest->first, group, gpus);
  }
  return out;
}

std::map<int, DataParallelOverhead> DataParallelCalibration::learnt(const std::string& group) const {
  std::map<int, DataParallelOverhead> out;
  for (const auto& [gpus, observed] : by_count_) out.emplace(gpus, overhead(gpus, group));
  return out;
}

}  // namespace joule::estimator
