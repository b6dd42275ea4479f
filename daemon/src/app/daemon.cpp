#include "daemon.hpp"

#include <algorithm>
#include <csignal>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "joule/common/text.hpp"

#ifndef JOULE_VERSION
#define JOULE_VERSION "0.0.0"
#endif

namespace joule::daemon {

namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

std::chrono::steady_clock::duration seconds(double value) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(value));
}

template <typename T>
T checked(Result<T> result, const std::string& what) {
  if (!result) throw std::runtime_error(what + result.error().message);
  return std::move(result).value();
}

// What a policy needs of the node's signals: a money budget in another currency than [price]'s
// cannot be counted (an error: the policy is refused); min-carbon, min-cost and budgets in grams
// or money without their signal are warned of (jobs such a budget covers wait, saying why).
void check_policy_against_signals(const schedulers::Policy& policy, const config::DaemonConfig& config) {
  using schedulers::BudgetUnit;
  for (const auto& budget : policy.budgets) {
    if (budget.unit == BudgetUnit::money && config.price.configured() && !budget.currency.empty() &&
        budget.currency != config.price.currency)
      throw std::runtime_error(fmt::format("policies: budget {} is in {} but jouled.toml's [price] is in {}",
                                           budget.name, budget.currency, config.price.currency));
    if (budget.unit == BudgetUnit::grams && !config.carbon.configured())
      spdlog::warn(
          "budget {} counts grams of CO2e but jouled.toml has no [carbon] signal: jobs it covers wait until "
          "one is set",
          budget.name);
    if (budget.unit == BudgetUnit::money && !config.price.configured())
      spdlog::warn("budget {} counts money but jouled.toml has no [price] signal: jobs it covers wait until one is set",
                   budget.name);
  }
  if (policy.objective == schedulers::Objective::min_carbon && !config.carbon.configured())
    spdlog::warn(
        "placement.objective is min-carbon but jouled.toml has no [carbon] signal: jobs are placed as "
        "min-energy until one is set");
  if (policy.objective == schedulers::Objective::min_cost && !config.price.configured())
    spdlog::warn(
        "placement.objective is min-cost but jouled.toml has no [price] signal: jobs are placed as "
        "min-energy until one is set");
}

// The version and this node's name on every series; the name.
std::string label_metrics(Metrics& metrics, const config::DaemonConfig& config) {
  std::string name = node_name(config);
  metrics.set_up_info(JOULE_VERSION);
  metrics.set_node(name);
  return name;
}

}  // namespace

void LearningFromJobs::placing_on(const std::string& device) {
  if (probes_) probes_->preempt(device);
}

void LearningFromJobs::finished(const JobFeedback& feedback) {
  if (probes_) probes_->feedback(feedback);
  if (outcomes_.record(feedback)) publish_calibration();
}

bool LearningFromJobs::probing(const std::string& device) const { return probes_ && probes_->probing(device); }

void LearningFromJobs::publish_calibration() {
  for (const auto& [device, summary] : outcomes_.summaries()) metrics_.set_calibration(device, summary);
}

