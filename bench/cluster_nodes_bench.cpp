// cluster_nodes_bench: a real coordinator jouled under the syncs of many fake agents.
//
// Starts `jouled` as a coordinator (or attaches to one with --server/--pid), then simulates agents
// in this process: each node sends POST /v1/cluster/sync as a real agent does (a long poll with
// wait_seconds = heartbeat and the digest it applied, plus an immediate sync whenever one of its
// jobs starts or ends; or, with --mode beat, one wait=0 sync per heartbeat), each on a fresh TCP
// connection, with 1-2 simulated devices, model_version 0 and no models (--models DIR: version 1
// and an upload). Jobs the coordinator assigns are reported running at once and succeeded
// (energy_source "simulated") --job-seconds later, until the coordinator says it recorded them.
// Meanwhile it submits jobs at --jobs-per-second and reads GET /v1/nodes every 2 s (--nodes-every). Node counts
// rise in steps (--steps); per step it prints the coordinator's CPU and RSS, this generator's CPU,
// other processes' CPU, sync latencies, GET /v1/nodes latency and submit-to-assigned latency, and
// writes everything (with a once-a-second timeline) to --json. Every joule is simulated.
// See bench/README.md, "Cluster".
//
// --keep-alive keeps one connection per node and channel (polls, reports) from sync to sync, as
// ClusterAgent's HttpConnection does, retrying a sync once on a fresh connection when a kept one
// fails (the coordinator closed it while idle).
//
// The fake agents share one Asio io_context: a thread and a blocking HttpClient per node (1,000
// threads, an io_context and a resolver per request) added up to 150 ms of its own queueing to
// the latencies on this 2-core machine.

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "joule/client/http_client.hpp"
#include "joule/cluster/sync.hpp"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace cluster = joule::cluster;
namespace client = joule::client;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;

std::atomic<bool> g_interrupted{false};

// ------------------------------------------------------------------ options

struct Options {
  std::string jouled = "build/daemon/jouled";
  std::string server;  // attach to a running coordinator instead of starting one
  pid_t pid = 0;       // its process, for CPU and RSS
  std::vector<int> steps = {100, 250, 500, 1000};
  double step_seconds = 15;
  double final_seconds = 60;
  double warmup_seconds = 4;  // of each step, left out of its figures (registrations)
  double heartbeat = 1.0;
  double lost_after = 30.0;
  std::string mode = "poll";  // poll: long polls as agents do; beat: one wait=0 sync per heartbeat
  double jobs_per_second = 5;
  double job_seconds = 2;
  int max_connections = 4096;  // the coordinator's [server] max_connections; 0: jouled's default
  int io_threads = 1;          // threads running the fake agents' io_context
  std::string log_level = "info";
  // Fake nodes have no energy models, so no job has an estimate: fifo (the first free device)
  // places them; min-energy shows how it treats jobs without estimates (bench/README.md).
  std::string objective = "fifo";
  std::string json_path;
  double wait_quiet = 0;  // seconds to wait, at most, for the machine to be below 10 % busy
  // <profile>.json energy-model snapshots (cluster_agents.py --export-models): nodes then report
  // model_version 1 and upload them, and the jobs carry an MLP spec, so every submission is
  // estimated on every device.
  std::string models;
  std::string samples_path;  // every sync as CSV: at_s,latency_ms,kind,ok,changed
  bool tls = false;  // HTTPS with a throw-away self-signed P-256 certificate (openssl CLI)
  // One connection per node and channel (its polls, its reports) kept alive from sync to sync,
  // as ClusterAgent's HttpConnection does; without it, a fresh connection (and handshake) per sync.
  bool keep_alive = false;
  double nodes_every = 2.0;  // seconds between reads of GET /v1/nodes (0: none)
  bool keep = false;
  unsigned seed = 1;
};

[[noreturn]] void usage(const std::string& problem) {
  fmt::print(stderr,
             "{}\nusage: cluster_nodes_bench [--jouled PATH | --server URL --pid PID] [--steps 100,250,500,1000]\n"
             "  [--step-seconds 15] [--final-seconds 60] [--warmup-seconds 4] [--mode poll|beat]\n"
             "  [--heartbeat 1] [--lost-after 30] [--jobs-per-second 5] [--job-seconds 2]\n"
             "  [--max-connections 4096 (0: jouled's default)] [--io-threads 1] [--log-level info]\n"
             "  [--objective fifo|min-energy|...] [--wait-quiet S] [--models DIR] [--samples FILE.csv] [--tls]\n"
             "  [--keep-alive] [--nodes-every 2 (0: no GET /v1/nodes)] [--json FILE] [--keep] [--seed 1]\n",
             problem);
  std::exit(2);
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--jouled") o.jouled = value();
    else if (arg == "--server") o.server = value();
    else if (arg == "--pid") o.pid = std::stoi(value());
    else if (arg == "--steps") {
      o.steps.clear();
      std::stringstream in(value());
      for (std::string item; std::getline(in, item, ',');) o.steps.push_back(std::stoi(item));
    } else if (arg == "--step-seconds") o.step_seconds = std::stod(value());
    else if (arg == "--final-seconds") o.final_seconds = std::stod(value());
    else if (arg == "--warmup-seconds") o.warmup_seconds = std::stod(value());
    else if (arg == "--heartbeat") o.heartbeat = std::stod(value());
    else if (arg == "--lost-after") o.lost_after = std::stod(value());
    else if (arg == "--mode") o.mode = value();
    else if (arg == "--jobs-per-second") o.jobs_per_second = std::stod(value());
    else if (arg == "--job-seconds") o.job_seconds = std::stod(value());
    else if (arg == "--max-connections") o.max_connections = std::stoi(value());
    else if (arg == "--io-threads") o.io_threads = std::stoi(value());
    else if (arg == "--log-level") o.log_level = value();
    else if (arg == "--objective") o.objective = value();
    else if (arg == "--json") o.json_path = value();
    else if (arg == "--keep") o.keep = true;
    else if (arg == "--wait-quiet") o.wait_quiet = std::stod(value());
    else if (arg == "--models") o.models = value();
    else if (arg == "--samples") o.samples_path = value();
    else if (arg == "--tls") o.tls = true;
    else if (arg == "--keep-alive") o.keep_alive = true;
    else if (arg == "--nodes-every")
      o.nodes_every = std::stod(value());
    else if (arg == "--seed") o.seed = static_cast<unsigned>(std::stoul(value()));
    else usage("unknown option " + arg);
  }
  if (o.mode != "poll" && o.mode != "beat") usage("--mode is poll or beat");
  if (o.steps.empty() || !std::is_sorted(o.steps.begin(), o.steps.end())) usage("--steps must rise");
  if (!o.server.empty() && o.pid <= 0) usage("--server needs --pid (the coordinator's process, for CPU and RSS)");
  return o;
}

