#pragma once
// One device's energy model: a GP per (layer kind, position) for energy and one for time,
// trained on THOR probe samples, plus the FLOPs-proportional baseline fitted on the same probe
// networks. estimate() turns a model spec and training config into joules and seconds with a
// standard deviation, per layer and in total (THOR equation 1 times the number of steps).
//
// Each GP models what a work-proportional prior leaves over. The prior of a (kind, position) is
//   log E ≈ a + b · log work,   work = FLOPs + kFlopsPerByte × (activation + parameter bytes)
// fitted by least squares with b pulled towards 1 (ridge, kSlopePrior): far from every probe a
// layer twice the work costs about twice the energy, where a GP with a constant mean would fall
// back to the average of what was probed (measured: seeds probed at larger configurations than a
// network's pulled its small layers' estimates up). A kind with fewer samples than a GP needs is
// estimated by its prior alone, with a wide spread (kSparseSigma) and a warning saying so.
//
// A job whose training.optimizer is not sgd gets one more line after its layers, type
// "optimizer", from the model "optimizer:<name>@output" (thor_probes.hpp) at the network's
// parameter count; without that model there is no estimate, as for a missing layer kind.
//
// GP inputs are the layer's configuration (layer_analysis.hpp features + batch_size) on a
// log1p scale, plus channel counts padded to blocks of 8 and 16 (vector units and convolution
// libraries work in such blocks; measured: 2.2× jumps at multiples of 16). The
// target is log joules per step, so a prediction N(μ, σ²) is log-normal in joules:
//   mean = exp(μ + σ²/2),   variance = (exp(σ²) − 1) · exp(2μ + σ²)
// (the median exp(μ) replaces the mean where σ > kExtrapolationSigma, so a point far from the
// data cannot blow the sum up), and layer variances add (independent layers), plus
// kStructuralSigma of the step shared by all of them. A layer whose latent σ exceeds
// kExtrapolationSigma (×2 either way at one σ) is flagged as outside what was probed.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"
#include "joule/estimator/gaussian_process.hpp"
#include "joule/estimator/model_spec.hpp"
#include "joule/estimator/runtime_cost.hpp"
#include "joule/estimator/thor_probes.hpp"
#include "joule/estimator/whole_network.hpp"

