#pragma once
// jouled's services, built in order and wired at construction on one io_context: the device
// table, the job book, estimates, models, probing, carbon signals, the cluster's and Slurm's
// halves, the API and its server; then the timers (meters, heap, watchdog) and the signals that
// drain (SIGTERM, SIGINT) and reload (SIGHUP) it.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include "joule/adapters/control_journal.hpp"
#include "joule/adapters/heap_release.hpp"
#include "joule/adapters/storage_writer.hpp"
#include "joule/common/clock.hpp"
#include "joule/config/daemon_config.hpp"
#include "joule/daemon/api.hpp"
#include "joule/daemon/cluster_service.hpp"
#include "joule/daemon/daemon_app.hpp"
#include "joule/daemon/device_table.hpp"
#include "joule/daemon/estimate_service.hpp"
#include "joule/daemon/http_server.hpp"
#include "joule/daemon/job_links.hpp"
#include "joule/daemon/job_service.hpp"
#include "joule/daemon/metrics.hpp"
#include "joule/daemon/model_service.hpp"
#include "joule/daemon/outcome_service.hpp"
#include "joule/daemon/probe_service.hpp"
#include "joule/daemon/signal_service.hpp"
#include "joule/daemon/slurm_executor.hpp"
#include "joule/daemon/systemd_notify.hpp"
#include "node_setup.hpp"

namespace joule::daemon {

/// The book's listener in the daemon: a placement pre-empts probing on its device; a finished
/// job teaches probing (drift, the worth of probing) and the outcome correction. Built before
/// the book and pointed at probing once that is built, since probing asks the book in turn.
class LearningFromJobs final : public JobListener {
 public:
  LearningFromJobs(OutcomeService& outcomes, Metrics& metrics) : outcomes_(outcomes), metrics_(metrics) {}
  void attach(ProbeService& probes) { probes_ = &probes; }
  void placing_on(const std::string& device) override;
  void finished(const JobFeedback& feedback) override;
  bool probing(const std::string& device) const override;
  /// Every device's calibration (from the outcome rows) into the metrics.
  void publish_calibration();

 private:
  OutcomeService& outcomes_;
  Metrics& metrics_;
  ProbeService* probes_ = nullptr;
};

class Daemon {
 public:
  /// Opens the state and builds every service (nothing listens or runs yet). Throws
  /// std::runtime_error naming what is unusable.
  Daemon(const CommandLine& command_line, config::DaemonConfig config);
  /// Listens, recovers the jobs, starts probing, signals and the cluster, and serves until
  /// SIGTERM or SIGINT has drained it; returns the process exit code.
  int run();

 private:
  /// Listening: jobs get the API's URL, stored jobs are recovered, and the services start.
  void start();
  void models_changed();
  void sample_meters_every_interval();
  void release_heap_every_10s();
  void pet_watchdog(std::chrono::steady_clock::duration every);
  void drain_on_stop_signal();
  void stop_when_drained();
  void reload_on_sighup();
  /// Applies a re-read config and policy set; throws (changing nothing) when either is bad.
  void reload();

  const CommandLine& command_line_;
  config::DaemonConfig config_;
  const Clock& clock_;  // every service reads this one clock (tests give theirs a ManualClock)
  StateAtStart state_;
  adapters::StorageWriter storage_;
  boost::asio::io_context io_{1};
  // Caught from construction on, before READY=1: a signal that arrives before its handler is
  // waiting is queued by Asio instead of taking the default action (SIGHUP would end jouled).
  boost::asio::signal_set stop_signals_{io_, SIGTERM, SIGINT};
  boost::asio::signal_set reload_signal_{io_, SIGHUP};
  Metrics metrics_;
  // Every series is labelled with this node before any service adds one.
  const std::string node_name_;
  SystemdNotifier notifier_;
  DeviceTable devices_;
  std::unique_ptr<adapters::ControlJournal> control_journal_;
  JobServiceOptions job_options_;
  SignalService signals_;        // [carbon]
  SignalService price_signals_;  // [price]
  OutcomeService outcomes_;
  EstimateService estimates_;
  LearningFromJobs learning_;
  JobService jobs_;
  ModelService models_;
  ProbeService probes_;
  std::unique_ptr<SlurmExecutor> slurm_;
  std::unique_ptr<ClusterCoordinator> coordinator_;
  std::unique_ptr<ClusterAgent> agent_;
  UsageReports usage_;
  Api api_;
  HttpServer server_;
  std::string address_;  // where it listens, host:port
  boost::asio::steady_timer meter_timer_{io_};
  std::string last_status_;
  boost::asio::steady_timer heap_timer_{io_};
  adapters::HeapReleasePolicy heap_policy_{8u << 20};
  boost::asio::steady_timer watchdog_timer_{io_};
  boost::asio::steady_timer drain_timer_{io_};
  std::chrono::steady_clock::time_point drain_deadline_;
  bool stopping_ = false;
};

}  // namespace joule::daemon