// ------------------------------------------------------------------ small helpers

std::int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

/// Nearest-rank percentile of an unsorted sample (copied); NaN when empty.
double percentile(std::vector<double> values, double p) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(values.size())));
  return values[std::clamp<std::size_t>(rank, 1, values.size()) - 1];
}

std::string fmt_ms(double value) {
  if (std::isnan(value)) return "-";
  if (value >= 100) return fmt::format("{:.0f}", value);
  if (value >= 10) return fmt::format("{:.1f}", value);
  return fmt::format("{:.2f}", value);
}

json num(double value) { return std::isnan(value) ? json(nullptr) : json(value); }

struct ProcCpu {
  double seconds = 0;  // utime + stime
  double rss_mb = 0;
  double hwm_mb = 0;
  int threads = 0;
};

std::optional<ProcCpu> read_proc(pid_t pid) {
  const std::string base = pid > 0 ? fmt::format("/proc/{}", pid) : "/proc/self";
  std::ifstream stat(base + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return std::nullopt;
  const auto close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(line.substr(close + 2));
  std::vector<std::string> f;
  for (std::string item; fields >> item;) f.push_back(item);
  if (f.size() < 18) return std::nullopt;
  ProcCpu out;
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  out.seconds = (std::stod(f[11]) + std::stod(f[12])) / tick;  // fields 14 and 15
  out.threads = std::stoi(f[17]);                               // field 20
  std::ifstream status(base + "/status");
  for (std::string row; std::getline(status, row);) {
    if (row.rfind("VmRSS:", 0) == 0) out.rss_mb = std::stod(row.substr(6)) / 1024.0;
    if (row.rfind("VmHWM:", 0) == 0) out.hwm_mb = std::stod(row.substr(6)) / 1024.0;
  }
  return out;
}

/// Busy and total CPU seconds of the whole machine (/proc/stat's first line).
std::pair<double, double> machine_cpu() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  stat >> cpu;
  std::vector<double> v;
  for (int i = 0; i < 8; ++i) {
    double x = 0;
    stat >> x;
    v.push_back(x);
  }
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const double total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
  const double idle = v[3] + v[4];
  return {(total - idle) / tick, total / tick};
}

// ------------------------------------------------------------------ the coordinator

class Coordinator {
 public:
  ~Coordinator() { stop(); }

  void start(const Options& o) {
    char pattern[] = "/tmp/joule-cluster-nodes-XXXXXX";
    if (!::mkdtemp(pattern)) throw std::runtime_error("mkdtemp failed");
    dir_ = pattern;
    keep_ = o.keep;
    std::string server = "[server]\nmax_queued_jobs = 1000000\n";
    if (o.max_connections > 0) server += fmt::format("max_connections = {}\n", o.max_connections);
    if (o.tls) {
      const auto cert = dir_ / "cert.pem", key = dir_ / "key.pem";
      const std::string command = fmt::format(
          "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout {} -out {} -days 2 "
          "-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 >/dev/null 2>&1",
          key.string(), cert.string());
      if (std::system(command.c_str()) != 0) throw std::runtime_error("openssl could not make a certificate");
      server += fmt::format("tls_certificate = \"{}\"\ntls_private_key = \"{}\"\n", cert.string(), key.string());
    }

    std::filesystem::create_directories(dir_ / "policies.d");
    std::ofstream(dir_ / "policies.d" / "00-placement.toml")
        << fmt::format("[placement]\nobjective = \"{}\"\n", o.objective);
    std::ofstream(dir_ / "jouled.toml") << fmt::format(
        "[node]\nname = \"coord\"\n{}[log]\nlevel = \"{}\"\n[cluster]\nrole = \"coordinator\"\n"
        "heartbeat_seconds = {}\nlost_after_seconds = {}\n[policy]\ndirectory = \"{}\"\n"
        "[[devices]]\nname = \"sim:laptop-cpu\"\nprobes = 40\nruns_jobs = false\n[probing]\nenabled = false\n",
        server, o.log_level, o.heartbeat, o.lost_after, (dir_ / "policies.d").string());
    const std::string log = (dir_ / "jouled.log").string();
    // A copy: a rebuild of build/ during the run changes nothing here.
    const std::string binary = (dir_ / "jouled").string();
    std::filesystem::copy_file(o.jouled, binary);
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlives the benchmark
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      const std::string config = (dir_ / "jouled.toml").string(), state = dir_.string();
      ::execl(binary.c_str(), binary.c_str(), "--config", config.c_str(), "--state-dir", state.c_str(), "--listen",
              "127.0.0.1:0", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    const std::regex listening(R"(listening on https?://127\.0\.0\.1:([0-9]+))");
    for (int i = 0; i < 300 && port_ == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::ifstream in(log);
      std::stringstream text;
      text << in.rdbuf();
      std::smatch match;
      const std::string s = text.str();
      if (std::regex_search(s, match, listening)) port_ = std::stoi(match[1]);
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        throw std::runtime_error("jouled exited at start:\n" + s);
      }
    }
    if (port_ == 0) throw std::runtime_error("jouled did not say where it listens; see " + log);
  }

  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      for (int i = 0; i < 100; ++i) {
        if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
          pid_ = 0;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (pid_ > 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = 0;
      }
    }
    if (!dir_.empty() && !keep_) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
      dir_.clear();
    }
  }

  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  pid_t pid_ = 0;
  int port_ = 0;
  bool keep_ = false;
};

// ------------------------------------------------------------------ samples

enum class Kind : std::uint8_t { first, held, report, beat };
constexpr const char* kKindNames[] = {"first", "held", "report", "beat"};

struct SyncSample {
  double at;          // seconds since the run started, when the answer came
  double latency_ms;  // the whole HTTP exchange
  Kind kind;
  bool ok;
  bool changed;  // a held poll answered because the desired state changed
};

struct Sample {
  double at;
  double latency_ms;
};

struct Recorder {
  std::mutex mutex;
  std::vector<SyncSample> syncs;
  std::vector<Sample> nodes_gets;
  std::vector<std::size_t> nodes_bytes;
  std::vector<Sample> submits;
  std::vector<std::size_t> submit_bytes;  // of each 201's body
  std::vector<Sample> dispatches;  // submit -> the node got the assignment
  std::vector<std::string> errors;  // first few distinct ones
  std::size_t error_count = 0;
  std::size_t submit_errors = 0;
  std::size_t jobs_started = 0, jobs_reported_done = 0, jobs_recorded = 0, assignments_stopped = 0;
  std::map<std::string, std::size_t> node_states;  // of the last GET /v1/nodes

