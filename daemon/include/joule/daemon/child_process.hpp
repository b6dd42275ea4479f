#pragma once
// One process started through the job runner (or adopted from an earlier jouled), watched on
// the event loop: how jobs and probes alike are started, signalled, stopped and seen to end.
//
// Its end is seen through a pidfd; the exit status is the one the runner wrote (or, if the
// runner itself was killed, the runner's own). A wake-up that finds no status while the runner
// still lives (not a zombie) is a stale readiness: it watches again rather than report an end.
// Destroying it stops the watching and never signals the process: a job outlives its daemon.

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "joule/adapters/job_process.hpp"
#include "joule/common/result.hpp"

namespace joule::daemon {

class ChildProcess {
 public:
  /// Called once, on the loop, when the process has ended; with nothing when no status was left
  /// (the runner killed before it could write one, and not our child to reap). The callback may
  /// destroy the ChildProcess.
  using Ended = std::function<void(std::optional<adapters::ExitStatus>)>;

  /// Starts `spec` through its runner and watches it. `label` names it in log lines ("job j-4").
  static Result<std::unique_ptr<ChildProcess>> launch(boost::asio::io_context& io, const adapters::LaunchSpec& spec,
                                                      std::string label, Ended ended);
  /// Watches a runner that is already running (adopted after a restart: not our child), whose
  /// status goes to `status_path`.
  static std::unique_ptr<ChildProcess> watch(boost::asio::io_context& io, adapters::ProcessIdentity process,
                                             std::filesystem::path status_path, std::string label, Ended ended,
                                             std::filesystem::path proc_root = "/proc");

  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  const adapters::ProcessIdentity& process() const { return process_; }
  /// Sends `signal` to its process group (a group already gone is not an error).
  Status signal(int signal) const;
  /// TERM to its process group (with CONT, so that a stopped job sees it), then KILL if it
  /// still runs `grace` later.
  void terminate(std::chrono::duration<double> grace);
  /// KILL to its process group, now.
  void kill() const;

 private:
  ChildProcess(boost::asio::io_context& io, adapters::ProcessIdentity process, std::filesystem::path status_path,
               std::string label, Ended ended, std::filesystem::path proc_root);
  void start_watching();
  void woken();

  boost::asio::io_context& io_;
  adapters::ProcessIdentity process_;
  std::filesystem::path status_path_;
  std::string label_;
  Ended ended_;
  std::filesystem::path proc_root_;
  std::unique_ptr<boost::asio::posix::stream_descriptor> watch_;
  boost::asio::steady_timer kill_timer_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace joule::daemon