namespace joule::estimator {

inline constexpr double kExtrapolationSigma = 0.7;
/// Bytes moved count as this many FLOPs in a layer's work (CPUs and GPUs do a few FLOPs per byte
/// of memory traffic in the time one byte moves: elementwise layers are bound by their bytes).
inline constexpr double kFlopsPerByte = 4.0;
/// Latent σ (log units) of a layer estimated by its kind's prior alone, before a GP is fitted.
inline constexpr double kSparseSigma = 0.5;
/// Relative σ of a whole step beyond its layers' own, shared by all of them: a real job's step
/// is not exactly the sum of its probed layers (additivity, the job's framework and threads).
/// From the tuning networks of bench/e2e_accuracy.py (RMS error of raw estimates against real
/// jobs, 0.155); without it ±2σ held 2-3 of 18 jobs, with it 16 of 18 (11 of 12 held-out).
inline constexpr double kStructuralSigma = 0.15;

/// A layer's work in FLOP-equivalents: what the prior mean scales with.
double layer_work(const LayerCost& cost);

/// Mean and standard deviation of one quantity.
struct Uncertain {
  double mean = 0.0;
  double std = 0.0;
  bool operator==(const Uncertain&) const = default;
};

/// One layer's share of a training step.
struct LayerEstimate {
  std::size_t index = 0;
  std::string type;
  std::string key;        ///< "conv2d@hidden"
  Uncertain joules_per_step;
  Uncertain seconds_per_step;
  double flops_per_step = 0.0;
  bool extrapolated = false;  ///< far from every probed configuration: wide variance
  bool sparse = false;        ///< its kind has too few probe samples for a GP: prior alone
};

/// What a job's runtime adds to its model's steps (runtime_cost.hpp): once per job, and per step
/// for the `modules` its network calls. Both are in the estimate's totals and joules_per_step.
struct RuntimeLines {
  std::string runtime;  ///< "python"
  std::int64_t modules = 0;
  /// The layer kinds priced by their own runtime readings (the others on the per-module line).
  std::vector<std::string> kinds_read;
  Uncertain start_joules;
  Uncertain start_seconds;
  Uncertain step_joules;
  Uncertain step_seconds;
};

/// How a network measured whole on the device, or its family's whole-to-layers gap, changed the
/// sum of its layer lines (whole_network.hpp). The layer lines are scaled to apportion the result.
struct WholeNetworkLine {
  /// "measured": this network (spec, batch size, optimizer) was trained whole on the device and
  /// its step is that measurement; "family-gap": its family's learnt ratio scales its layer sum.
  std::string basis;
  std::string family;
  double layers_joules_per_step = 0.0;  ///< the layer lines' sum before
  double layers_seconds_per_step = 0.0;
  double joules_ratio = 1.0;  ///< what the sum was multiplied by
  double seconds_ratio = 1.0;
  std::size_t samples = 0;       ///< networks the gap was learnt from (1 where measured)
  std::int64_t measured_ms = 0;  ///< when it was measured ("measured" only)
};

/// How a job on several GPUs was estimated from one GPU's estimate of it (data_parallel.hpp):
/// kept with the estimate so that the job, once metered, teaches the overhead.
struct DataParallelLine {
  int gpus = 1;
  Uncertain one_gpu_joules;  ///< the whole training on one GPU alone
  Uncertain one_gpu_seconds;
  Uncertain joules_overhead;  ///< the share added, as applied
  Uncertain seconds_overhead;
  std::size_t jobs = 0;  ///< finished jobs the overhead was learnt from (0: the prior)
  std::string basis;
  bool operator==(const DataParallelLine&) const = default;
};

/// What one of the device's knob settings would do to the job: ratios to its estimate at the
/// defaults, from whole networks measured at the setting (knob_response.hpp).
struct SettingLine {
  KnobSetting setting;
  /// "measured": this network (spec, batch size, optimizer) was trained whole at the setting and
  /// at the defaults; "response": predicted from the networks that were (KnobResponse).
  std::string basis;
  double joules_ratio = 1.0;  ///< at the setting / at the defaults
  double joules_log_std = 0.0;
  double seconds_ratio = 1.0;
  double seconds_log_std = 0.0;
  std::size_t samples = 0;  ///< networks measured at both that it rests on (1 where measured)
  Uncertain joules;         ///< whole job at the setting
  Uncertain seconds;
};

/// A knob setting the device has measured networks at, and what it learnt of the setting.
struct SettingModel {
  KnobSetting setting;
  std::size_t networks = 0;  ///< measured at the setting and at the defaults
  /// From kMinResponseNetworks of them on: how the setting changes a network not measured at it.
  std::optional<KnobResponse> response;
};
/// A setting's response is fitted from this many networks measured at it and at the defaults;
/// below, only the networks measured there get the setting's figures.
inline constexpr std::size_t kMinResponseNetworks = 4;
/// The least log σ a setting's ratio is taken to have: two readings of a few steps cannot show
/// a smaller difference reliably.
inline constexpr double kSettingFloorSigma = 0.02;
/// The least log σ of a ratio predicted by a setting's response for a network not measured at
/// it: fitted on a handful of networks, a response's residuals understate how far a network
/// unlike them lands (on the simulated laptop, 5 noise-free networks left a 3 % residual and
/// missed LeNet's slowdown by 15 %).
inline constexpr double kResponseFloorSigma = 0.1;

/// What one job will cost on one device.
struct Estimate {
  std::string device;
  std::string method = "thor-gp";
  std::string source;  ///< meter source of the probe data ("rapl", "simulated"...)
  std::string environment;  ///< the model's DeviceEnergyModel::environment(); empty: unknown
  std::int64_t steps = 0;
  std::int64_t epochs = 1;
  Uncertain joules;   ///< whole job
  Uncertain seconds;  ///< whole job
  Uncertain joules_per_step;
  std::vector<LayerEstimate> layers;
  /// FLOPs-proportional baseline: joules_per_flop × FLOPs per step × steps.
  double flops_baseline_joules = 0.0;
  double joules_per_flop = 0.0;
  /// The job's runtime's cost, where it asked for one the device has measured; nothing for a
  /// built-in job, an unknown runtime, or one not measured yet (a warning then says so).
  std::optional<RuntimeLines> runtime;
  /// Where a whole measurement or a family gap changed the layers' sum; nothing where neither
  /// is known.
  std::optional<WholeNetworkLine> whole;
  /// The device's knob settings this network can be estimated at (measured there, or predicted
  /// by a setting's response); empty where none is.
  std::vector<SettingLine> settings;
  /// Where the job runs on several GPUs: the one-GPU figures it was made from.
  std::optional<DataParallelLine> data_parallel;
  std::vector<std::string> warnings;
};

nlohmann::json to_json(const Estimate& estimate);
/// The same, with or without the per-layer breakdown (`layers` empty where it is left out).
nlohmann::json to_json(const Estimate& estimate, bool with_layers);

/// A network analysed for estimating on many devices: its layers' keys, whether each is free,
/// their work, and the feature vectors the devices' models ask for (most devices' models of a
/// kind name the same features), found once per job instead of once per device. Used on one
/// thread at a time; valid for the batch size it was made with.
class PreparedNetwork {
 public:
  /// `signature`: network_signature of the spec the layers come from, so a network measured
  /// whole is found; empty where the caller has no spec (only family gaps then apply).
  PreparedNetwork(const std::vector<AnalyzedLayer>& layers, std::int64_t batch_size, std::string signature = {});