  void error(const std::string& what) {
    std::lock_guard lock(mutex);
    ++error_count;
    if (errors.size() < 10 && std::find(errors.begin(), errors.end(), what) == errors.end()) errors.push_back(what);
  }
};

// ------------------------------------------------------------------ fake agents

struct FakeDevice {
  std::string name;
  double idle_watts = 5;
  double busy_watts = 20;
  double energy_joules = 0;
  std::int64_t energy_at_ms = 0;
};

struct FakeJob {
  std::string id;
  std::int64_t epoch = 0;
  std::string device;
  std::string state;  // running, succeeded, cancelled
  std::int64_t started_ms = 0;
  std::int64_t finished_ms = 0;
  double joules = 0;
};

struct FakeNode {
  std::string name;
  std::string incarnation;
  std::mutex mutex;
  std::vector<FakeDevice> devices;
  std::vector<FakeJob> jobs;  // reported until the coordinator has recorded their end
  std::set<std::pair<std::string, std::int64_t>> seen;  // every (id, epoch) ever taken up
  std::string digest;
  std::string applied_from;
  std::int64_t applied_revision = 0;
  bool report_in_flight = false;
  bool report_again = false;
  std::unique_ptr<asio::steady_timer> timer;  // the next regular exchange
  std::shared_ptr<void> kept[2];  // --keep-alive: the open connection of its polls [0] and reports [1]
  Clock::time_point next_beat;
  std::map<std::string, std::int64_t> coordinator_models;  // what the last reply said it holds
  bool knows_coordinator_models = false;
};

/// Energy-model snapshots by device name ("sim:jetson-orin"), from --models.
std::map<std::string, json> load_models(const std::string& dir) {
  std::map<std::string, json> out;
  if (dir.empty()) return out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    json snapshot = json::parse(in, nullptr, false);
    if (!snapshot.is_object()) throw std::runtime_error(entry.path().string() + " is not a JSON object");
    out["sim:" + entry.path().stem().string()] = std::move(snapshot);
  }
  if (out.empty()) throw std::runtime_error("no <profile>.json in " + dir);
  return out;
}

const char* const kProfiles[] = {"sim:jetson-orin", "sim:raspberry-pi-4", "sim:server-gpu", "sim:laptop-cpu"};
const double kIdle[] = {6, 3, 60, 9};
const double kBusy[] = {25, 7, 250, 45};

/// The fake agents, all on one Asio io_context (--io-threads threads): each sync is a fresh TCP
/// connection, as a real agent's HttpClient makes, but nothing is set up per request (no
/// io_context, resolver or thread per node), so the generator stays cheap and its own queueing
/// stays out of the latencies.
class Fleet {
 public:
  /// `ca_file` non-empty: HTTPS, the coordinator's certificate verified against it.
  Fleet(const Options& o, const asio::ip::tcp::endpoint& endpoint, const std::filesystem::path& ca_file,
        Recorder& recorder, Clock::time_point t0)
      : o_(o), endpoint_(endpoint), rec_(recorder), t0_(t0), models_(load_models(o.models)),
        work_(asio::make_work_guard(io_)) {
    if (ca_file.empty()) return;
    tls_ = std::make_unique<ssl::context>(ssl::context::tls_client);
    SSL_CTX_set_min_proto_version(tls_->native_handle(), TLS1_2_VERSION);
    tls_->set_verify_mode(ssl::verify_peer);
    tls_->load_verify_file(ca_file.string());
  }

  ~Fleet() { stop(); }

  void start() {
    for (int i = 0; i < std::max(1, o_.io_threads); ++i) threads_.emplace_back([this] { io_.run(); });
  }

  /// Grows the fleet to `count` nodes (each starts within one heartbeat, at a random phase).
  void grow_to(int count) {
    std::mt19937 rng(o_.seed + static_cast<unsigned>(nodes_.size()));
    std::uniform_real_distribution<double> phase(0.0, o_.heartbeat);
    while (static_cast<int>(nodes_.size()) < count) {
      const std::size_t i = nodes_.size();
      auto node = std::make_unique<FakeNode>();
      node->name = fmt::format("node-{:04d}", i);
      node->incarnation = fmt::format("bench-{}-{}", ::getpid(), i);
      const int n_devices = 1 + static_cast<int>(i % 2);  // 1 or 2 devices
      for (int d = 0; d < n_devices; ++d) {
        const std::size_t p = (i + static_cast<std::size_t>(d)) % 4;
        FakeDevice device;
        device.name = kProfiles[p];
        device.idle_watts = kIdle[p];
        device.busy_watts = kBusy[p];
        device.energy_at_ms = wall_ms();
        node->devices.push_back(device);
      }
      node->timer = std::make_unique<asio::steady_timer>(io_);
      FakeNode* raw = node.get();
      nodes_.push_back(std::move(node));
      raw->timer->expires_after(seconds(phase(rng)));
      raw->timer->async_wait([this, raw](boost::system::error_code ec) {
        if (!ec && !stopping_) next(*raw, true);
      });
    }
  }

  void stop() {
    if (threads_.empty()) return;
    stopping_ = true;
    // Calls in flight finish (a held poll within a heartbeat); nothing new starts.
    const auto until = Clock::now() + seconds(o_.heartbeat + 12);
    while (in_flight_ > 0 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    asio::post(io_, [this] {
      for (auto& node : nodes_) node->timer->cancel();
    });
    work_.reset();
    io_.stop();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

  void note_submitted(const std::string& id, Clock::time_point at) {
    std::lock_guard lock(submitted_mutex_);
    submitted_[id] = at;
  }

  std::size_t size() const { return nodes_.size(); }

 private:
  static Clock::duration seconds(double value) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(value));
  }

  /// The node's next regular exchange: as ClusterAgent::poll, the first reconciles at once and
  /// then it long-polls; in beat mode one wait=0 sync per heartbeat.
  void next(FakeNode& node, bool first) {
    if (stopping_) return;
    if (o_.mode == "poll") {
      exchange(node, first ? Kind::first : Kind::held, first ? 0.0 : o_.heartbeat, [this, &node](bool ok) {
        if (ok) return next(node, false);
        // As the agent: after a failure it waits and reconciles at once again.
        node.timer->expires_after(seconds(o_.heartbeat));
        node.timer->async_wait([this, &node](boost::system::error_code ec) {
          if (!ec) next(node, true);
        });
      });
    } else {
      node.next_beat = (first ? Clock::now() : node.next_beat) + seconds(o_.heartbeat);
      exchange(node, first ? Kind::first : Kind::beat, 0.0, [this, &node](bool) {
        node.timer->expires_at(node.next_beat);
        node.timer->async_wait([this, &node](boost::system::error_code ec) {
          if (!ec) next(node, false);
        });
      });
    }
  }