Daemon::Daemon(const CommandLine& command_line, config::DaemonConfig config)
    : command_line_(command_line),
      config_(std::move(config)),
      clock_(joule::system_clock()),
      state_(open_state(config_)),
      storage_(std::move(state_.database)),
      node_name_(label_metrics(metrics_, config_)),
      devices_(open_devices(config_)),
      control_journal_(open_control_journal(config_.state_directory / "controls.json", devices_, config_.nvpmodel)),
      job_options_([this] {
        auto options = job_service_options(config_);
        options.control_journal = control_journal_.get();
        return options;
      }()),
      signals_(io_, metrics_, config_.carbon, config::SignalKind::carbon, clock_),
      price_signals_(io_, metrics_, config_.price, config::SignalKind::price, clock_),
      estimates_(devices_, &outcomes_, slurm_model_sources(config_.slurm)),
      learning_(outcomes_, metrics_),
      jobs_(io_, storage_, metrics_, devices_, job_options_,
            JobServiceLinks{&estimates_, &learning_, &signals_.feed(), &price_signals_.feed()}, clock_),
      models_(
          io_, storage_, metrics_, [this] { models_changed(); }, clock_),
      probes_(io_, storage_, metrics_, models_, jobs_, jobs_.budgets(), devices_,
              ProbeServiceOptions{config_.probing, config_.state_directory, job_options_.worker, job_options_.runner,
                                  1.0, control_journal_.get(), job_options_.run_tool},
              clock_),
      slurm_(config_.slurm.node_types.empty()
                 ? nullptr
                 : std::make_unique<SlurmExecutor>(io_, jobs_.nodes(), config_.slurm, clock_)),
      coordinator_(config_.cluster.role != "coordinator"
                       ? nullptr
                       : std::make_unique<ClusterCoordinator>(
                             io_, jobs_, devices_, models_, metrics_,
                             CoordinatorOptions{config_.cluster.heartbeat_seconds, config_.cluster.lost_after_seconds,
                                                config_.price.configured() ? config_.price.currency : ""},
                             clock_)),
      agent_(config_.cluster.role != "agent"
                 ? nullptr
                 : std::make_unique<ClusterAgent>(
                       io_, jobs_.agent(), models_,
                       AgentOptions{node_name_, config_.cluster.coordinator,
                                    read_token_file(config_.cluster.token_file), config_.cluster.ca_file, JOULE_VERSION,
                                    config_.cluster.lost_after_seconds, &signals_.feed(), &price_signals_.feed()},
                       clock_)),
      usage_(io_, config_.state_directory / "jouled.db", node_name_),
      api_(ApiServices{jobs_, metrics_, devices_, &estimates_, &probes_, coordinator_.get(), agent_.get(), slurm_.get(),
                       &signals_, &price_signals_, &usage_}),
      server_(
          io_,
          [this](HttpRequest&& request, const HttpPeer& peer, Reply reply) {
            api_.handle(std::move(request), peer, std::move(reply));
          },
          server_options(config_, coordinator_ != nullptr),
          [this](unsigned status) { metrics_.observe_request("refused", status, 0.0); }) {
  jobs_.keep_finished_in(*state_.archive);
  {
    auto policy = checked(load_policy(policy_directory(config_, command_line_)), "policies: ");
    check_policy_against_signals(policy, config_);
    jobs_.budgets().set_policy(std::move(policy));
  }
  // The ledger keeps what its windows need (uses merged by device and minute); the rows read at
  // start, one per job of the last year, are let go here: kept in state_, 100,000 finished jobs
  // held 22 MiB for the daemon's whole life after a restart (bench/drained_queue_memory.py).
  jobs_.budgets().load(std::exchange(state_.energy_uses, {}));
  // Fair share's recent use, read back from the jobs that ended before now, off the loop: a
  // restart does not make a heavy user a new one (a year of jobs took ~0.6 s at a million).
  const auto [since, until] = jobs_.recent_use_span();  // after the policy: its half-life says how far
  usage_.recent_use(since, until, [this](Result<std::vector<adapters::RecentUse>> recent) {
    if (!recent) return spdlog::warn("fair share starts without recent use: {}", recent.error().message);
    jobs_.remember_recent_use(*recent);
  });
  // A new carbon or price signal may move or close a waiting job's window: a placement pass.
  signals_.on_change([this] { jobs_.signal_changed(); });
  price_signals_.on_change([this] { jobs_.signal_changed(); });
  estimates_.set_model_descriptions([this](const std::string& source) { return models_.model_info(source); });
  estimates_.set_runtime_problem([this](const std::string& device) { return probes_.runtime_problem(device); });
  estimates_.set_probe_caveats(
      [this](const std::string& device, const estimator::ModelSpec& model, const estimator::TrainingConfig& training) {
        return probes_.estimate_caveats(device, model, training);
      });
  learning_.attach(probes_);
  // Slurm's slot devices estimate with their node type's model (learnt here, or an agent's).
  if (coordinator_) coordinator_->describe_models_with(&estimates_);
  api_.set_access(access_config(config_));
}

void Daemon::models_changed() {
  estimates_.set_models(models_.models());
  // A model learnt under a new environment is corrected by that environment's rows only.
  for (const auto& [device, model] : estimates_.models())
    if (model) outcomes_.set_environment(device, model->environment());
  learning_.publish_calibration();
  jobs_.refresh_estimates();
}