  const std::vector<AnalyzedLayer>& layers() const { return layers_; }
  std::int64_t batch_size() const { return batch_size_; }
  const std::string& signature() const { return signature_; }
  const std::string& family() const { return family_; }
  const LayerKey& key(std::size_t i) const { return keys_[i]; }
  const std::string& key_name(std::size_t i) const { return key_names_[i]; }
  bool free(std::size_t i) const { return free_[i]; }
  double log_work(std::size_t i) const { return log_work_[i]; }
  /// Layer i's feature vector over `names` (a KeyModel's), made once per distinct list.
  const Eigen::VectorXd& features(std::size_t i, const std::vector<std::string>& names) const;

 private:
  const std::vector<AnalyzedLayer>& layers_;
  std::int64_t batch_size_;
  std::string signature_;
  std::string family_;
  std::vector<LayerKey> keys_;
  std::vector<std::string> key_names_;
  std::vector<bool> free_;
  std::vector<double> log_work_;
  mutable std::vector<std::vector<std::pair<std::vector<std::string>, Eigen::VectorXd>>> features_;
};

class DeviceEnergyModel {
 public:
  DeviceEnergyModel(std::string device, std::string source);

  const std::string& device() const { return device_; }
  const std::string& source() const { return source_; }
  /// Names the meter source once it is known (a model resumed before its first probe result).
  void set_source(std::string source) { source_ = std::move(source); }
  /// The conditions its samples were measured under (joule-worker's environment fingerprint:
  /// LibTorch, BLAS, threads); empty where unknown (a simulated device, a model saved before
  /// models named them). Estimates carry it, so that what finished jobs teach about one
  /// environment's estimates is not applied to another's.
  const std::string& environment() const { return environment_; }
  void set_environment(std::string environment) { environment_ = std::move(environment); }

  /// Keeps a decomposed probe sample; non-positive energies (noise larger than the layer) are
  /// counted and dropped, since the model works in log energy, and the kind is remembered as
  /// unresolved: after kUnresolvedProbes such drops and no kept sample, its layers are estimated
  /// from the device's joules per unit of work over every kind (pooled_prior), with a wide σ
  /// and a warning, rather than leaving every network with such a layer without an estimate.
  /// Returns whether it was kept.
  bool add_sample(const LayerSample& sample);
  /// A whole probe network as measured: feeds the FLOPs baseline.
  void add_network(double flops_per_step, double joules_per_step);
  /// (Re)fits every (kind, position): its prior from any sample, its GPs from `min_samples` on.
  Status fit(const GpFitOptions& options = {}, std::size_t min_samples = 3);