  /// A job started or ended here: tell the coordinator at once (the agent's reporter), one such
  /// sync in flight per node, repeated if something changed meanwhile.
  void report(FakeNode& node) {
    {
      std::lock_guard lock(node.mutex);
      if (node.report_in_flight) {
        node.report_again = true;
        return;
      }
      node.report_in_flight = true;
      node.report_again = false;
    }
    exchange(node, Kind::report, 0.0, [this, &node](bool) {
      bool again = false;
      {
        std::lock_guard lock(node.mutex);
        node.report_in_flight = false;
        again = node.report_again;
      }
      if (again && !stopping_) report(node);
    });
  }

  /// Reports the job ended when its time is up.
  void finish_later(FakeNode& node, const std::string& id, std::int64_t epoch) {
    auto timer = std::make_shared<asio::steady_timer>(io_, seconds(o_.job_seconds));
    timer->async_wait([this, &node, id, epoch, timer](boost::system::error_code ec) {
      if (ec || stopping_) return;
      bool ended = false;
      {
        std::lock_guard lock(node.mutex);
        for (auto& job : node.jobs) {
          if (job.id != id || job.epoch != epoch || job.state != "running") continue;
          job.state = "succeeded";
          job.finished_ms = wall_ms();
          for (const auto& d : node.devices)
            if (d.name == job.device)
              job.joules = d.busy_watts * static_cast<double>(job.finished_ms - job.started_ms) / 1000.0;
          ended = true;
        }
      }
      if (!ended) return;
      {
        std::lock_guard r(rec_.mutex);
        ++rec_.jobs_reported_done;
      }
      report(node);
    });
  }

  template <class Stream>
  struct Call {
    Call(asio::io_context& io, ssl::context* tls) : stream(make(io, tls)) {}
    static Stream make(asio::io_context& io, ssl::context* tls) {
      if constexpr (std::is_same_v<Stream, beast::tcp_stream>)
        return Stream(io);
      else
        return Stream(io, *tls);
    }
    beast::tcp_stream& tcp() { return beast::get_lowest_layer(stream); }
    Stream stream;
    http::request<http::string_body> request;
    beast::flat_buffer buffer;
    http::response<http::string_body> response;
  };

  /// One sync on a fresh connection (with --tls a full handshake, as the agent's HttpClient does:
  /// no session resumption); `done(ok)` runs on the io_context.
  void exchange(FakeNode& node, Kind kind, double wait_seconds, std::function<void(bool)> done) {
    const auto request = build(node, wait_seconds);
    http::request<http::string_body> message{http::verb::post, "/v1/cluster/sync", 11};
    message.set(http::field::host, endpoint_.address().to_string());
    message.set(http::field::user_agent, "joulectl");
    message.set(http::field::content_type, "application/json");
    message.body() = cluster::to_json(request).dump();
    message.prepare_payload();
    const auto start = Clock::now();
    ++in_flight_;
    auto finish = [this, start, kind, sent_digest = request.digest, &node, done = std::move(done)](
                      const http::response<http::string_body>& response, const std::string& problem) {
      const double latency = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      std::optional<cluster::SyncReply> reply;
      std::string why = problem;
      if (why.empty() && response.result_int() != 200)
        why = fmt::format("HTTP {}: {}", response.result_int(), response.body().substr(0, 200));
      if (why.empty()) {
        auto parsed = cluster::parse_sync_reply(json::parse(response.body(), nullptr, false));
        if (parsed) reply = std::move(parsed).value();
        else why = "unparsable reply: " + parsed.error().message;
      }
      if (!reply) rec_.error(why);
      {
        std::lock_guard lock(rec_.mutex);
        rec_.syncs.push_back({since(t0_), latency, kind, reply.has_value(), reply && reply->digest != sent_digest});
      }
      if (reply && apply(node, *reply)) report(node);
      --in_flight_;
      done(reply.has_value());
    };
    const int channel = kind == Kind::report ? 1 : 0;
    if (tls_)
      run<beast::ssl_stream<beast::tcp_stream>>(node, channel, std::move(message), wait_seconds, std::move(finish));
    else
      run<beast::tcp_stream>(node, channel, std::move(message), wait_seconds, std::move(finish));
  }

