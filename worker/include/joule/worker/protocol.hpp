#pragma once
// What jouled and joule-worker say to each other: a probe request in, measured networks out,
// both JSON. jouled never links LibTorch; it writes a request file, runs
// `joule-worker probe --request FILE`, and reads one JSON document from the worker's stdout.
// `joule-worker measure` prints the same result for one whole model.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"
#include "joule/estimator/model_spec.hpp"
#include "joule/estimator/runtime_cost.hpp"

namespace joule::worker {

/// Networks to train and meter under the same conditions (interleaved).
struct ProbeRequest {
  std::string device = "cpu";  ///< "cpu" or "cuda:N"
  int threads = 1;             ///< intra-op threads, set explicitly (part of the device's config)
  std::int64_t batch_size = 32;
  std::string optimizer = "sgd";
  int warmup_steps = 10;          ///< per network, before any metering
  int steps_per_repetition = 20;  ///< steps metered as one reading
  int repetitions = 5;             ///< readings per network, interleaved across networks
  /// A reading lasts at least this long (more steps than steps_per_repetition where needed):
  /// NVML and hwmon power update every 10-100 ms, so short readings read zero or noise.
  /// 0 = chosen by the meter: 2 s for nvml, ina3221, hwmon and battery, 0.25 s for rapl and
  /// the modelled meter.
  double min_reading_seconds = 0.0;
  std::string meter = "auto";     ///< as MeterRequest::meter
  double idle_watts = 10.0;       ///< modelled meter coefficients
  double watts_per_busy_core = 12.0;
  std::uint64_t seed = 1;  ///< synthetic data and initial weights
  std::vector<estimator::ModelSpec> networks;
  /// Per network, the optimizer it trains with; empty: `optimizer` for all. An optimizer probe
  /// measures one network twice, with the optimizer and with sgd.
  std::vector<std::string> network_optimizers;

  /// The optimizer network i trains with.
  const std::string& optimizer_of(std::size_t i) const {
    return network_optimizers.empty() ? optimizer : network_optimizers[i];
  }
};

/// The software and hardware a measurement was taken under. A device model learnt under one
/// fingerprint is not trusted under another (a BLAS swap changes linear layers 6-13×).
struct WorkerEnvironment {
  std::string torch_version;  ///< "1.13.1"
  std::string blas;           ///< "OpenBLAS 0.3.21 (libopenblas...so)" or the resolved libblas.so.3
  int threads = 1;
  std::string device;       ///< "cpu", "cuda:0"
  std::string device_name;  ///< CPU model name or GPU name
  /// The CUDA this LibTorch was built with and the GPUs it sees ("CUDA Runtime 11.7; 1 GPU
  /// visible"), or "none: ..." (Debian's LibTorch is CPU-only). Not in the fingerprint: the device
  /// name already tells a GPU's measurements from a CPU's.
  std::string cuda;
  /// One line identifying all of the above but `cuda`; equal fingerprints mean comparable measurements.
  std::string fingerprint() const;
};

/// One metered reading: `steps` training steps of one network.
struct Repetition {
  double joules_per_step = 0.0;
  double seconds_per_step = 0.0;
  int steps = 0;  ///< steps in this reading; 0 (results of older workers): the network's steps_per_repetition
};

struct NetworkResult {
  std::string name;
  std::vector<Repetition> repetitions;
  double joules_per_step = 0.0;   ///< median of the repetitions
  double seconds_per_step = 0.0;  ///< median of the repetitions
  double joules_spread = 0.0;     ///< (max − min) / median of joules per step
  double seconds_spread = 0.0;
  int steps_per_repetition = 0;  ///< steps in the first reading (≥ the request's, see min_reading_seconds)
  double final_loss = 0.0;  ///< the loss of the last step: finite, or the run failed
};

struct ProbeResult {
  WorkerEnvironment environment;
  std::string meter_source;             ///< "rapl", "nvml", "modelled"...
  bool measured = false;                ///< true only for real meters (not "modelled"/"simulated")
  std::vector<NetworkResult> networks;  ///< same order as the request
  double wall_seconds = 0.0;            ///< the whole run, warm-ups included
  // The conditions of the run, echoed so a result file stands on its own.
  std::int64_t batch_size = 32;
  std::string optimizer = "sgd";
  int warmup_steps = 10;
  int steps_per_repetition = 20;
};

nlohmann::json to_json(const ProbeRequest& request);
/// Errors name the JSON pointer of the bad field.
Result<ProbeRequest> parse_probe_request(const nlohmann::json& json);
nlohmann::json to_json(const WorkerEnvironment& environment);
nlohmann::json to_json(const ProbeResult& result);
Result<ProbeResult> parse_probe_result(const nlohmann::json& json);

/// What `joule-worker runtime --json` prints: a Python interpreter's start-up and per-step cost
/// against the same loops in LibTorch (estimator/runtime_cost.hpp), metered by one meter.
struct RuntimeProbeResult {
  WorkerEnvironment environment;
  std::string runtime = "python";
  std::string interpreter;  ///< the program as run ("/usr/bin/python3")
  std::string version;      ///< "Python 3.11.2, torch 1.13.1"
  std::string meter_source;
  bool measured = false;
  std::vector<estimator::RuntimeStepReading> steps;
  std::vector<estimator::RuntimeStartReading> starts;
  double joules = 0.0;  ///< every metered window together: what the probe spent that was metered
  double wall_seconds = 0.0;
};

nlohmann::json to_json(const RuntimeProbeResult& result);
/// Errors name the JSON pointer of the bad field; a result that calls a modelled meter a
/// measurement is refused.
Result<RuntimeProbeResult> parse_runtime_probe_result(const nlohmann::json& json);

/// Median, and (max − min) / median, of a non-empty list.
double median_of(std::vector<double> values);
double spread_of(const std::vector<double>& values);

}  // namespace joule::worker
