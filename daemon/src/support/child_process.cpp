#include "joule/daemon/child_process.hpp"

#include <signal.h>

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>

namespace joule::daemon {

namespace asio = boost::asio;

Result<std::unique_ptr<ChildProcess>> ChildProcess::launch(asio::io_context& io, const adapters::LaunchSpec& spec,
                                                           std::string label, Ended ended) {
  auto process = adapters::launch_job(spec);
  if (!process) return process.error();
  std::unique_ptr<ChildProcess> child(
      new ChildProcess(io, *process, spec.status_path, std::move(label), std::move(ended), "/proc"));
  child->start_watching();
  return child;
}

std::unique_ptr<ChildProcess> ChildProcess::watch(asio::io_context& io, adapters::ProcessIdentity process,
                                                  std::filesystem::path status_path, std::string label, Ended ended,
                                                  std::filesystem::path proc_root) {
  std::unique_ptr<ChildProcess> child(
      new ChildProcess(io, process, std::move(status_path), std::move(label), std::move(ended), std::move(proc_root)));
  child->start_watching();
  return child;
}

ChildProcess::ChildProcess(asio::io_context& io, adapters::ProcessIdentity process, std::filesystem::path status_path,
                           std::string label, Ended ended, std::filesystem::path proc_root)
    : io_(io),
      process_(process),
      status_path_(std::move(status_path)),
      label_(std::move(label)),
      ended_(std::move(ended)),
      proc_root_(std::move(proc_root)),
      kill_timer_(io) {}

ChildProcess::~ChildProcess() { *alive_ = false; }

void ChildProcess::start_watching() {
  auto pidfd = adapters::open_pidfd(process_.pid);
  if (!pidfd) {
    // Already gone (an adopted runner that ended in between): its end is handled at once.
    asio::post(io_, [this, alive = alive_] {
      if (*alive) woken();
    });
    return;
  }
  watch_ = std::make_unique<asio::posix::stream_descriptor>(io_, *pidfd);
  watch_->async_wait(asio::posix::stream_descriptor::wait_read, [this, alive = alive_](boost::system::error_code ec) {
    if (*alive && ec != asio::error::operation_aborted) woken();
  });
}

void ChildProcess::woken() {
  watch_.reset();
  const auto runner_status = adapters::reap_child(process_.pid);
  auto exit = adapters::read_status_file(status_path_);
  if (!exit) exit = runner_status;  // the runner itself was killed (KILL after the grace period)
  if (!exit && adapters::is_alive(process_, proc_root_)) {
    spdlog::warn("{}: woken for an exit, but its runner {} still runs; watching it again", label_, process_.pid);
    return start_watching();
  }
  kill_timer_.cancel();
  // Moved out first: the callback may destroy this object.
  Ended ended = std::move(ended_);
  ended_ = nullptr;
  if (ended) ended(exit);
}

Status ChildProcess::signal(int signal) const { return adapters::signal_process_group(process_.pid, signal); }

void ChildProcess::terminate(std::chrono::duration<double> grace) {
  (void)signal(SIGTERM);
  (void)signal(SIGCONT);  // a stopped job must run to see TERM
  kill_timer_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(grace));
  kill_timer_.async_wait([this, alive = alive_, seconds = grace.count()](boost::system::error_code ec) {
    if (!*alive || ec) return;
    spdlog::warn("{}: still running {} s after TERM; sending KILL", label_, seconds);
    kill();
  });
}

void ChildProcess::kill() const { (void)signal(SIGKILL); }

}  // namespace joule::daemon
