#include "builtin_training.hpp"

#include <chrono>
#include <cmath>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "network_builder.hpp"
#include "trainer.hpp"

namespace joule::worker {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

Error invalid(std::string message, std::string where = {}) {
  return make_error(ErrorCode::invalid_argument, std::move(message), std::move(where));
}

// What identifies a checkpoint's network and training: resuming another one would load weights
// of other shapes (or train on with another optimizer's state).
std::string identity_of(const TrainRequest& request) {
  return json{{"model", estimator::to_json(request.model)},
              {"batch_size", request.training.batch_size},
              {"optimizer", request.training.optimizer}}
      .dump();
}

// Writes through a temporary file and a rename: a kill mid-write leaves the last checkpoint.
template <typename Save>
Status write_atomically(const fs::path& file, Save save) {
  const fs::path temporary = file.string() + ".tmp";
  try {
    save(temporary);
  } catch (const std::exception& error) {
    return make_error(ErrorCode::io, fmt::format("{}: {}", temporary.string(), error.what()));
  }
  std::error_code ec;
  fs::rename(temporary, file, ec);
  if (ec) return make_error(ErrorCode::io, fmt::format("{}: {}", file.string(), ec.message()));
  return {};
}

// How a layer is named in firing rates: its name in the spec, else its index and type ("3_relu").
std::string layer_label(const estimator::ModelSpec& spec, std::size_t index) {
  const auto& layer = spec.layers.at(index);
  return layer.name.empty() ? fmt::format("{}_{}", index, layer.type) : layer.name;
}

}  // namespace

