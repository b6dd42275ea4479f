#pragma once
// Planning and running THOR probes (docs/design.md, "Probing real devices"): which layer
// configurations to measure next so the device model learns what the workload needs.
//
// Candidates come from the workload (queued and recent jobs): every layer in its position at
// its batch size, and variations of it (widths ×½, ×¾, ×1½, ×2; other batch sizes), so the GP
// sees the neighbourhood of what users run and not only the exact points. The plan first gives
// every (kind, position) the workload needs `seed_samples` probes, then repeatedly probes the
// candidate whose next sample is expected to cut the workload's estimate error most per unit
// of probing cost (ProbePlanner).

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <random>
#include <vector>

#include "joule/common/result.hpp"
#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/simulated_device.hpp"
#include "joule/estimator/thor_probes.hpp"

namespace joule::estimator {

/// A network the device is expected to train, with its batch size.
struct WorkloadItem {
  ModelSpec model;
  std::int64_t batch_size = 32;
  std::string optimizer = "sgd";  ///< another one adds an optimizer target (thor_probes.hpp)
};

/// Measures one probe network on the device, trained with `optimizer`: the median per-step
/// cost of its repetitions.
using NetworkMeter = std::function<Result<NetworkMeasurement>(const ModelSpec& network, std::int64_t batch_size,
                                                              const std::string& optimizer)>;

/// A meter for a simulated device: the median of `repetitions` noisy steps of the network
/// (`repetitions` = 1 and a noise-free profile give the exact cost). The device must outlive it.
NetworkMeter simulated_network_meter(SimulatedDevice& device, int repetitions = 5);

struct CampaignOptions {
  std::size_t probes = 100;         ///< probe plans to run (each measures 1-4 networks)
  std::size_t seed_samples = 3;     ///< first probes per (kind, position) before variance-driven picks
  std::size_t refit_every = 10;     ///< refit the GPs after this many probes
  std::uint64_t seed = 1;
  std::vector<std::int64_t> batch_sizes = {16, 32, 64, 128};
  GpFitOptions gp;
};

struct CampaignReport {
  std::size_t probes = 0;
  std::size_t networks_measured = 0;
  std::size_t failed_measurements = 0;
};

/// Candidate probe targets for a workload (deduplicated, deterministic for a seed): every layer
/// at its item's batch size and at `batch_sizes`, and with `variations` its widths ×½ … ×2.
std::vector<ProbeTarget> candidate_targets(const std::vector<WorkloadItem>& workload,
                                           const std::vector<std::int64_t>& batch_sizes, bool variations = true);

/// A stable identity of a target (layer, input, batch, position), for "already probed" sets.
std::string target_id(const ProbeTarget& target);

/// The model a plan's target belongs to (its model_kind: grouped convolutions apart).
LayerKey planned_key(const ProbePlan& plan);

/// Chooses probes one at a time for one device model, so a daemon can probe in the gaps
/// between jobs, be pre-empted, and resume (a campaign is this planner in a loop).
///
/// Seeding is breadth first and drawn from the workload's own configurations: while a needed
/// (kind, position) has fewer than `seed_samples` probes, the key with the fewest gets one, so
/// every kind has a sample (and with it a prior, so every network an estimate) before any has
/// two. A key's first seed is the medoid of its configurations, the next ones the farthest (in
/// the GP's log-feature space) from those already probed. After that the next probe maximises
/// what it is worth (below) / sqrt(its cost), with σ the latent σ but at least
/// kSparseSigma × sqrt(seed_samples / the key's samples), counting a
/// configuration the workload itself uses (its layer, input and batch size, not a variation)
/// `exact_bonus` times: the estimates users ask for sum exactly those layers, and summing probes
/// of exactly a network's layers is within a few per cent of the whole network (measured:
/// 3.6 %), while the GP's interpolation is the larger error. The cost is the plan's networks'
/// measuring time in units of one small network (FLOPs beyond a reading's worth lengthen it).
/// Planning stops when σ is below `target_sigma` everywhere.
///
/// What a probe is worth (next_planned): the expected fall of the workload's estimate error, as
/// a share of the workload's energy, from one more sample of its key: the key's share of the
/// workload's estimated energy (of its work, for an item the model cannot estimate yet) × σ ×
/// (1 − √(n / (n + 1))) (a GP's σ shrinks about as 1/√n). Energy, not work: batch norm,
/// activations and pooling on large feature maps cost far more than their FLOPs say, and weighted
/// by work they kept 3-5 samples while the estimates that put a fifth to a half of a network's
/// energy in them erred by +37-67 % (e2e_accuracy run 7). A daemon weighs
/// that against what a probe costs (ProbeService: probing stops when it no longer pays).
struct PlannedProbe {
  ProbePlan plan;
  /// Expected fall of the workload's relative estimate error; +inf for a seed or a kind with no
  /// model at all (the workload has no estimate without it: always worth probing).
  double error_reduction = 0.0;
  double cost = 0.0;  ///< in units of one small network's measuring time (plan_cost)
};

class ProbePlanner {
 public:
  ProbePlanner(std::vector<WorkloadItem> workload, const CampaignOptions& options, double target_sigma = 0.0);

