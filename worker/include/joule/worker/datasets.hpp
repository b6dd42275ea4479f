#pragma once
// Datasets the built-in trainer reads, from files only (nothing is ever downloaded): MNIST's IDX
// pair (images and labels), CIFAR-10's binary batches, and CSV (numeric features, a class
// label); or synthetic data. Torch-free, so jouled checks a job's dataset at submit with the same
// code joule-worker loads it with: a file with the wrong format, size or label range is refused
// naming the file and the reason.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"
#include "joule/estimator/model_spec.hpp"

namespace joule::worker {

/// `run.builtin.dataset` of a job, parsed.
struct DatasetSpec {
  enum class Format { synthetic, mnist_idx, cifar10, csv };
  Format format = Format::synthetic;
  /// mnist_idx: {images, labels}; cifar10: one or more batch files; csv: one file.
  std::vector<std::filesystem::path> files;
  /// csv: the label's column (0-based; default the last) and whether the first line is a header.
  std::optional<std::size_t> label_column;
  bool header = false;
  /// synthetic: samples (the training's samples_per_epoch when 0) and classes.
  std::int64_t samples = 0;
  std::int64_t classes = 10;
  /// The share of samples held out to report accuracy on each epoch (the last ones).
  double holdout = 0.1;
};

/// What a dataset holds, as read from its headers and sizes (and, for labels, its contents).
struct DatasetInfo {
  std::int64_t samples = 0;
  std::vector<std::int64_t> sample_shape;  ///< per sample, e.g. {1, 28, 28}, {3, 32, 32}, {features}
  std::int64_t classes = 0;                ///< 1 + the largest label
};

/// A dataset in memory: samples × shape floats (pixels scaled to [0, 1]) and a label each.
struct Dataset {
  DatasetInfo info;
  std::vector<float> values;
  std::vector<std::int64_t> labels;
};

/// Parses `{"format": "mnist-idx", "images": F, "labels": F}`, `{"format": "cifar10", "files":
/// [F...]}`, `{"format": "csv", "file": F, "label_column"?, "header"?}` or `{"format":
/// "synthetic", "samples"?, "classes"?}`, each with an optional "holdout" (0 ≤ h < 1). Relative
/// paths are taken from `base` (the job's working directory). Errors name the field by
/// pointer under `pointer`.
Result<DatasetSpec> parse_dataset_spec(const nlohmann::json& json, const std::string& pointer,
                                       const std::filesystem::path& base = {});

/// Reads the headers (and the labels) and checks sizes: nothing but what validation needs.
/// Errors name the file and what is wrong with it ("t10k-labels-idx1-ubyte: magic 0x00000803 is
/// an image file, not labels").
Result<DatasetInfo> inspect_dataset(const DatasetSpec& spec);

/// Checks a dataset against the network that trains on it: the model's per-sample input shape
/// must be the dataset's, and the output layer's classes must cover its labels.
Status check_dataset_fits(const DatasetInfo& info, const std::vector<std::int64_t>& input_shape,
                          std::int64_t model_classes);

/// How the built-in trainer splits a dataset: `train` samples each epoch, then `holdout` held out
/// (the last ones) to report accuracy on.
struct DatasetSplit {
  std::int64_t train = 0;
  std::int64_t holdout = 0;
};
/// Synthetic data drawn to size (no `samples` given) trains on `samples_per_epoch` samples and
/// holds out the `holdout` share of that many more; a dataset of `samples` holds out that share
/// of them (rounded down; one sample at least trains).
DatasetSplit split_dataset(const DatasetSpec& spec, std::int64_t samples, std::int64_t samples_per_epoch);

/// The built-in trainer's whole check of a job's dataset against its model (jouled's at submit,
/// joule-worker's before training): files only for classifiers of pixels or numbers (token
/// inputs and the mse loss train on synthetic data), then the files' headers and labels, then
/// the shapes and classes. Errors point under /run/builtin/dataset.
Result<DatasetInfo> check_dataset_for_model(const DatasetSpec& spec, const estimator::ModelSpec& model);

/// Loads every sample (synthetic data is drawn from `seed` with `input_shape`).
Result<Dataset> load_dataset(const DatasetSpec& spec, const std::vector<std::int64_t>& input_shape,
                             std::uint64_t seed = 1);

}  // namespace joule::worker
