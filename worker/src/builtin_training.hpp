#pragma once
// `joule-worker train`: the built-in trainer. It trains a job's own model spec with its training
// settings on a dataset given as files (datasets.hpp) or on synthetic data, with the code probes
// run (TrainingSession, the same threads), reports loss and held-out accuracy each epoch, and
// checkpoints after each epoch so that a run started again with the same checkpoint directory
// resumes after the last finished epoch. Torch-free header.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "joule/common/result.hpp"
#include "joule/estimator/model_spec.hpp"
#include "joule/worker/datasets.hpp"

namespace joule::worker {

struct TrainRequest {
  estimator::ModelSpec model;
  estimator::TrainingConfig training;  ///< batch_size, epochs, optimizer; samples_per_epoch sizes synthetic data
  DatasetSpec dataset;
  std::string device = "cpu";
  int threads = 1;
  std::uint64_t seed = 1;
  /// Where checkpoints go (model.pt, optimizer.pt, checkpoint.json); empty: none.
  std::filesystem::path checkpoint_directory;
};

/// What one epoch did.
struct EpochReport {
  int epoch = 0;  ///< 1-based
  int epochs = 0;
  double loss = 0.0;               ///< mean training loss over the epoch
  std::optional<double> accuracy;  ///< on the held-out samples (cross_entropy models with a holdout)
  /// EAT (training.eat): the penalty's mean over the epoch (before λ), and the share of each
  /// counted layer's outputs that are not zero on the held-out samples (the training samples
  /// where none are held out), in eval mode: what zero-skipping hardware would skip.
  std::optional<double> penalty;
  std::vector<std::pair<std::string, double>> firing_rates;
  std::int64_t train_samples = 0;
  std::int64_t holdout_samples = 0;
  double seconds = 0.0;
};

struct TrainSummary {
  int first_epoch = 1;  ///< > 1 when resumed from a checkpoint
  int epochs = 0;
  std::optional<double> final_loss;
  std::optional<double> final_accuracy;
  std::filesystem::path weights;  ///< the last checkpoint's model.pt, when checkpointing
};

/// Trains `request`, calling `on_epoch` after each epoch (and its checkpoint). Errors:
/// invalid_argument for a model, dataset or checkpoint that does not fit (naming which),
/// unavailable for a missing device, internal for a loss that stops being finite.
Result<TrainSummary> run_training(const TrainRequest& request, const std::function<void(const EpochReport&)>& on_epoch);

}  // namespace joule::worker
