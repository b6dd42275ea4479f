#pragma once
// The real jouled binary as a child process for integration tests: a temp state directory,
// 127.0.0.1:0, a NOTIFY_SOCKET of the test's own that tells when it is ready and on which port.

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/client/http_client.hpp"

namespace joule::testing {

struct DaemonOptions {
  std::string config_toml;              ///< written to a file and passed with --config when set
  std::vector<std::string> extra_args;  ///< e.g. {"--listen", "0.0.0.0:0"}
  std::map<std::string, std::string> env;
  bool listen_loopback_any_port = true;  ///< adds --listen 127.0.0.1:0
};

class DaemonProcess {
 public:
  /// Uses (and on destruction removes) a new temp directory; `state_dir` keeps one across restarts.
  explicit DaemonProcess(DaemonOptions options = {}, std::optional<std::filesystem::path> state_dir = std::nullopt);
  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  /// Starts jouled and waits for READY=1; false (with log() telling why) if it never came.
  bool start(std::chrono::seconds timeout = std::chrono::seconds(15));
  /// Sends a signal to jouled.
  void signal(int signal) const;
  /// Waits for jouled to exit; its exit code, or 128 + signal.
  std::optional<int> wait_exit(std::chrono::seconds timeout = std::chrono::seconds(15));
  bool running();

  /// Notifications received so far (each a full sd_notify datagram).
  std::vector<std::string> notifications();
  /// Waits until a notification containing `text` arrives.
  bool wait_notification(const std::string& text, std::chrono::milliseconds timeout);

  std::uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::filesystem::path& state_dir() const { return state_dir_; }
  std::string log() const;
  client::HttpClient client(const std::string& token = {}) const;

  /// Convenience: a request whose JSON body is parsed (null when the body is not JSON).
  std::pair<unsigned, nlohmann::json> call(const std::string& method, const std::string& target,
                                           const std::string& body = {}) const;
  /// Submits and returns the job id ("" when refused).
  std::string submit(const nlohmann::json& job) const;
  /// Polls GET /v1/jobs/{id} until its state is one of `states`; the last job JSON.
  nlohmann::json wait_state(const std::string& id, const std::vector<std::string>& states,
                            std::chrono::seconds timeout = std::chrono::seconds(30)) const;
  /// Polls GET /v1/jobs/{id} until an event's message contains `text`: events show once stored,
  /// which can be after the request that caused them has answered. The last job JSON.
  nlohmann::json wait_event(const std::string& id, const std::string& text,
                            std::chrono::seconds timeout = std::chrono::seconds(10)) const;

 private:
  /// Polls GET /v1/jobs/{id} every 50 ms until `done` holds or `timeout`; the last job JSON.
  nlohmann::json poll_job(const std::string& id, const std::function<bool(const nlohmann::json&)>& done,
                          std::chrono::seconds timeout) const;

  DaemonOptions options_;
  std::filesystem::path work_dir_;
  std::filesystem::path state_dir_;
  bool owns_state_ = false;
  int notify_fd_ = -1;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::uint16_t port_ = 0;
  std::vector<std::string> received_;
};

/// Whether any of a job JSON's events has a message containing `text`.
bool has_event(const nlohmann::json& job, const std::string& text);

/// Job `id`'s own directory (its default workdir and TMPDIR): beside the state directory where
/// jouled runs jobs under accounts of their own (as root here), else inside it.
inline std::filesystem::path work_directory_of(const DaemonProcess& daemon, const std::string& id) {
  if (::geteuid() == 0) return std::filesystem::path(daemon.state_dir().string() + "-jobs") / id;
  return daemon.state_dir() / "jobs" / id;
}

/// Calls `read` every 50 ms until `done` holds of what it returned or `timeout` passes; the last
/// thing read.
inline nlohmann::json wait_until(const std::function<nlohmann::json()>& read,
                                 const std::function<bool(const nlohmann::json&)>& done,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  nlohmann::json last;
  while (std::chrono::steady_clock::now() < until) {
    last = read();
    if (done(last)) return last;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return last;
}

/// A job training a small MLP (784-256-10, one epoch of 100 steps at batch 64) with `command`:
/// estimated on every simulated profile; the Jetson Orin's is far cheaper than the server GPU's.
inline nlohmann::json mlp_training_job(const std::string& name, const std::vector<std::string>& command) {
  using nlohmann::json;
  return {
      {"name", name},
      {"model",
       {{"input", {{"shape", {784}}}},
        {"layers",
         {{{"type", "linear"}, {"out_features", 256}}, {{"type", "relu"}}, {{"type", "linear"}, {"out_features", 10}}}},
        {"loss", "cross_entropy"}}},
      {"training", {{"batch_size", 64}, {"epochs", 1}, {"samples_per_epoch", 6400}}},
      {"run", {{"command", command}}}};
}

/// A loopback TCP port nothing listens on now (for a coordinator's fixed `listen`).
std::uint16_t free_loopback_port();

/// Runs a program, returns (exit code, stdout+stderr).
std::pair<int, std::string> run_program(const std::vector<std::string>& argv,
                                        const std::map<std::string, std::string>& env = {});

/// A request to `daemon` by curl running as `nobody` (uid 65534): what any local user could do.
/// Needs root. Returns (curl's exit code, the body).
inline std::pair<int, std::string> curl_as_nobody(const DaemonProcess& daemon, const std::string& method,
                                                  const std::string& target, const std::string& body = {}) {
  std::vector<std::string> argv = {"/usr/bin/setpriv",
                                   "--reuid=65534",
                                   "--regid=65534",
                                   "--clear-groups",
                                   "curl",
                                   "-s",
                                   "-X",
                                   method,
                                   "http://127.0.0.1:" + std::to_string(daemon.port()) + target};
  if (!body.empty()) argv.insert(argv.end(), {"-d", body});
  return run_program(argv);
}

}  // namespace joule::testing