void Daemon::start() {
  const auto endpoint = checked(server_.listen(config_.server.host, config_.server.port), "");
  const char* scheme = server_.uses_tls() ? "https" : "http";
  address_ = fmt::format("{}:{}", endpoint.address().to_string(), endpoint.port());
  // Jobs reach the API at a loopback address when jouled listens on all interfaces.
  const auto& ip = endpoint.address();
  const std::string job_host = ip.is_unspecified() ? (ip.is_v6() ? "[::1]" : "127.0.0.1")
                                                   : (ip.is_v6() ? "[" + ip.to_string() + "]" : ip.to_string());
  const std::string api_url = fmt::format("{}://{}:{}", scheme, job_host, endpoint.port());
  jobs_.set_api_url(api_url);
  if (slurm_) slurm_->set_api_url(api_url);
  if (auto recovered = jobs_.recover(std::move(state_.jobs), std::move(state_.events)); !recovered)
    throw std::runtime_error(recovered.error().message);
  // What finished jobs taught: corrects and calibrates estimates (rows rebuilt after recovery).
  const auto history = jobs_.finished_feedback();
  if (const std::size_t learnt = outcomes_.record_all(history); learnt > 0)
    spdlog::info("estimates: learnt from {} finished job{}", learnt, learnt == 1 ? "" : "s");
  learning_.publish_calibration();
  jobs_.sample_meters();
  // The starter set for now; recent jobs' models join it once probing runs continuously.
  models_.start(std::exchange(state_.models, {}), simulated_devices(config_), {});
  const bool a_device_has_its_own_worker =
      std::any_of(devices_.begin(), devices_.end(), [](const Device& device) { return !device.worker.empty(); });
  if (job_options_.worker.empty() && !a_device_has_its_own_worker) {
    spdlog::warn(
        "joule-worker not found (beside jouled, in the build tree or on PATH; set [probing] worker): real "
        "devices get no energy model");
  } else {
    spdlog::info(
        "probing with {} ({})",
        job_options_.worker.empty() ? std::string("the devices' own workers only: no joule-worker for the rest")
                                    : job_options_.worker.string(),
        config_.probing.enabled ? "enabled when a device is idle" : "only on request: [probing] enabled = false");
    probes_.start(std::move(state_.probes));
    probes_.remember_jobs(history);
  }
  // A restart reads what its history holds (the finished jobs' feedback, a year of energy uses):
  // its caches and the memory those reads freed go back now, not once 8 MiB lie free. Without
  // this a restart with 100,000 finished jobs stood 4-5 MiB above a fresh start.
  if (auto released = state_.archive->release_memory(); !released)
    spdlog::warn("the archive's page cache: {}", released.error().message);
  adapters::release_free_heap();
  heap_policy_.released(adapters::heap_usage().free_bytes);
  signals_.start();
  price_signals_.start();
  if (coordinator_) coordinator_->start();
  if (slurm_) slurm_->start();
  if (agent_) agent_->start();
  api_.set_ready(true);
  spdlog::info("listening on {}://{} ({})", scheme, address_, config_.cluster.role);
  notifier_.ready(fmt::format("listening on {}", address_));
}

int Daemon::run() {
  start();
  sample_meters_every_interval();
  release_heap_every_10s();
  // The watchdog is petted from the event loop itself, so a stuck loop stops the petting.
  if (auto period = SystemdNotifier::watchdog_period())
    pet_watchdog(std::chrono::duration_cast<std::chrono::steady_clock::duration>(*period / 4));
  drain_on_stop_signal();
  reload_on_sighup();
  // Handlers do not throw by contract (running paths return Results, and the API turns a
  // route's exception into a 500). Should one throw all the same, Asio unwinds out of run():
  // the handler is logged and the loop resumes, rather than the daemon ending with every
  // running job orphaned.
  for (;;) {
    try {
      io_.run();
      break;
    } catch (const std::exception& error) {
      spdlog::critical("an event handler threw, which is a bug; jouled goes on: {}", printable(error.what()));
    }
  }
  storage_.stop();
  spdlog::info("stopped; {} commits for {} writes", storage_.commits(), storage_.writes());
  return 0;
}

// Each sample updates energy and power metrics, and STATUS= (shown by `systemctl status jouled`)
// when it changed.
void Daemon::sample_meters_every_interval() {
  meter_timer_.expires_after(seconds(config_.meter_interval_seconds));
  meter_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    jobs_.sample_meters();
    std::string status = fmt::format("listening on {}; {}", address_, jobs_.summary());
    if (status != last_status_) notifier_.status(status);
    last_status_ = std::move(status);
    sample_meters_every_interval();
  });
}

// Freed memory back to the kernel once a queue has drained (adapters/heap_release.hpp): checked
// every 10 s, released when 8 MiB more than before lie free (about 1,600 queued jobs' worth).
void Daemon::release_heap_every_10s() {
  heap_timer_.expires_after(10s);
  heap_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    const auto before = adapters::heap_usage();
    if (heap_policy_.due(before.free_bytes)) {
      const auto started = std::chrono::steady_clock::now();
      adapters::release_free_heap();
      const auto after = adapters::heap_usage();
      heap_policy_.released(after.free_bytes);
      spdlog::debug("released the heap's free memory to the kernel: {:.1f} MiB free, {:.1f} MiB in use; {:.1f} ms",
                    before.free_bytes / 1048576.0, after.in_use_bytes / 1048576.0,
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
    }
    release_heap_every_10s();
  });
}

