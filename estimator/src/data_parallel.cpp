#include "joule/estimator/data_parallel.hpp"

#include <cmath>

#include <fmt/format.h>

namespace joule::estimator {

namespace {

// `value` × `factor`, its relative spread and the factor's added in quadrature.
Uncertain scaled(const Uncertain& value, double factor, double factor_relative_std) {
  const double relative = value.mean > 0 ? value.std / value.mean : 0.0;
  const double mean = value.mean * factor;
  return {mean, mean * std::hypot(relative, factor_relative_std)};
}

}  // namespace

Estimate across_gpus(Estimate one, int gpus, std::int64_t batch_size, const DataParallelOverhead& overhead) {
  if (gpus <= 1) return one;
  const double factor = 1.0 + overhead.mean;
  const double factor_relative = overhead.std / factor;
  one.joules = scaled(one.joules, factor, factor_relative);
  one.seconds = scaled(one.seconds, factor / gpus, factor_relative);
  // A setting is one device's: a job on several is run at their defaults.
  one.settings.clear();
  one.warnings.push_back(fmt::format(
      "on {} GPUs: one GPU's estimate of the whole training split {} ways (each trains 1/{} of every epoch at "
      "batch size {}, as DDP's DistributedSampler does), plus {:.0f}% ± {:.0f}% for the gradients' all-reduce and "
      "waiting ({}); the host's CPU energy is not in it; per-layer and per-step figures are one GPU's",
      gpus, gpus, gpus, batch_size, overhead.mean * 100.0, overhead.std * 100.0, overhead.basis));
  return one;
}

}  // namespace joule::estimator
