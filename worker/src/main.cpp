// joule-worker: trains model specs with LibTorch and meters them, for jouled (probe) and for people
// (measure, meters, env). Machine-readable output on stdout; one line on stderr for errors, exit
// code 2 for bad input and 1 for failures at run time.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "builtin_training.hpp"
#include "environment.hpp"
#include "joule/adapters/board_power.hpp"
#include "joule/adapters/measurement_window.hpp"
#include "joule/adapters/meter_selection.hpp"
#if JOULE_WORKER_PROGRESS
#include "joule/client/http_client.hpp"
#endif
#include "joule/common/energy_source.hpp"
#include "joule/estimator/model_spec.hpp"
#include "joule/worker/protocol.hpp"
#include "runtime_probe.hpp"
#include "trainer.hpp"

namespace {

using nlohmann::json;
using namespace joule;
using namespace joule::worker;

constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;

/// A failure that main reports as one line and turns into an exit code.
struct Failure {
  int exit_code;
  std::string message;
};

[[noreturn]] void fail(const Error& error, const std::string& file = {}) {
  std::string message = file.empty() ? "" : file + ": ";
  if (!error.where.empty()) message += error.where + ": ";
  message += error.message;
  throw Failure{error.code == ErrorCode::invalid_argument ? kExitBadInput : kExitFailure, std::move(message)};
}

json read_json(const std::string& file) {
  std::ostringstream text;
  if (file == "-") {
    text << std::cin.rdbuf();
  } else {
    std::ifstream in(file);
    if (!in) throw Failure{kExitBadInput, fmt::format("{}: cannot open", file)};
    text << in.rdbuf();
  }
  try {
    return json::parse(text.str());
  } catch (const json::parse_error& e) {
    throw Failure{kExitBadInput, fmt::format("{}: not JSON: {}", file == "-" ? "stdin" : file, e.what())};
  }
}

adapters::SelectedMeter open_meter(const std::string& device, const std::string& meter, double idle_watts,
                                   double watts_per_busy_core, const std::string& scope) {
  adapters::MeterRequest request;
  request.device = device;
  request.meter = meter;
  request.modelled = adapters::ModelledCpuParams{idle_watts, watts_per_busy_core};
  request.scope = scope;
  auto selected = adapters::select_meter(request);
  if (!selected) fail(selected.error());
  return std::move(selected).value();
}

// Probes must count this process only: other jobs' CPU load is not the probe's energy.
ProbeResult probe(const ProbeRequest& request) {
  if (auto status = check_device(request.device); !status) fail(status.error());
  auto meter = open_meter(request.device, request.meter, request.idle_watts, request.watts_per_busy_core, "process");
  auto result = run_probe(request, *meter.meter);
  if (!result) fail(result.error());
  return std::move(result).value();
}

void print_json(const json& value) { std::cout << value.dump() << '\n' << std::flush; }

std::string format_seconds(double seconds) {
  if (seconds < 1e-3) return fmt::format("{:.1f} µs", seconds * 1e6);
  if (seconds < 1.0) return fmt::format("{:.3f} ms", seconds * 1e3);
  return fmt::format("{:.3f} s", seconds);
}

void print_table(const ProbeResult& result, int threads, int repetitions) {
  const auto& env = result.environment;
  for (const auto& network : result.networks) {
    fmt::print("{}: batch {}, {}, {} ({}), torch {}, {} thread(s)\n", network.name, result.batch_size, result.optimizer,
               env.device, env.device_name, env.torch_version, threads);
    fmt::print("  {:<10} {:>14} {:>9}\n", "per step", "median", "spread");
    fmt::print("  {:<10} {:>14} {:>8.1f}%\n", "seconds", format_seconds(network.seconds_per_step),
               100.0 * network.seconds_spread);
    fmt::print("  {:<10} {:>12.4g} J {:>8.1f}%  ({})\n", "energy", network.joules_per_step,
               100.0 * network.joules_spread,
               result.measured ? "measured: " + result.meter_source : result.meter_source + ", NOT a measurement");
    fmt::print("  final loss {:.4g}\n", network.final_loss);
  }
  fmt::print("{} readings x {} steps after {} warm-up steps; {:.2f} s in all\nBLAS: {}\n", repetitions,
             result.networks.empty() ? result.steps_per_repetition : result.networks[0].steps_per_repetition,
             result.warmup_steps, result.wall_seconds, env.blas);
}

struct MeasureOptions {
  std::string model_file;
  std::int64_t batch_size = 0;  // 0: the job's training.batch_size, else 32
  int steps = 20;
  int warmup = 10;
  int repetitions = 10;
  double min_reading_seconds = 0.0;
  std::string device = "cpu";
  int threads = 1;
  std::string optimizer;  // empty: the job's training.optimizer, else sgd
  std::string meter = "auto";
  double idle_watts = 10.0;
  double watts_per_busy_core = 12.0;
  std::uint64_t seed = 1;
  bool json_output = false;
};

ProbeRequest measure_request(const MeasureOptions& options) {
  const json document = read_json(options.model_file);
  ProbeRequest request;
  const bool job = document.is_object() && document.contains("model");
  const std::string pointer = job ? "/model" : "";
  auto spec = estimator::parse_model_spec(job ? document.at("model") : document, pointer);
  if (!spec) fail(spec.error(), options.model_file);
  if (spec->name.empty() && job && document.contains("name") && document.at("name").is_string())
    spec->name = document.at("name").get<std::string>();
  if (spec->name.empty()) spec->name = "model";
  if (job && document.contains("training")) {
    auto training = estimator::parse_training_config(document.at("training"), "/training");
    if (!training) fail(training.error(), options.model_file);
    request.batch_size = training->batch_size;
    request.optimizer = training->optimizer;
  }
  if (options.batch_size > 0) request.batch_size = options.batch_size;
  if (!options.optimizer.empty()) request.optimizer = options.optimizer;
  request.device = options.device;
  request.threads = options.threads;
  request.warmup_steps = options.warmup;
  request.steps_per_repetition = options.steps;
  request.repetitions = options.repetitions;
  request.min_reading_seconds = options.min_reading_seconds;
  request.meter = options.meter;
  request.idle_watts = options.idle_watts;
  request.watts_per_busy_core = options.watts_per_busy_core;
  request.seed = options.seed;
  request.networks.push_back(std::move(spec).value());
  // The same checks as a probe request (device, meter, shapes at this batch size), same pointers.
  auto checked = parse_probe_request(to_json(request));
  if (!checked) {
    Error error = checked.error();
    if (error.where.rfind("/networks/0", 0) == 0) {
      error.where = pointer + error.where.substr(11);
      fail(error, options.model_file);
    }
    // Anything else came from an option: "/batch_size" is --batch-size.
    std::string option = error.where.substr(error.where.empty() ? 0 : 1);
    std::replace(option.begin(), option.end(), '_', '-');
    error.where = "--" + option;
    fail(error);
  }
  return std::move(checked).value();
}

json meters_report(const std::string& device, const std::string& meter, const std::string& scope, double seconds) {
  auto selected = open_meter(device, meter, 10.0, 12.0, scope);
  json considered = json::array();
  for (const auto& candidate : selected.considered)
    considered.push_back({{"source", candidate.source}, {"taken", candidate.taken}, {"reason", candidate.reason}});
  auto window = joule::adapters::MeasurementWindow::begin(*selected.meter, std::chrono::steady_clock::now());
  if (!window) fail(window.error());
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  auto measured = window->read(*selected.meter, std::chrono::steady_clock::now());
  if (!measured) fail(measured.error());
  return {{"device", device},
          {"scope", scope},
          {"considered", std::move(considered)},
          {"meter_source", measured->source},
          {"measured", measured->is_measurement()},
          {"seconds", measured->seconds},
          {"joules", measured->joules},
          {"mean_watts", measured->mean_watts()}};
}

struct TrainOptions {
  std::string job_file;
  std::string checkpoint;
  std::string device = "cpu";
  int threads = 1;
  std::uint64_t seed = 1;
};

// A job file's model, training and run.builtin.dataset (synthetic data when it names none).
TrainRequest train_request(const TrainOptions& options) {
  const json job = read_json(options.job_file);
  if (!job.is_object() || !job.contains("model") || !job.contains("training"))
    throw Failure{kExitBadInput, fmt::format("{}: a job with \"model\" and \"training\" is needed", options.job_file)};
  TrainRequest request;
  auto model = estimator::parse_model_spec(job.at("model"), "/model");
  if (!model) fail(model.error(), options.job_file);
  auto training = estimator::parse_training_config(job.at("training"), "/training");
  if (!training) fail(training.error(), options.job_file);
  request.model = std::move(model).value();
  request.training = std::move(training).value();
  json dataset = {{"format", "synthetic"}};
  if (const json* builtin = job.contains("run") && job.at("run").is_object() && job.at("run").contains("builtin")
                                ? &job.at("run").at("builtin")
                                : nullptr;
      builtin && builtin->is_object() && builtin->contains("dataset"))
    dataset = builtin->at("dataset");
  auto parsed = parse_dataset_spec(dataset, "/run/builtin/dataset");  // relative paths: from here
  if (!parsed) fail(parsed.error(), options.job_file);
  request.dataset = std::move(parsed).value();
  request.device = options.device;
  request.threads = options.threads;
  request.seed = options.seed;
  request.checkpoint_directory = options.checkpoint;
  return request;
}

// EAT's firing rates, by layer name.
json firing_json(const EpochReport& epoch) {
  json rates = json::object();
  for (const auto& [layer, rate] : epoch.firing_rates) rates[layer] = rate;
  return rates;
}

// Reports an epoch to jouled as a job's own script would (POST /v1/jobs/{id}/progress with its
// token), when run as a job ($JOULE_URL and $JOULE_JOB_ID set). Never stops training: the
// first failure is one line on stderr, later ones are silent.
#if JOULE_WORKER_PROGRESS
class ProgressReporter {
 public:
  ProgressReporter() {
    const char* url = std::getenv("JOULE_URL");
    const char* job = std::getenv("JOULE_JOB_ID");
    if (!url || !job || !*url || !*job) return;
    auto server = client::parse_server_url(url);
    if (!server) {
      warn(fmt::format("JOULE_URL {}: {}", url, server.error().message));
      return;
    }
    const char* token = std::getenv("JOULE_JOB_TOKEN");
    client_.emplace(*server, token ? token : "", std::chrono::seconds(5));
    target_ = fmt::format("/v1/jobs/{}/progress", job);
  }