void Daemon::pet_watchdog(std::chrono::steady_clock::duration every) {
  notifier_.watchdog();
  watchdog_timer_.expires_after(every);
  watchdog_timer_.async_wait([this, every](boost::system::error_code ec) {
    if (!ec) pet_watchdog(every);
  });
}

void Daemon::drain_on_stop_signal() {
  stop_signals_.async_wait([this](boost::system::error_code ec, int signal) {
    if (ec) return;
    stopping_ = true;
    spdlog::info("{}: draining (running jobs keep running and are adopted at the next start)",
                 signal == SIGTERM ? "SIGTERM" : "SIGINT");
    notifier_.stopping("draining");
    api_.set_ready(false);
    server_.stop();
    if (coordinator_) coordinator_->stop();
    if (agent_) agent_->stop();
    if (slurm_) slurm_->stop();
    jobs_.stop_scheduling();
    probes_.stop();
    signals_.stop();
    price_signals_.stop();
    meter_timer_.cancel();
    drain_deadline_ = std::chrono::steady_clock::now() + 10s;
    stop_when_drained();
  });
}

// The loop ends once every write is committed and every connection closed, or after 10 s.
void Daemon::stop_when_drained() {
  if ((jobs_.writes_in_flight() == 0 && server_.connections() == 0) ||
      std::chrono::steady_clock::now() > drain_deadline_) {
    io_.stop();
    return;
  }
  drain_timer_.expires_after(10ms);
  drain_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec) stop_when_drained();
  });
}

void Daemon::reload_on_sighup() {
  reload_signal_.async_wait([this](boost::system::error_code ec, int) {
    if (ec || stopping_) return;
    notifier_.reloading();
    try {
      reload();
      notifier_.ready(fmt::format("listening on {}; config reloaded", address_));
    } catch (const std::exception& error) {
      spdlog::error("reload refused, the running config stays: {}", error.what());
      notifier_.ready(fmt::format("listening on {}; last reload refused: {}", address_, error.what()));
    }
    reload_on_sighup();
  });
}

void Daemon::reload() {
  std::vector<config::ConfigProblem> warnings;
  config::DaemonConfig next = resolve_config(command_line_, &warnings);
  // Policies: a valid set replaces the running one whole; a bad one (or a bad config) changes
  // nothing.
  auto next_policy = checked(load_policy(policy_directory(next, command_line_)), "policies: ");
  check_policy_against_signals(next_policy, next);
  for (const auto& warning : warnings) spdlog::warn("{}", warning.describe());
  if (next.server.host != config_.server.host || next.server.port != config_.server.port ||
      next.state_directory != config_.state_directory)
    spdlog::warn("reload: the listen address and state directory change only on restart");
  // A renewed certificate is read before anything changes: a bad one refuses the reload.
  std::shared_ptr<boost::asio::ssl::context> renewed;
  if (server_.uses_tls() != !next.server.tls_certificate.empty())
    spdlog::warn("reload: switching between http and https happens only on restart");
  else if (server_.uses_tls())
    renewed = checked(make_server_tls_context({next.server.tls_certificate, next.server.tls_private_key}), "TLS: ");
  if (renewed) server_.set_tls(std::move(renewed));
  apply_log_level(next.log_level);
  api_.set_access(access_config(next));
  if (coordinator_)
    coordinator_->set_options({next.cluster.heartbeat_seconds, next.cluster.lost_after_seconds,
                               next.price.configured() ? next.price.currency : ""});
  if (next.cluster.role != config_.cluster.role || next.cluster.coordinator != config_.cluster.coordinator)
    spdlog::warn("reload: the cluster role and coordinator change only on restart");
  config_.log_level = next.log_level;
  config_.token_sha256 = next.token_sha256;
  config_.tokens = next.tokens;
  config_.local_users = next.local_users;
  config_.meter_interval_seconds = next.meter_interval_seconds;
  config_.probing = next.probing;
  probes_.set_config(next.probing);
  signals_.reconfigure(next.carbon);
  price_signals_.reconfigure(next.price);
  config_.carbon = next.carbon;
  config_.price = next.price;
  jobs_.set_policy(std::move(next_policy));
  spdlog::info("reloaded {}", next.source);
}

}  // namespace joule::daemon