  /// The estimate of a job; fails, saying which models are missing and how to get them, when a
  /// layer's (kind, position) has neither a GP nor a prior (never probed, or probed only before
  /// samples carried their work). No number is invented.
  /// `runtime` names what the job's training loop runs in ("python", runtime_of_command): its
  /// start-up and per-step cost join the estimate where this device has measured it; "" (a
  /// built-in job, or a program of unknown kind) adds nothing.
  Result<Estimate> estimate(const ModelSpec& model, const TrainingConfig& training,
                            const std::string& runtime = {}) const;
  /// The same for a network already analysed at `training.batch_size` (estimating one network
  /// on many devices analyses it once). Identical layers (same kind, position and inputs) are
  /// predicted once.
  Result<Estimate> estimate(const std::vector<AnalyzedLayer>& layers, const TrainingConfig& training,
                            const std::string& runtime = {}) const;
  /// The same for a network prepared once for every device (its batch size `training`'s).
  Result<Estimate> estimate(const PreparedNetwork& network, const TrainingConfig& training,
                            const std::string& runtime = {}) const;

  /// Keeps a network measured whole on this device, replacing an earlier measurement of the same
  /// network, batch size, optimizer and knob setting (at most kMaxWholeNetworks at the defaults
  /// and as many at each setting, the oldest dropped); its family's gap is learnt at the next
  /// fit(), a setting's response at once. Refuses a sample without positive figures.
  bool add_whole_network(WholeNetworkSample sample);
  const std::vector<WholeNetworkSample>& whole_networks() const { return wholes_; }
  /// Learns each family's gap from the networks measured whole against their layer sums under
  /// the layer models as fitted now (fit() calls it; a whole measurement added to a fitted
  /// model is learnt from without refitting the GPs).
  void learn_whole_network_gaps();
  /// The whole-to-layers gap per family, as the last fit() (or the loaded snapshot) learnt it.
  const std::map<std::string, WholeNetworkGap>& whole_network_gaps() const { return gaps_; }
  /// How much the device's own speed moves between readings of the same network (log σ of a
  /// reference network's readings, whole_network.hpp): no estimate here claims a spread below
  /// it. 0: unknown.
  void set_speed_spread(double log_sigma);
  double speed_spread() const { return speed_spread_; }
  /// The measurement of a network whole, if this device has one (whole_network_key).
  const WholeNetworkSample* whole_network(const std::string& signature, std::int64_t batch_size,
                                          const std::string& optimizer, const KnobSetting* setting = nullptr) const;
  /// The knob settings networks were measured at, by KnobSetting::key().
  const std::map<std::string, SettingModel>& settings() const { return settings_; }

  /// Keeps what a runtime costs on this device (joule-worker runtime), replacing its last one.
  void set_runtime(RuntimeCost cost);
  const std::map<std::string, RuntimeCost>& runtimes() const { return runtimes_; }

  /// Latent standard deviation (log energy) of the model of `key` at a layer: how unsure the
  /// model is there (kSparseSigma for a prior alone); +inf when there is no model. The probe
  /// planner maximises this.
  double uncertainty(const LayerKey& key, const AnalyzedLayer& layer, std::int64_t batch_size) const;

  std::map<std::string, std::size_t> sample_counts() const;
  /// A stamp that changes with every change to what the model predicts (a sample, a network, a
  /// fit) and is unique across models in this process: an answer computed from the model can be
  /// kept while the stamp stays. A copy keeps its original's stamp until either changes.
  std::uint64_t revision() const { return revision_; }
  std::size_t dropped_samples() const { return dropped_; }
  /// Probes of a kind dropped before it is estimated from the pooled prior instead of waiting.
  static constexpr std::size_t kUnresolvedProbes = 3;
  /// Kinds every probe of which came out at or below zero, with how many did.
  const std::map<std::string, std::size_t>& unresolved() const { return unresolved_; }

  nlohmann::json save() const;
  /// Rebuilds a model from save()'s output; refuses (never throws on) JSON that is not one,
  /// including one whose samples, names and GPs do not fit together.
  static Result<DeviceEnergyModel> load(const nlohmann::json& json);