  void report(const EpochReport& epoch) {
    if (!client_) return;
    json body = {{"epoch", epoch.epoch}, {"epochs", epoch.epochs}, {"loss", epoch.loss}};
    if (epoch.accuracy) body["accuracy"] = *epoch.accuracy;
    if (!epoch.firing_rates.empty()) body["firing_rates"] = firing_json(epoch);
    const auto reply = client_->request("POST", target_, body.dump());
    if (!reply) return warn(reply.error().message);
    if (reply->status >= 300) warn(fmt::format("HTTP {}: {}", reply->status, reply->body.substr(0, 300)));
  }

 private:
  void warn(const std::string& why) {
    if (warned_) return;
    warned_ = true;
    std::cerr << "joule-worker: could not report progress to jouled (" << why << "); training goes on\n";
  }

  std::optional<client::HttpClient> client_;
  std::string target_;
  bool warned_ = false;
};
#else
// A worker built alone (JOULE_WORKER_ONLY, for a GPU node's LibTorch) has no HTTP client: jouled's
// Boost and OpenSSL are not there. As a job it says once that progress goes unreported.
class ProgressReporter {
 public:
  void report(const EpochReport&) {
    if (warned_ || !std::getenv("JOULE_URL") || !std::getenv("JOULE_JOB_ID")) return;
    warned_ = true;
    std::cerr << "joule-worker: built without jouled's HTTP client (JOULE_WORKER_ONLY): progress is not "
                 "reported to jouled; training goes on\n";
  }