  /// Replaces the workload (queued and recent jobs change); targets already probed stay probed.
  void set_workload(std::vector<WorkloadItem> workload);
  /// The next probe, or nothing when every candidate is probed or the model is sure enough.
  std::optional<ProbePlan> next(const DeviceEnergyModel& model) const;
  /// The same with what it is worth. The answer is kept until the model's revision or the
  /// planner changes: an idle daemon asks once a second (bench/accuracy/planner_idle_check: 2 ms
  /// a question for 22 workload items), and most of the time nothing has changed.
  std::optional<PlannedProbe> next_planned(const DeviceEnergyModel& model) const;
  /// Plans stop once σ is below this everywhere (0: go on until every candidate is probed).
  void set_target_sigma(double sigma) {
    if (sigma != target_sigma_) ++revision_;
    target_sigma_ = sigma;
  }
  /// Whether some needed (kind, position) still lacks its seed probes.
  bool seeding() const;
  /// Records that a target was probed (or failed for good: it is not tried again).
  void mark_probed(const ProbeTarget& target);
  /// Undoes mark_probed: a target taken into a batch of probes that never ran (the batch was
  /// pre-empted or failed before it) is a candidate again.
  void unmark_probed(const ProbeTarget& target);
  /// The largest weighted latent σ over unprobed candidates (+inf where a needed model is missing).
  double worst_uncertainty(const DeviceEnergyModel& model) const;
  std::size_t candidate_count() const { return plans_.size(); }
  std::size_t probed_count() const { return probed_.size(); }

 private:
  /// The keys that still have an unprobed configuration of the workload's own.
  std::set<std::string> keys_with_unprobed_exact() const;
  std::optional<PlannedProbe> plan_next(const DeviceEnergyModel& model) const;
  std::size_t probes_of(const std::string& key) const;

  std::vector<std::int64_t> batch_sizes_;
  std::size_t seed_samples_;
  double target_sigma_;
  static constexpr double kExactBonus = 3.0;
  std::vector<ProbePlan> plans_;
  std::vector<std::string> ids_;
  std::vector<bool> exact_;                      // the workload's own configuration, not a variation
  std::vector<std::string> keys_;                // planned_key(plans_[i]).name()
  std::vector<double> costs_;                    // plan_cost of plans_[i]
  /// Each (kind, position)'s share of the workload, summed over its items: of an item's
  /// estimated energy per step where the model estimates it, else of its work.
  std::map<std::string, double> weights(const DeviceEnergyModel& model) const;

  struct Item {
    std::vector<AnalyzedLayer> layers;
    TrainingConfig training;                    // one step at the item's batch size and optimizer
    std::map<std::string, double> work_shares;  // by LayerKey::name()
  };
  std::vector<Item> items_;
  std::size_t workload_items_ = 0;
  std::set<std::string> probed_;                 // target ids
  std::map<std::string, std::size_t> per_key_;   // probes per LayerKey::name()
  std::map<std::string, std::vector<Eigen::VectorXd>> probed_points_;  // probed design points per key

  // next_planned's last answer, and what it was computed from. Not thread-safe, as the rest
  // of the planner: one owner asks.
  std::uint64_t revision_ = 0;  // bumped by every change of the planner's own state
  struct LastAnswer {
    std::uint64_t model_revision = 0;
    std::uint64_t planner_revision = 0;
    std::optional<PlannedProbe> planned;
  };
  mutable std::optional<LastAnswer> last_;
};

/// Runs `options.probes` probes against `meter`, adding every decomposed sample and every
/// measured network to `model`, and leaves the model fitted.
Result<CampaignReport> run_campaign(DeviceEnergyModel& model, const std::vector<WorkloadItem>& workload,
                                    const NetworkMeter& meter, const CampaignOptions& options);

}  // namespace joule::estimator