  /// GP input vector of a layer configuration (features incl. batch_size), in `names` order.
  static Eigen::VectorXd feature_vector(const std::map<std::string, double>& features,
                                        const std::vector<std::string>& names);
  /// Feature names of a configuration: its own plus the padded-channel ones.
  static std::vector<std::string> feature_names(const std::map<std::string, double>& features);

 private:
  /// log y ≈ intercept + slope · log work.
  struct LogLinear {
    double intercept = 0.0;
    double slope = 1.0;
    double residual_variance = 0.0;  ///< mean squared residual of the fit
    double operator()(double log_work) const { return intercept + slope * log_work; }
  };
  struct KeyModel {
    std::vector<std::string> names;
    std::vector<Eigen::VectorXd> x;
    std::vector<double> log_joules;
    std::vector<double> log_seconds;
    /// log layer_work per sample; empty once any sample came without its cost (models saved
    /// before priors existed): such a key keeps a constant-mean GP and no prior.
    std::vector<double> log_work;
    std::optional<LogLinear> energy_prior;  ///< set by fit() when every sample has its work
    std::optional<LogLinear> time_prior;
    std::optional<GaussianProcess> energy;  ///< on log joules minus the prior (raw without one)
    std::optional<GaussianProcess> time;
    bool work_known() const { return log_work.size() == x.size() && !x.empty(); }
    bool usable() const { return energy.has_value() || energy_prior.has_value(); }
  };
  /// Latent prediction (log units) at an input: prior plus GP, or the prior alone.
  struct LogPrediction {
    double mean = 0.0;
    double variance = 0.0;
    double variance_with_noise = 0.0;
    bool sparse = false;
  };
  /// Of energy (energy_prior, energy) or time (time_prior, time); one of the two must be set.
  static LogPrediction predict(const std::optional<LogLinear>& prior, const std::optional<GaussianProcess>& gp,
                               const Eigen::VectorXd& x, double log_work);
  static LogLinear fit_prior(const std::vector<double>& log_work, const std::vector<double>& log_y);
  static std::map<std::string, double> with_padding(const std::map<std::string, double>& features);
  /// What in a loaded KeyModel does not fit together (lengths, GP inputs vs names), if anything.
  static std::optional<std::string> inconsistency(const KeyModel& model);
  /// Whether `key` has no model of its own but has been probed enough to stand in for one.
  bool stands_in(const std::string& key) const;
  /// log y ≈ a + b log work over every kind's samples (energy or time), its residual variance
  /// widened by kSparseSigma²: how an unresolved kind is estimated. Nothing without samples.
  std::optional<LogPrediction> pooled_prediction(bool energy, double log_work) const;
  static Eigen::VectorXd feature_vector(const std::map<std::string, double>& features,
                                        const std::vector<std::string>& names, std::optional<double> batch_size);
  friend class PreparedNetwork;  // finds the feature vectors the models ask for, once per job
  /// estimate() with or without what whole networks teach (fit() learns the gaps from the raw sums).
  Result<Estimate> estimate_with(const PreparedNetwork& network, const TrainingConfig& training,
                                 const std::string& runtime, bool whole) const;

  static std::uint64_t next_revision();
  /// Each setting's networks and response, from the whole measurements (at every change of them).
  void learn_settings();
  /// The job at each setting the device knows, beside `out` (its estimate at the defaults).
  void estimate_settings(const PreparedNetwork& network, const TrainingConfig& training, Estimate& out) const;

  std::string device_;
  std::string source_;
  std::string environment_;
  std::uint64_t revision_ = next_revision();
  std::map<std::string, KeyModel> models_;  // by LayerKey::name()
  double flops_sum_xx_ = 0.0;               // least squares through the origin: J = k × FLOPs
  double flops_sum_xy_ = 0.0;
  std::size_t dropped_ = 0;
  std::map<std::string, std::size_t> unresolved_;  // kinds with no kept sample: drops so far
  std::map<std::string, RuntimeCost> runtimes_;    // by RuntimeCost::runtime
  std::vector<WholeNetworkSample> wholes_;         // one per whole_network_key
  std::map<std::string, WholeNetworkGap> gaps_;    // by family
  std::map<std::string, SettingModel> settings_;   // by KnobSetting::key()
  double speed_spread_ = 0.0;
};

}  // namespace joule::estimator