 private:
  bool warned_ = false;
};
#endif

int run(int argc, char** argv) {
  CLI::App app{"joule-worker: trains model specs with LibTorch and meters their energy per step"};
  app.require_subcommand(1);

  std::vector<std::string> request_files;
  auto* probe_cmd = app.add_subcommand(
      "probe", "Train and meter the networks of each probe request, in order (one JSON result line each)");
  probe_cmd
      ->add_option("--request", request_files,
                   "Probe request JSON file, or - for stdin; repeated, the requests run in one process and each "
                   "result is printed (and flushed) as soon as it is measured")
      ->required();

  MeasureOptions measure;
  auto* measure_cmd = app.add_subcommand("measure", "Train one whole model and meter joules and seconds per step");
  measure_cmd->add_option("--model", measure.model_file, "Model spec JSON, or a job JSON with a \"model\" key")
      ->required();
  measure_cmd->add_option("--batch-size", measure.batch_size, "Batch size (default: the job's, else 32)")
      ->check(CLI::Range(1, 1 << 20));
  measure_cmd->add_option("--steps", measure.steps, "Training steps per metered reading")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  measure_cmd->add_option("--warmup", measure.warmup, "Unmetered warm-up steps")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  measure_cmd->add_option("--repetitions", measure.repetitions, "Metered readings (medians are reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  measure_cmd
      ->add_option("--min-reading-seconds", measure.min_reading_seconds,
                   "Each reading lasts at least this long (0: by meter, 2 s for NVML)")
      ->check(CLI::Range(0.0, 3600.0));
  measure_cmd->add_option("--device", measure.device, "cpu, cuda:N or mig:G.I (with CUDA_VISIBLE_DEVICES naming it)")
      ->capture_default_str();
  measure_cmd->add_option("--threads", measure.threads, "Intra-op and BLAS threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  measure_cmd
      ->add_option("--optimizer", measure.optimizer,
                   "sgd, sgd_momentum, adam, adamw or rmsprop (default: the job's, else sgd)")
      ->check(CLI::IsMember({"sgd", "adam"}));
  measure_cmd->add_option("--meter", measure.meter, "auto, rapl, nvml, ina3221, hwmon, battery or modelled")
      ->capture_default_str();
  measure_cmd->add_option("--idle-watts", measure.idle_watts,
                         "Modelled meter: idle power (default: the board's published figure, else 10)");
  measure_cmd->add_option("--watts-per-busy-core", measure.watts_per_busy_core,
                         "Modelled meter: per busy core (default: the board's published figure, else 12)");
  measure_cmd->add_option("--seed", measure.seed, "Seed of weights and synthetic data")->capture_default_str();
  measure_cmd->add_flag("--json", measure.json_output, "Print the JSON result instead of a table");

  std::string meters_device = "cpu";
  std::string meters_meter = "auto";
  std::string meters_scope = "device";
  double meters_seconds = 1.0;
  auto* meters_cmd = app.add_subcommand("meters", "Show the meter chosen for a device and read it for a while");
  meters_cmd->add_option("--device", meters_device, "cpu, cuda:N or mig:G.I (with CUDA_VISIBLE_DEVICES naming it)")
      ->capture_default_str();
  meters_cmd->add_option("--meter", meters_meter, "auto or one source to force")->capture_default_str();
  meters_cmd->add_option("--scope", meters_scope, "device (whole device) or process (this process, modelled only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"device", "process"}));
  meters_cmd->add_option("--seconds", meters_seconds, "How long to read")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));

  TrainOptions train;
  auto* train_cmd = app.add_subcommand(
      "train", "Train a job's model spec on its run.builtin dataset (or synthetic data): one JSON line per epoch");
  train_cmd->add_option("--job", train.job_file, "Job JSON with \"model\", \"training\" and run.builtin.dataset")
      ->required();
  train_cmd->add_option("--checkpoint", train.checkpoint,
                        "Directory for checkpoints after each epoch; a run given one that holds a checkpoint of the "
                        "same job resumes after its epoch");
  train_cmd->add_option("--device", train.device, "cpu, cuda:N or mig:G.I (with CUDA_VISIBLE_DEVICES naming it)")
      ->capture_default_str();
  train_cmd->add_option("--threads", train.threads, "Intra-op and BLAS threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  train_cmd->add_option("--seed", train.seed, "Seed of weights, synthetic data and the epochs' order")
      ->capture_default_str();

  std::string env_device = "cpu";
  int env_threads = 1;
  auto* env_cmd = app.add_subcommand("env", "Print the environment (LibTorch, BLAS, threads, device) as JSON");
  env_cmd->add_option("--device", env_device, "cpu, cuda:N or mig:G.I (with CUDA_VISIBLE_DEVICES naming it)")
      ->capture_default_str();
  env_cmd->add_option("--threads", env_threads, "Threads to set before reporting")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));

  RuntimeProbeRequest runtime;
  bool runtime_json = false;
  auto* runtime_cmd = app.add_subcommand(
      "runtime",
      "Meter a Python interpreter's start-up (to `import torch`) and its training loop's cost per step beyond the "
      "same loop in LibTorch");
  runtime_cmd->add_option("--python", runtime.python, "The interpreter: a path, or a name looked up in PATH")
      ->capture_default_str();
  runtime_cmd->add_option("--device", runtime.device, "cpu (the loop's cost is measured on the CPU)")
      ->capture_default_str();
  runtime_cmd->add_option("--threads", runtime.threads, "Intra-op and BLAS threads, both sides")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  runtime_cmd->add_option("--blocks", runtime.blocks, "Networks of this many Linear + ReLU blocks (two or more)")
      ->capture_default_str()
      ->delimiter(',');
  runtime_cmd
      ->add_option("--kinds", runtime.kinds,
                   "Layer kinds read each on its own network (conv2d, batchnorm1d, lstm...; not linear or relu)")
      ->delimiter(',');
  runtime_cmd->add_option("--width", runtime.width, "Features of every Linear")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  runtime_cmd->add_option("--batch-size", runtime.batch_size, "Batch size")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  runtime_cmd->add_option("--readings", runtime.readings, "Readings per network and side (medians are kept)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  runtime_cmd->add_option("--reading-seconds", runtime.reading_seconds, "Each reading's length (0: by meter)")
      ->check(CLI::Range(0.0, 3600.0));
  runtime_cmd->add_option("--meter", runtime.meter, "auto, rapl, nvml, ina3221, hwmon, battery or modelled")
      ->capture_default_str();
  runtime_cmd->add_option("--idle-watts", runtime.idle_watts,
                         "Modelled meter: idle power (default: the board's published figure, else 10)");
  runtime_cmd->add_option("--watts-per-busy-core", runtime.watts_per_busy_core,
                         "Modelled meter: per busy core (default: the board's published figure, else 12)");
  runtime_cmd->add_flag("--json", runtime_json, "Print the JSON result instead of a table");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return 0;
  } catch (const CLI::ParseError& e) {
    // Subcommand help arrives as CallForHelp too; other parse errors are bad input.
    if (e.get_exit_code() == 0) {
      std::cout << (probe_cmd->parsed()     ? probe_cmd->help()
                    : measure_cmd->parsed() ? measure_cmd->help()
                    : meters_cmd->parsed()  ? meters_cmd->help()
                    : env_cmd->parsed()     ? env_cmd->help()
                    : train_cmd->parsed()   ? train_cmd->help()
                    : runtime_cmd->parsed() ? runtime_cmd->help()
                                            : app.help());
      return 0;
    }
    if (argc > 1 && argv[1][0] != '-' && app.get_subcommands().empty())
      throw Failure{
          kExitBadInput,
          fmt::format("unknown subcommand \"{}\": use probe, measure, train, runtime, meters or env", argv[1])};
    throw Failure{kExitBadInput, e.what()};
  }

  // Run by hand, the modelled meter takes the board's published figures unless both are given
  // (jouled passes its device's own with each probe request).
  const auto board_figures = [](CLI::App* command, double& idle_watts, double& watts_per_busy_core) {
    if (command->count("--idle-watts") > 0 || command->count("--watts-per-busy-core") > 0) return;
    const auto board = adapters::board_defaults(adapters::read_board_model());
    idle_watts = board.params.idle_watts;
    watts_per_busy_core = board.params.watts_per_busy_core;
  };
  board_figures(measure_cmd, measure.idle_watts, measure.watts_per_busy_core);
  board_figures(runtime_cmd, runtime.idle_watts, runtime.watts_per_busy_core);

  if (probe_cmd->parsed()) {
    // Every request is checked before the first runs: a bad one is bad input, not a failure
    // halfway through a batch. Results are printed one per line, each flushed once measured,
    // so a batch ended early (jouled pre-empts it for a job) keeps what it measured.
    std::vector<ProbeRequest> requests;
    for (const auto& file : request_files) {
      auto request = parse_probe_request(read_json(file));
      if (!request) fail(request.error(), file == "-" ? "stdin" : file);
      requests.push_back(std::move(request).value());
    }
    for (const auto& request : requests) print_json(to_json(probe(request)));
  } else if (measure_cmd->parsed()) {
    const ProbeRequest request = measure_request(measure);
    const ProbeResult result = probe(request);
    if (measure.json_output)
      print_json(to_json(result));
    else
      print_table(result, request.threads, request.repetitions);
  } else if (meters_cmd->parsed()) {
    print_json(meters_report(meters_device, meters_meter, meters_scope, meters_seconds));
  } else if (train_cmd->parsed()) {
    const TrainRequest request = train_request(train);
    ProgressReporter progress;
    auto summary = run_training(request, [&](const EpochReport& epoch) {
      json line = {{"epoch", epoch.epoch},
                   {"epochs", epoch.epochs},
                   {"loss", epoch.loss},
                   {"train_samples", epoch.train_samples},
                   {"holdout_samples", epoch.holdout_samples},
                   {"seconds", epoch.seconds}};
      if (epoch.accuracy) line["accuracy"] = *epoch.accuracy;
      if (epoch.penalty) line["sparsity_penalty"] = *epoch.penalty;
      if (!epoch.firing_rates.empty()) line["firing_rates"] = firing_json(epoch);
      print_json(line);
      progress.report(epoch);
    });
    if (!summary) fail(summary.error(), train.job_file);
    json done = {{"done", true}, {"first_epoch", summary->first_epoch}, {"epochs", summary->epochs}};
    if (summary->final_loss) done["final_loss"] = *summary->final_loss;
    if (summary->final_accuracy) done["final_accuracy"] = *summary->final_accuracy;
    if (!summary->weights.empty()) done["weights"] = summary->weights.string();
    print_json(done);
  } else if (runtime_cmd->parsed()) {
    auto result = run_runtime_probe(runtime);
    if (!result) fail(result.error());
    if (runtime_json) {
      print_json(to_json(*result));
    } else {
      auto cost = estimator::fit_runtime_cost(result->runtime, result->steps, result->starts);
      if (!cost) fail(cost.error());
      const std::string source =
          result->measured ? "measured: " + result->meter_source : result->meter_source + ", NOT a measurement";
      fmt::print("{} ({}), {} thread(s), joules {}\n", result->interpreter, result->version, runtime.threads, source);
      fmt::print("  start-up to `import torch`: {} and {:.4g} J (median of {})\n", format_seconds(cost->start_seconds),
                 cost->start_joules, result->starts.size());
      fmt::print("  {:>8} {:>14} {:>14} {:>14}\n", "modules", "python/step", "libtorch/step", "difference");
      for (const auto& r : result->steps)
        fmt::print("  {:>8} {:>14} {:>14} {:>14}\n", r.modules, format_seconds(r.runtime_seconds),
                   format_seconds(r.worker_seconds), format_seconds(r.extra_seconds()));
      fmt::print("  per step beyond LibTorch: {} + {} per module; {:.4g} J + {:.4g} J per module (±{:.0f} %)\n",
                 format_seconds(cost->step_seconds_base), format_seconds(cost->step_seconds_per_module),
                 cost->step_joules_base, cost->step_joules_per_module, 100.0 * cost->step_sigma);
    }
  } else if (env_cmd->parsed()) {
    if (auto status = check_device(env_device); !status) fail(status.error());
    set_worker_threads(env_threads);
    print_json(to_json(detect_environment(env_device)));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  pin_allocator();  // before anything allocates much: malloc's thresholds move timings
  try {
    return run(argc, argv);
  } catch (const Failure& failure) {
    std::cerr << "joule-worker: " << failure.message << '\n';
    return failure.exit_code;
  } catch (const std::exception& e) {
    std::cerr << "joule-worker: " << e.what() << '\n';
    return kExitFailure;
  }
}
