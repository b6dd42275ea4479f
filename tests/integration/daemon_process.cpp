#include "daemon_process.hpp"

#include <algorithm>
#include <functional>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <thread>

namespace joule::testing {

using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// Open to others (0755) like /var/lib: jobs run under accounts of their own and must reach
// their directories beside the state directory (which jouled itself keeps private).
std::filesystem::path make_temp_dir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "joule-it-XXXXXX").string();
  const std::filesystem::path dir = ::mkdtemp(pattern.data());
  ::chmod(dir.c_str(), 0755);
  return dir;
}

}  // namespace

DaemonProcess::DaemonProcess(DaemonOptions options, std::optional<std::filesystem::path> state_dir)
    : options_(std::move(options)), work_dir_(make_temp_dir()) {
  if (state_dir) {
    state_dir_ = *state_dir;
  } else {
    state_dir_ = work_dir_ / "state";
    owns_state_ = true;
  }
}

DaemonProcess::~DaemonProcess() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (notify_fd_ >= 0) ::close(notify_fd_);
  std::error_code ec;
  std::filesystem::remove_all(work_dir_, ec);
}

bool DaemonProcess::start(std::chrono::seconds timeout) {
  const auto socket_path = work_dir_ / "notify.sock";
  std::filesystem::remove(socket_path);
  if (notify_fd_ >= 0) ::close(notify_fd_);
  notify_fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, socket_path.c_str(), sizeof(address.sun_path) - 1);
  if (::bind(notify_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) return false;
  received_.clear();
  exit_code_.reset();

  std::vector<std::string> args = {JOULED_BINARY, "--state-dir", state_dir_.string()};
  if (options_.listen_loopback_any_port) args.insert(args.end(), {"--listen", "127.0.0.1:0"});
  if (!options_.config_toml.empty()) {
    const auto config = work_dir_ / "jouled.toml";
    std::ofstream(config) << options_.config_toml;
    args.insert(args.end(), {"--config", config.string()});
  }
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  const auto log_path = work_dir_ / "jouled.log";

  pid_ = ::fork();
  if (pid_ == 0) {
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(log, 1);
    ::dup2(log, 2);
    ::setenv("NOTIFY_SOCKET", socket_path.c_str(), 1);
    for (const auto& [name, value] : options_.env) ::setenv(name.c_str(), value.c_str(), 1);
    if (options_.env.contains("WATCHDOG_USEC")) ::setenv("WATCHDOG_PID", std::to_string(::getpid()).c_str(), 1);
    std::vector<char*> argv;
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  if (!wait_notification("READY=1", timeout)) return false;
  static const std::regex listening(R"(listening on [0-9.:\[\]a-f]*:([0-9]+))");
  for (const auto& message : received_) {
    std::smatch match;
    if (std::regex_search(message, match, listening)) port_ = static_cast<std::uint16_t>(std::stoi(match[1]));
  }
  return port_ != 0;
}

void DaemonProcess::signal(int signal) const { ::kill(pid_, signal); }

bool DaemonProcess::running() {
  if (pid_ <= 0 || exit_code_) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) != pid_) return true;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return false;
}

std::optional<int> DaemonProcess::wait_exit(std::chrono::seconds timeout) {
  if (exit_code_) return exit_code_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!running()) return exit_code_;
    std::this_thread::sleep_for(20ms);
  }
  return std::nullopt;
}

std::vector<std::string> DaemonProcess::notifications() {
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(notify_fd_, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    received_.emplace_back(buffer, static_cast<std::size_t>(n));
  }
  return received_;
}

bool DaemonProcess::wait_notification(const std::string& text, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::size_t seen = 0;
  for (;;) {
    auto all = notifications();
    for (; seen < all.size(); ++seen) {
      if (all[seen].find(text) != std::string::npos) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    if (pid_ > 0 && !running()) {
      // Exited: drain what is left, then give up.
      auto rest = notifications();
      for (; seen < rest.size(); ++seen)
        if (rest[seen].find(text) != std::string::npos) return true;
      return false;
    }
    pollfd entry{notify_fd_, POLLIN, 0};
    ::poll(&entry, 1, 50);
  }
}

std::string DaemonProcess::log() const {
  std::ifstream in(work_dir_ / "jouled.log");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

client::HttpClient DaemonProcess::client(const std::string& token) const {
  return client::HttpClient(client::ServerUrl{"127.0.0.1", std::to_string(port_)}, token, 10s);
}

std::pair<unsigned, json> DaemonProcess::call(const std::string& method, const std::string& target,
                                              const std::string& body) const {
  auto reply = client().request(method, target, body);
  if (!reply) return {0, json(reply.error().message)};
  return {reply->status, json::parse(reply->body, nullptr, false)};
}

std::string DaemonProcess::submit(const json& job) const {
  auto [status, body] = call("POST", "/v1/jobs", job.dump());
  return status == 201 ? body["id"].get<std::string>() : "";
}

json DaemonProcess::poll_job(const std::string& id, const std::function<bool(const json&)>& done,
                             std::chrono::seconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  json job;
  while (std::chrono::steady_clock::now() < deadline) {
    auto [status, body] = call("GET", "/v1/jobs/" + id);
    if (status == 200) {
      job = body;
      if (done(job)) return job;
    }
    std::this_thread::sleep_for(50ms);
  }
  return job;
}

json DaemonProcess::wait_state(const std::string& id, const std::vector<std::string>& states,
                               std::chrono::seconds timeout) const {
  return poll_job(
      id, [&](const json& job) { return std::find(states.begin(), states.end(), job["state"]) != states.end(); },
      timeout);
}

json DaemonProcess::wait_event(const std::string& id, const std::string& text, std::chrono::seconds timeout) const {
  return poll_job(
      id, [&](const json& job) { return has_event(job, text); }, timeout);
}

bool has_event(const json& job, const std::string& text) {
  if (!job.contains("events")) return false;
  for (const auto& event : job["events"])
    if (event["message"].get<std::string>().find(text) != std::string::npos) return true;
  return false;
}

std::uint16_t free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

std::pair<int, std::string> run_program(const std::vector<std::string>& argv,
                                        const std::map<std::string, std::string>& env) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return {-1, "pipe failed"};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipe_fds[1], 1);
    ::dup2(pipe_fds[1], 2);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    std::vector<char*> args;
    for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  std::string output;
  char buffer[4096];
  ssize_t n = 0;
  while ((n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0) output.append(buffer, static_cast<std::size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), output};
}

}  // namespace joule::testing