Result<TrainSummary> run_training(const TrainRequest& request,
                                  const std::function<void(const EpochReport&)>& on_epoch) {
  if (auto status = check_device(request.device); !status) return status.error();
  set_worker_threads(request.threads);
  const torch::Device device(torch_device(request.device));
  auto session = TrainingSession::create(
      request.model, {request.training.batch_size, request.training.optimizer, device, request.seed});
  if (!session) return session.error();
  const auto& spec = request.model;
  const auto& output = session->network().layers.back().output_shape;
  const bool classifies = spec.loss != "mse";
  if (auto checked = check_dataset_for_model(request.dataset, spec); !checked) return checked.error();

  // The dataset, checked against the model, as tensors: the last `holdout` samples held out.
  DatasetSpec dataset = request.dataset;
  const std::int64_t samples_per_epoch = request.training.samples_per_epoch;
  if (dataset.format == DatasetSpec::Format::synthetic && dataset.samples == 0) {
    const auto split = split_dataset(dataset, 0, samples_per_epoch);
    dataset.samples = split.train + split.holdout;
  }
  if (dataset.format == DatasetSpec::Format::synthetic && classifies) dataset.classes = output.back();
  auto data = load_dataset(dataset, spec.input_shape, request.seed);
  if (!data) return data.error();
  const std::int64_t samples = data->info.samples;
  const auto [train, holdout] = split_dataset(request.dataset, samples, samples_per_epoch);
  torch::Tensor inputs;
  if (spec.input_dtype == "token") {
    std::int64_t vocabulary = 1;
    for (const auto& layer : spec.layers)
      if (layer.type == "embedding") {
        vocabulary = layer.args.value("num_embeddings", std::int64_t{1});
        break;
      }
    torch::manual_seed(request.seed);
    inputs = torch::randint(0, vocabulary, batched(samples, spec.input_shape), torch::kLong);
  } else {
    inputs = torch::from_blob(data->values.data(), batched(samples, spec.input_shape), torch::kFloat).clone();
  }
  torch::Tensor targets;
  if (classifies) {
    targets = torch::from_blob(data->labels.data(), {samples}, torch::kLong).clone();
    // A per-position output ([seq, C]) has one label per position: the sample's label repeated.
    std::int64_t positions = 1;
    for (std::size_t i = 0; i + 1 < output.size(); ++i) positions *= output[i];
    if (positions > 1) targets = targets.unsqueeze(1).expand({samples, positions}).contiguous();
  } else {
    torch::manual_seed(request.seed + 1);
    targets = torch::randn(batched(samples, output));
  }
  inputs = inputs.to(device);
  targets = targets.to(device);

  // Resume from the last finished epoch of the same network and training.
  TrainSummary summary;
  summary.epochs = static_cast<int>(request.training.epochs);
  const auto& directory = request.checkpoint_directory;
  const fs::path state_file = directory / "checkpoint.json", model_file = directory / "model.pt",
                 optimizer_file = directory / "optimizer.pt";
  if (!directory.empty()) {
    std::error_code ec;
    fs::create_directories(directory, ec);
    if (ec) return make_error(ErrorCode::io, fmt::format("{}: {}", directory.string(), ec.message()));
    if (fs::exists(state_file)) {
      std::ifstream in(state_file);
      const json state = json::parse(in, nullptr, false);
      if (!state.is_object() || state.value("identity", "") != identity_of(request))
        return invalid(
            fmt::format("{} holds a checkpoint of another network or training; remove it or give another "
                        "checkpoint directory",
                        state_file.string()));
      try {
        torch::load(session->network().module, model_file.string());
        torch::load(session->optimizer(), optimizer_file.string());
      } catch (const c10::Error& error) {
        return invalid(
            fmt::format("{}: the checkpoint cannot be loaded: {}", directory.string(), error.what_without_backtrace()));
      }
      summary.first_epoch = state.value("epoch", 0) + 1;
      summary.final_loss = state.contains("loss") ? std::optional<double>(state["loss"].get<double>()) : std::nullopt;
      summary.weights = model_file;
    }
  }

  auto& module = session->network().module;
  const std::optional<estimator::EatConfig>& eat = request.training.eat;
  const std::int64_t batch = request.training.batch_size;
  for (int epoch = summary.first_epoch; epoch <= summary.epochs; ++epoch) {
    const auto started = std::chrono::steady_clock::now();
    // The order of an epoch depends on the seed and the epoch only: a resumed run sees the
    // batches the uninterrupted one would have.
    torch::manual_seed(request.seed * 1000003 + static_cast<std::uint64_t>(epoch));
    const torch::Tensor order = torch::randperm(train, torch::kLong).to(device);
    double loss_sum = 0.0, penalty_sum = 0.0;
    std::int64_t batches = 0;
    for (std::int64_t from = 0; from < train; from += batch) {
      const auto rows = order.slice(0, from, std::min(from + batch, train));
      torch::Tensor batch_targets = targets.index_select(0, rows);
      if (classifies) batch_targets = batch_targets.reshape(-1);  // B·positions rows, as compute_loss has them
      if (eat) {
        const auto [loss, penalty] = session->step(inputs.index_select(0, rows), batch_targets, *eat);
        loss_sum += loss.item<double>();
        penalty_sum += penalty.item<double>();
      } else {
        loss_sum += session->step(inputs.index_select(0, rows), batch_targets).item<double>();
      }
      ++batches;
    }
    EpochReport report;
    report.epoch = epoch;
    report.epochs = summary.epochs;
    report.loss = batches > 0 ? loss_sum / static_cast<double>(batches) : 0.0;
    report.train_samples = train;
    report.holdout_samples = holdout;
    if (!std::isfinite(report.loss))
      return make_error(ErrorCode::internal, fmt::format("epoch {}: the training loss became {}", epoch, report.loss));
    if (eat) report.penalty = batches > 0 ? penalty_sum / static_cast<double>(batches) : 0.0;
    if ((classifies && holdout > 0) || eat) {
      // One pass in eval mode over the held-out samples (the training ones where none are held
      // out, for firing rates only): accuracy, and with EAT which activations fire.
      torch::NoGradGuard no_grad;
      module->eval();
      const bool on_holdout = holdout > 0;
      const std::int64_t first = on_holdout ? train : 0, last = on_holdout ? samples : train;
      std::int64_t correct = 0, counted = 0;
      std::vector<double> fired(module->size(), 0.0), seen(module->size(), 0.0);
      const auto count_firing = [&](std::size_t index, const torch::Tensor& activations) {
        if (!is_sparsity_layer(session->network(), index)) return;
        fired[index] += static_cast<double>(activations.ne(0).sum().item<std::int64_t>());
        seen[index] += static_cast<double>(activations.numel());
      };
      for (std::int64_t from = first; from < last; from += batch) {
        const auto to = std::min(from + batch, last);
        const torch::Tensor output = eat ? module->forward_observed(inputs.slice(0, from, to), count_firing)
                                         : module->forward(inputs.slice(0, from, to));
        if (!classifies || !on_holdout) continue;
        const torch::Tensor predicted = output.argmax(-1).reshape(-1);
        const torch::Tensor expected = targets.slice(0, from, to).reshape(-1);
        correct += predicted.eq(expected).sum().item<std::int64_t>();
        counted += expected.numel();
      }
      module->train();
      if (classifies && on_holdout)
        report.accuracy = counted > 0 ? static_cast<double>(correct) / static_cast<double>(counted) : 0.0;
      for (std::size_t i = 0; i < fired.size(); ++i)
        if (seen[i] > 0) report.firing_rates.emplace_back(layer_label(spec, i), fired[i] / seen[i]);
    }
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (!directory.empty()) {
      if (auto status = write_atomically(model_file, [&](const fs::path& to) { torch::save(module, to.string()); });
          !status)
        return status.error();
      if (auto status = write_atomically(optimizer_file,
                                         [&](const fs::path& to) { torch::save(session->optimizer(), to.string()); });
          !status)
        return status.error();
      json state = {{"identity", identity_of(request)}, {"epoch", epoch}, {"loss", report.loss}};
      if (report.accuracy) state["accuracy"] = *report.accuracy;
      if (auto status =
              write_atomically(state_file, [&](const fs::path& to) { std::ofstream(to) << state.dump() << "\n"; });
          !status)
        return status.error();
      summary.weights = model_file;
    }
    summary.final_loss = report.loss;
    summary.final_accuracy = report.accuracy;
    on_epoch(report);
  }
  return summary;
}

}  // namespace joule::worker