  template <class Stream, class Finish>
  void run(FakeNode& node, int channel, http::request<http::string_body> message, double wait_seconds, Finish finish) {
    std::shared_ptr<Call<Stream>> call;
    {
      std::lock_guard lock(node.mutex);
      if (o_.keep_alive && node.kept[channel]) {
        call = std::static_pointer_cast<Call<Stream>>(node.kept[channel]);
        node.kept[channel].reset();
      }
    }
    const bool reused = call != nullptr;
    if (!call) call = std::make_shared<Call<Stream>>(io_, tls_.get());
    call->request = std::move(message);
    call->response = {};
    call->tcp().expires_after(seconds(wait_seconds + 10));
    // Ends the exchange as HttpClient does: the response is framed by its length, so the
    // connection is shut without a TLS close_notify; with --keep-alive it stays for the next.
    auto end = [this, &node, channel, call, reused, wait_seconds, finish](const std::string& problem) {
      if (!problem.empty() && reused) {
        // As HttpConnection: a kept connection the server closed while idle fails at once; the
        // sync goes again on a fresh one.
        call->tcp().close();
        return run<Stream>(node, channel, std::move(call->request), wait_seconds, finish);
      }
      if (problem.empty() && o_.keep_alive && call->response.keep_alive()) {
        std::lock_guard lock(node.mutex);
        node.kept[channel] = call;
      } else {
        beast::error_code ignored;
        call->tcp().socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
        call->tcp().close();
      }
      finish(call->response, problem);
    };
    auto send = [call, end]() {
      http::async_write(call->stream, call->request, [call, end](beast::error_code ec, std::size_t) {
        if (ec) return end("write: " + ec.message());
        http::async_read(call->stream, call->buffer, call->response, [end](beast::error_code ec, std::size_t) {
          end(ec ? "read: " + ec.message() : std::string());
        });
      });
    };
    if (reused) return send();
    call->tcp().async_connect(endpoint_, [this, call, end, send](beast::error_code ec) {
      if (ec) return end("connect: " + ec.message());
      if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
        send();
      } else {
        call->stream.set_verify_callback(ssl::host_name_verification(endpoint_.address().to_string()));
        call->stream.async_handshake(ssl::stream_base::client, [end, send](beast::error_code ec) {
          if (ec) return end("TLS handshake: " + ec.message());
          send();
        });
      }
    });
  }

  cluster::SyncRequest build(FakeNode& node, double wait_seconds) {
    std::lock_guard lock(node.mutex);
    const auto now = wall_ms();
    cluster::SyncRequest request;
    request.node = node.name;
    request.incarnation = node.incarnation;
    request.version = "0.1.0";
    request.wait_seconds = wait_seconds;
    request.digest = node.digest;
    for (auto& device : node.devices) {
      bool busy = false;
      for (const auto& job : node.jobs) busy = busy || (job.device == device.name && job.state == "running");
      const double watts = busy ? device.busy_watts : device.idle_watts;
      device.energy_joules += watts * static_cast<double>(now - device.energy_at_ms) / 1000.0;
      device.energy_at_ms = now;
      cluster::ReportedDevice report;
      report.name = device.name;
      report.source = "simulated";
      report.energy_joules = device.energy_joules;
      report.power_watts = watts;
      report.runs_jobs = true;
      report.busy = busy;
      const auto model = models_.find(device.name);
      report.model_version = model == models_.end() ? 0 : 1;
      // As an agent does: offered once the coordinator has said which versions it holds.
      if (model != models_.end() && node.knows_coordinator_models && node.coordinator_models[device.name] < 1)
        request.models.push_back({device.name, 1, model->second});
      request.devices.push_back(std::move(report));
    }
    for (auto& job : node.jobs) {
      cluster::ReportedJob report;
      report.id = job.id;
      report.epoch = job.epoch;
      report.state = job.state;
      report.started_ms = job.started_ms;
      report.energy_source = "simulated";
      if (job.state == "running") {
        const double busy = [&] {
          for (const auto& d : node.devices)
            if (d.name == job.device) return d.busy_watts;
          return 10.0;
        }();
        report.energy_joules = busy * static_cast<double>(now - job.started_ms) / 1000.0;
      } else {
        report.reason = job.state == "succeeded" ? "exit code 0" : "stopped by the coordinator";
        report.exit_code = job.state == "succeeded" ? 0 : 143;
        report.finished_ms = job.finished_ms;
        report.energy_joules = job.joules;
      }
      request.jobs.push_back(std::move(report));
    }
    return request;
  }

  /// Applies an answer; true when a job started or ended here (so the coordinator should hear at once).
  bool apply(FakeNode& node, const cluster::SyncReply& reply) {
    std::lock_guard lock(node.mutex);
    if (reply.coordinator == node.applied_from && reply.revision <= node.applied_revision) return false;
    node.applied_from = reply.coordinator;
    node.applied_revision = reply.revision;
    node.coordinator_models = reply.model_versions;
    node.knows_coordinator_models = true;
    std::size_t recorded = 0;
    for (const auto& ended : reply.recorded) {
      const auto before = node.jobs.size();
      std::erase_if(node.jobs, [&](const FakeJob& j) {
        return j.id == ended.first && j.epoch == ended.second && j.state != "running";
      });
      recorded += before - node.jobs.size();
    }
    bool changed = false;
    const auto now_steady = Clock::now();
    const auto now = wall_ms();
    std::set<std::pair<std::string, std::int64_t>> wanted;
    for (const auto& a : reply.jobs) {
      wanted.insert({a.id, a.epoch});
      auto it = std::find_if(node.jobs.begin(), node.jobs.end(),
                             [&](const FakeJob& j) { return j.id == a.id && j.epoch == a.epoch; });
      if (a.stop) {
        if (it != node.jobs.end() && it->state == "running") {
          it->state = "cancelled";
          it->finished_ms = now;
          changed = true;
          std::lock_guard r(rec_.mutex);
          ++rec_.assignments_stopped;
        }
        continue;
      }
      if (node.seen.contains({a.id, a.epoch})) continue;
      node.seen.insert({a.id, a.epoch});
      FakeJob job;
      job.id = a.id;
      job.epoch = a.epoch;
      job.device = a.device;
      job.state = "running";
      job.started_ms = now;
      node.jobs.push_back(job);
      changed = true;
      finish_later(node, job.id, job.epoch);
      std::optional<Clock::time_point> submitted;
      {
        std::lock_guard s(submitted_mutex_);
        if (auto found = submitted_.find(a.id); found != submitted_.end()) submitted = found->second;
      }
      std::lock_guard r(rec_.mutex);
      ++rec_.jobs_started;
      if (submitted)
        rec_.dispatches.push_back(
            {since(t0_), std::chrono::duration<double, std::milli>(now_steady - *submitted).count()});
    }
    // A running job the coordinator no longer wants is stopped, as an agent does.
    for (auto& job : node.jobs) {
      if (job.state == "running" && !wanted.contains({job.id, job.epoch})) {
        job.state = "cancelled";
        job.finished_ms = now;
        changed = true;
      }
    }
    node.digest = reply.digest;
    if (recorded) {
      std::lock_guard r(rec_.mutex);
      rec_.jobs_recorded += recorded;
    }
    return changed;
  }

  const Options& o_;
  asio::ip::tcp::endpoint endpoint_;
  Recorder& rec_;
  Clock::time_point t0_;
  std::map<std::string, json> models_;
  std::unique_ptr<ssl::context> tls_;  // null: plain HTTP
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> in_flight_{0};
  std::vector<std::unique_ptr<FakeNode>> nodes_;
  std::mutex submitted_mutex_;
  std::map<std::string, Clock::time_point> submitted_;
};

// ------------------------------------------------------------------ the run

struct TimelineRow {
  double at;
  int nodes;
  double coord_cpu_pct, gen_cpu_pct, others_pct;  // others: % of all CPUs
  double coord_rss_mb;
  int coord_threads;
};

struct StepWindow {
  int nodes;
  double from, to;  // seconds since t0: the measured part of the step
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGINT, [](int) { g_interrupted = true; });
  ::signal(SIGTERM, [](int) { g_interrupted = true; });

  if (o.wait_quiet > 0) {
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.wait_quiet));
    double busy = 100;
    while (true) {
      const auto a = machine_cpu();
      std::this_thread::sleep_for(std::chrono::seconds(3));
      const auto b = machine_cpu();
      busy = 100.0 * (b.first - a.first) / std::max(1e-9, b.second - a.second);
      if (busy < 10 || Clock::now() >= until || g_interrupted) break;
    }
    fmt::print("machine {:.0f} % busy before the start\n", busy);
  }
  Coordinator coordinator;
  std::string url_text = o.server;
  pid_t pid = o.pid;
  try {
    if (o.server.empty()) {
      coordinator.start(o);
      url_text = fmt::format("{}://127.0.0.1:{}", o.tls ? "https" : "http", coordinator.port());
      pid = coordinator.pid();
      fmt::print("coordinator: {} (pid {}, state {})\n", url_text, pid, coordinator.dir().string());
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "cluster_nodes_bench: {}\n", e.what());
    return 1;
  }
  auto url = client::parse_server_url(url_text);
  if (!url) {
    fmt::print(stderr, "cluster_nodes_bench: {}\n", url.error().message);
    return 1;
  }

  client::ClientTls tls;  // for the submitter and the reader
  if (o.tls && o.server.empty()) tls.ca_file = coordinator.dir() / "cert.pem";
  std::string jouled_mtime;
  if (o.server.empty()) {
    const auto written = std::filesystem::last_write_time(o.jouled);
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
        std::chrono::file_clock::to_sys(written).time_since_epoch()).count();
    char text[32];
    const std::time_t t = seconds;
    std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    jouled_mtime = text;
  }
  const auto t0 = Clock::now();
  Recorder rec;
  std::unique_ptr<Fleet> fleet_owner;
  try {
    asio::io_context resolving;
    asio::ip::tcp::resolver resolver(resolving);
    const auto endpoint = *resolver.resolve(url->host, url->port).begin();
    fleet_owner = std::make_unique<Fleet>(o, endpoint.endpoint(), tls.ca_file, rec, t0);
  } catch (const std::exception& e) {
    fmt::print(stderr, "cluster_nodes_bench: {}\n", e.what());
    return 1;
  }
  Fleet& fleet = *fleet_owner;
  fleet.start();
  std::atomic<bool> done{false};
  std::atomic<int> current_nodes{0};

  // Submits jobs at a steady rate (no model: placement needs no estimate).
  std::thread submitter([&] {
    client::HttpClient http(*url, {}, std::chrono::seconds(30), tls);
    const auto period = std::chrono::duration<double>(1.0 / std::max(o.jobs_per_second, 0.001));
    auto next = Clock::now() + std::chrono::seconds(2);
    std::size_t n = 0;
    while (!done) {
      // In slices, so that the end of the run is never slept through.
      while (!done && Clock::now() < next)
        std::this_thread::sleep_for(std::min<Clock::duration>(next - Clock::now(), std::chrono::milliseconds(100)));
      next += std::chrono::duration_cast<Clock::duration>(period);
      if (done || current_nodes == 0 || o.jobs_per_second <= 0) continue;
      json spec = {{"name", fmt::format("bench-{}", n++)}, {"run", {{"command", {"true"}}}}};
      if (!o.models.empty()) {
        // The MLP of tests/integration/cluster_test.cpp: estimated on every device with a model.
        spec["model"] = {{"input", {{"shape", {784}}}},
                         {"layers",
                          {{{"type", "linear"}, {"out_features", 256}}, {{"type", "relu"}},
                           {{"type", "linear"}, {"out_features", 10}}}},
                         {"loss", "cross_entropy"}};
        spec["training"] = {{"batch_size", 64}, {"epochs", 1}, {"samples_per_epoch", 6400}};
      }
      const auto start = Clock::now();
      auto answer = http.request("POST", "/v1/jobs", spec.dump());
      const double latency = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (!answer || answer->status != 201) {
        std::lock_guard lock(rec.mutex);
        ++rec.submit_errors;
        continue;
      }
      const json body = json::parse(answer->body, nullptr, false);
      if (body.is_object() && body.contains("id")) fleet.note_submitted(body["id"].get<std::string>(), start);
      std::lock_guard lock(rec.mutex);
      rec.submits.push_back({since(t0), latency});
      rec.submit_bytes.push_back(answer->body.size());
    }
  });

  // Reads GET /v1/nodes every --nodes-every seconds.
  std::thread reader([&] {
    client::HttpClient http(*url, {}, std::chrono::seconds(30), tls);
    while (!done && o.nodes_every <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    while (!done) {
      // Every page (100 nodes each, "next" to go on), each timed as a GET of its own.
      std::string target = "/v1/nodes";
      while (!done) {
        const auto start = Clock::now();
        auto answer = http.request("GET", target);
        const double latency = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
        if (!answer || answer->status != 200) {
          rec.error(answer ? fmt::format("GET /v1/nodes: HTTP {}", answer->status)
                           : "GET /v1/nodes: " + answer.error().message);
          break;
        }
        const json body = json::parse(answer->body, nullptr, false);
        std::map<std::string, std::size_t> states;
        const json counts = body.is_object() ? body.value("states", json::object()) : json::object();
        for (const auto& [state, count] : counts.items()) states[state] = count.get<std::size_t>();
        std::lock_guard lock(rec.mutex);
        rec.nodes_gets.push_back({since(t0), latency});
        rec.nodes_bytes.push_back(answer->body.size());
        rec.node_states = states;
        if (!body.is_object() || !body.value("next", json(nullptr)).is_string()) break;
        target = "/v1/nodes?after=" + body["next"].get<std::string>();
      }
      for (int i = 0; i < static_cast<int>(10 * o.nodes_every) && !done; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });

  // Samples CPU and memory once a second.
  std::vector<TimelineRow> timeline;
  std::mutex timeline_mutex;
  std::thread sampler([&] {
    auto last_coord = read_proc(pid);
    auto last_self = read_proc(0);
    auto last_machine = machine_cpu();
    auto last_at = Clock::now();
    while (!done) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      const auto coord = read_proc(pid);
      const auto self = read_proc(0);
      const auto machine = machine_cpu();
      const auto now = Clock::now();
      const double wall = std::chrono::duration<double>(now - last_at).count();
      if (coord && self && last_coord && last_self) {
        const double c = coord->seconds - last_coord->seconds;
        const double g = self->seconds - last_self->seconds;
        const double all_busy = machine.first - last_machine.first;
        const double all_total = machine.second - last_machine.second;
        TimelineRow row{since(t0), current_nodes.load(), 100.0 * c / wall, 100.0 * g / wall,
                        all_total > 0 ? 100.0 * std::max(0.0, all_busy - c - g) / all_total : 0.0, coord->rss_mb,
                        coord->threads};
        std::lock_guard lock(timeline_mutex);
        timeline.push_back(row);
      }
      last_coord = coord;
      last_self = self;
      last_machine = machine;
      last_at = now;
    }
  });

  // The steps.
  std::vector<StepWindow> windows;
  for (std::size_t s = 0; s < o.steps.size() && !g_interrupted; ++s) {
    const int count = o.steps[s];
    fleet.grow_to(count);
    current_nodes = count;
    const double length = s + 1 == o.steps.size() ? o.final_seconds : o.step_seconds;
    const double begin = since(t0);
    fmt::print("step {}: {} nodes for {:.0f} s\n", s + 1, count, length);
    std::fflush(stdout);
    while (!g_interrupted && since(t0) < begin + length) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    windows.push_back({count, begin + std::min(o.warmup_seconds, length / 2), since(t0)});
  }
  const double measured_until = since(t0);
  // The node states at the end, before anything stops.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  done = true;
  submitter.join();
  reader.join();
  sampler.join();
  fleet.stop();
  const auto final_coord = read_proc(pid);
  // GET /v1/nodes once more with the syncs stopped (the nodes stay ready within their lease):
  // its own cost, without waiting behind syncs on the coordinator's one event loop.
  std::vector<double> quiet_nodes_ms;
  if (!g_interrupted) {
    client::HttpClient http(*url, {}, std::chrono::seconds(30), tls);
    for (int i = 0; i < 10; ++i) {
      const auto start = Clock::now();
      auto answer = http.request("GET", "/v1/nodes");
      if (answer && answer->status == 200)
        quiet_nodes_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
  }

  // The coordinator's own account of its event loop over the whole run (joule_loop_work_seconds):
  // per work, how many, their mean, how many held the loop over 10 ms, and the longest's bucket.
  std::string loop_work;
  if (!g_interrupted) {
    client::HttpClient http(*url, {}, std::chrono::seconds(30), tls);
    if (auto answer = http.request("GET", "/metrics"); answer && answer->status == 200) {
      struct Work {
        std::vector<std::pair<double, double>> buckets;  // (le, cumulative count)
        double sum = 0;
      };
      std::map<std::string, Work> works;
      const std::regex bucket(
          R"re(^joule_loop_work_seconds_bucket\{(?:[^}]*,)?work="([^"]+)"(?:,[^}]*)?,le="([^"]+)"\} (\S+))re");
      const std::regex sum(R"re(^joule_loop_work_seconds_sum\{work="([^"]+)"\} (\S+))re");
      std::istringstream lines(answer->body);
      for (std::string line; std::getline(lines, line);) {
        std::smatch m;
        if (std::regex_search(line, m, bucket))
          works[m[1]].buckets.emplace_back(m[2] == "+Inf" ? HUGE_VAL : std::stod(m[2]), std::stod(m[3]));
        else if (std::regex_search(line, m, sum))
          works[m[1]].sum = std::stod(m[2]);
      }
      for (auto& [name, work] : works) {
        std::sort(work.buckets.begin(), work.buckets.end());
        if (work.buckets.empty()) continue;
        const double count = work.buckets.back().second;
        double under_10ms = count, longest = HUGE_VAL, below = 0;
        for (const auto& [le, n] : work.buckets) {
          if (le >= 0.01 && under_10ms == count) under_10ms = n;
          if (n >= count && longest == HUGE_VAL) longest = le;
        }
        for (const auto& [le, n] : work.buckets)
          if (n < count) below = le;
        loop_work += fmt::format(
            "loop work {:32s} {:8.0f}, mean {:8.3f} ms, {:.0f} over 10 ms, longest in ({:g}, {:g}] ms\n", name, count,
            count > 0 ? 1e3 * work.sum / count : 0.0, count - under_10ms, 1e3 * below, 1e3 * longest);
      }
    }
  }

  // ---------------------------------------------------------------- figures
  json steps_json = json::array();
  fmt::print("\n{} mode{}{}, heartbeat {} s, {} jobs/s of {} s, objective {}, max_connections {}\n", o.mode,
             o.tls ? ", TLS" : "", o.models.empty() ? "" : ", models", o.heartbeat, o.jobs_per_second, o.job_seconds, o.objective,
             o.max_connections > 0 ? std::to_string(o.max_connections) : "default");
  fmt::print(
      "| nodes | coord CPU % | coord RSS MB | gen CPU % | others % | syncs/s | immediate sync p50 / p90 / p99 / max ms "
      "| held poll past its wait p50 / p99 ms | failed syncs | GET /v1/nodes page p50 / max ms (KB) | submit p50 ms "
      "(KB) "
      "| submit→assigned p50 / p99 ms |\n");
  fmt::print("|---:|---:|---:|---:|---:|---:|---|---|---:|---|---|---|\n");
  for (const auto& w : windows) {
    std::vector<double> immediate, held_over, nodes_ms, submit_ms, dispatch_ms, submit_kb;
    std::size_t failed = 0, count = 0;
    double kb = 0;
    double coord_cpu = 0, gen_cpu = 0, others = 0, rss = 0;
    int rows = 0, threads = 0;
    {
      std::lock_guard lock(rec.mutex);
      for (const auto& s : rec.syncs) {
        if (s.at < w.from || s.at > w.to) continue;
        ++count;
        if (!s.ok) {
          ++failed;
          continue;
        }
        // A held poll that came back at its wait's end measures how late the coordinator's timer
        // answered; one answered early (something changed for the node) counts as immediate.
        if (s.kind == Kind::held && !s.changed && s.latency_ms >= 500.0 * o.heartbeat) {
          held_over.push_back(s.latency_ms - o.heartbeat * 1000.0);
        } else if (s.kind != Kind::held || !s.changed) {
          immediate.push_back(s.latency_ms);
        }
      }
      for (std::size_t i = 0; i < rec.nodes_gets.size(); ++i) {
        if (rec.nodes_gets[i].at < w.from || rec.nodes_gets[i].at > w.to) continue;
        nodes_ms.push_back(rec.nodes_gets[i].latency_ms);
        kb = static_cast<double>(rec.nodes_bytes[i]) / 1024.0;
      }
      for (std::size_t i = 0; i < rec.submits.size(); ++i) {
        if (rec.submits[i].at < w.from || rec.submits[i].at > w.to) continue;
        submit_ms.push_back(rec.submits[i].latency_ms);
        submit_kb.push_back(static_cast<double>(rec.submit_bytes[i]) / 1024.0);
      }
      for (const auto& s : rec.dispatches)
        if (s.at >= w.from && s.at <= w.to) dispatch_ms.push_back(s.latency_ms);
    }
    {
      std::lock_guard lock(timeline_mutex);
      for (const auto& row : timeline) {
        if (row.at < w.from || row.at > w.to) continue;
        coord_cpu += row.coord_cpu_pct;
        gen_cpu += row.gen_cpu_pct;
        others += row.others_pct;
        rss = row.coord_rss_mb;
        threads = row.coord_threads;
        ++rows;
      }
    }
    if (rows) coord_cpu /= rows, gen_cpu /= rows, others /= rows;
    const double seconds = w.to - w.from;
    const double rate = seconds > 0 ? static_cast<double>(count) / seconds : 0;
    fmt::print("| {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.0f} | {} / {} / {} / {} | {} / {} | {} | {} / {} ({:.0f}) | {} ({:.1f}) | {} / {} |\n",
               w.nodes, coord_cpu, rss, gen_cpu, others, rate, fmt_ms(percentile(immediate, 50)),
               fmt_ms(percentile(immediate, 90)), fmt_ms(percentile(immediate, 99)), fmt_ms(percentile(immediate, 100)),
               fmt_ms(percentile(held_over, 50)), fmt_ms(percentile(held_over, 99)), failed,
               fmt_ms(percentile(nodes_ms, 50)), fmt_ms(percentile(nodes_ms, 100)), kb, fmt_ms(percentile(submit_ms, 50)),
               submit_kb.empty() ? 0.0 : percentile(submit_kb, 50),
               fmt_ms(percentile(dispatch_ms, 50)), fmt_ms(percentile(dispatch_ms, 99)));
    steps_json.push_back({{"nodes", w.nodes},
                          {"window_seconds", seconds},
                          {"coordinator_cpu_percent_of_one_core", coord_cpu},
                          {"coordinator_rss_mb", rss},
                          {"coordinator_threads", threads},
                          {"generator_cpu_percent_of_one_core", gen_cpu},
                          {"others_cpu_percent_of_all", others},
                          {"syncs_per_second", rate},
                          {"syncs_failed", failed},
                          {"immediate_sync_ms",
                           {{"n", immediate.size()},
                            {"p50", num(percentile(immediate, 50))},
                            {"p90", num(percentile(immediate, 90))},
                            {"p99", num(percentile(immediate, 99))},
                            {"max", num(percentile(immediate, 100))}}},
                          {"held_poll_past_wait_ms",
                           {{"n", held_over.size()},
                            {"p50", num(percentile(held_over, 50))},
                            {"p90", num(percentile(held_over, 90))},
                            {"p99", num(percentile(held_over, 99))},
                            {"max", num(percentile(held_over, 100))}}},
                          {"get_nodes_ms",
                           {{"n", nodes_ms.size()},
                            {"p50", num(percentile(nodes_ms, 50))},
                            {"max", num(percentile(nodes_ms, 100))},
                            {"kb", kb}}},
                          {"submit_ms",
                           {{"n", submit_ms.size()},
                            {"p50", num(percentile(submit_ms, 50))},
                            {"p99", num(percentile(submit_ms, 99))},
                            {"reply_kb_p50", num(percentile(submit_kb, 50))}}},
                          {"submit_to_assigned_ms",
                           {{"n", dispatch_ms.size()},
                            {"p50", num(percentile(dispatch_ms, 50))},
                            {"p90", num(percentile(dispatch_ms, 90))},
                            {"p99", num(percentile(dispatch_ms, 99))},
                            {"max", num(percentile(dispatch_ms, 100))}}}});
  }
  json timeline_json = json::array();
  for (const auto& row : timeline)
    timeline_json.push_back({{"at", row.at},
                             {"nodes", row.nodes},
                             {"coordinator_cpu_percent", row.coord_cpu_pct},
                             {"generator_cpu_percent", row.gen_cpu_pct},
                             {"others_percent_of_all", row.others_pct},
                             {"coordinator_rss_mb", row.coord_rss_mb}});
  std::size_t submitted = 0;
  {
    std::lock_guard lock(rec.mutex);
    submitted = rec.submits.size();
    std::string states;
    for (const auto& [state, n] : rec.node_states) states += fmt::format("{}{} {}", states.empty() ? "" : ", ", n, state);
    fmt::print("\njobs: {} submitted ({} refused), {} assigned to nodes, {} reported ended, {} recorded by the coordinator, "
               "{} stopped\n",
               submitted, rec.submit_errors, rec.jobs_started, rec.jobs_reported_done, rec.jobs_recorded,
               rec.assignments_stopped);
    fmt::print("nodes at the end (GET /v1/nodes): {}\n", states.empty() ? "?" : states);
    if (final_coord) fmt::print("coordinator VmHWM {:.1f} MB\n", final_coord->hwm_mb);
    fmt::print(
        "a page of GET /v1/nodes (up to 100) with the syncs stopped, {} nodes: p50 {} ms, max {} ms (10 calls)\n",
        fleet.size(), fmt_ms(percentile(quiet_nodes_ms, 50)), fmt_ms(percentile(quiet_nodes_ms, 100)));
    fmt::print("failed syncs: {}{}\n", rec.error_count, rec.errors.empty() ? "" : ", e.g.:");
    for (const auto& e : rec.errors) fmt::print("  {}\n", e);
  }
  if (!o.json_path.empty()) {
    std::lock_guard lock(rec.mutex);
    json out = {{"benchmark", "cluster_nodes_bench"},
                {"mode", o.mode},
                {"heartbeat_seconds", o.heartbeat},
                {"lost_after_seconds", o.lost_after},
                {"jobs_per_second", o.jobs_per_second},
                {"job_seconds", o.job_seconds},
                {"max_connections", o.max_connections},
                {"objective", o.objective},
                {"io_threads", o.io_threads},
                {"tls", o.tls},
                {"keep_alive", o.keep_alive},
                {"models", !o.models.empty()},
                {"jouled", o.server.empty() ? o.jouled : std::string("(attached)")},
                {"jouled_mtime", jouled_mtime},
                {"cpus", std::thread::hardware_concurrency()},
                {"measured_seconds", measured_until},
                {"steps", steps_json},
                {"jobs",
                 {{"submitted", submitted},
                  {"refused", rec.submit_errors},
                  {"assigned", rec.jobs_started},
                  {"reported_ended", rec.jobs_reported_done},
                  {"recorded", rec.jobs_recorded}}},
                {"node_states_at_end", rec.node_states},
                {"coordinator_vmhwm_mb", final_coord ? json(final_coord->hwm_mb) : json(nullptr)},
                {"get_nodes_syncs_stopped_ms",
                 {{"n", quiet_nodes_ms.size()},
                  {"p50", num(percentile(quiet_nodes_ms, 50))},
                  {"max", num(percentile(quiet_nodes_ms, 100))}}},
                {"failed_syncs", rec.error_count},
                {"errors", rec.errors},
                {"timeline", timeline_json}};
    std::ofstream(o.json_path) << out.dump(2) << "\n";
    fmt::print("wrote {}\n", o.json_path);
  }
  if (!loop_work.empty()) fmt::print("\n{}", loop_work);
  if (!o.samples_path.empty()) {
    std::lock_guard lock(rec.mutex);
    std::ofstream out(o.samples_path);
    out << "at_s,latency_ms,kind,ok,changed\n";
    for (const auto& x : rec.syncs)
      out << fmt::format("{:.4f},{:.3f},{},{},{}\n", x.at, x.latency_ms, kKindNames[static_cast<int>(x.kind)], x.ok ? 1 : 0,
                         x.changed ? 1 : 0);
    fmt::print("wrote {}\n", o.samples_path);
  }
  coordinator.stop();
  return g_interrupted ? 130 : 0;
}
