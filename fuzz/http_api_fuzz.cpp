// libFuzzer target: one HTTP request into jouled's REST API at handler level (Api::handle),
// wired as in tests/daemon/api_test.cpp: a JobService over a temp-dir SQLite database with one
// simulated device, Metrics, and an energy model so estimates have numbers.
//
// Input: raw HTTP/1.1 bytes, parsed with Beast's request parser under the limits the server
// sets (16 KiB of headers, 1 MiB of body). Bytes that are no complete request are still sent,
// so the fuzzer does not have to learn Content-Length first: byte 0 picks the method, the rest
// of the first line is the target and everything after it the body. "{id}" in a target
// becomes the id of a job the fixture submitted, so the routes of one job are reached.
//
// Findings beyond ASan/UBSan: no reply within 10 s, an error status whose body is not JSON, a
// JSON answer that is not JSON, and a 500 from an exception a route let escape (Api::handle
// turns those into "failed to answer"; each is a bug).
//
// Jobs are accepted but never run anything: the runner is a path that does not exist, so a
// placed job fails at its spawn and no fuzzed command line is ever executed.

#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <openssl/crypto.h>
#include <spdlog/spdlog.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/beast/http/parser.hpp>

#include "fuzz_support.hpp"
#include "joule/adapters/database.hpp"
#include "joule/adapters/simulated_meter.hpp"
#include "joule/adapters/storage_writer.hpp"
#include "joule/common/sha256.hpp"
#include "joule/daemon/api.hpp"
#include "joule/daemon/estimates.hpp"
#include "joule/estimator/probe_campaign.hpp"
#include "joule/estimator/simulated_device.hpp"

namespace {

namespace http = boost::beast::http;
using joule::daemon::HttpRequest;
using joule::daemon::HttpResponse;
using joule::fuzz::require;

constexpr std::size_t kMaxBodyBytes = 1 << 20;   // jouled's default server.max_body_bytes
constexpr std::size_t kHeaderLimit = 16 * 1024;  // as http_server.cpp sets it
// Accepted submissions grow the job table; a fresh fixture after this many keeps memory flat.
constexpr int kSubmissionsPerFixture = 500;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One energy model for the device, learnt once against the simulator (as api_test does), so
// estimates and submissions with a model go the whole way.
std::shared_ptr<const joule::estimator::DeviceEnergyModel> simulated_model() {
  using namespace joule::estimator;
  static const auto model = [] {
    SimulatedDevice device(*find_simulated_profile("server-gpu"), 4);
    auto learnt = std::make_shared<DeviceEnergyModel>("cpu", "simulated");
    auto spec = *parse_model_spec(nlohmann::json::parse(R"({"input": {"shape": [1, 28, 28]}, "layers": [
      {"type": "conv2d", "out_channels": 8, "kernel_size": 3}, {"type": "relu"}, {"type": "flatten"},
      {"type": "linear", "out_features": 10}]})"),
                                  "/model");
    CampaignOptions options;
    options.probes = 30;
    options.gp.restarts = 1;
    require(run_campaign(*learnt, {WorkloadItem{spec, 32}}, simulated_network_meter(device, 1), options).ok(),
            "the fixture's probe campaign failed");
    return std::shared_ptr<const DeviceEnergyModel>(std::move(learnt));
  }();
  return model;
}

// A directory for the database and job files: JOULE_FUZZ_STATE_DIR (scripts/fuzz.sh sets it and
// removes it, also after a crash), else tmpfs where there is one, since every accepted
// submission is a commit and fsync on a disk would set the pace.
std::filesystem::path make_state_directory() {
  std::filesystem::path base;
  if (const char* dir = std::getenv("JOULE_FUZZ_STATE_DIR"); dir != nullptr && *dir != '\0') {
    base = dir;
  } else {
    std::error_code ec;
    base = std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
               ? std::filesystem::path("/dev/shm")
               : std::filesystem::temp_directory_path();
  }
  std::string pattern = (base / "joule-fuzz-XXXXXX").string();
  require(::mkdtemp(pattern.data()) != nullptr, "mkdtemp failed");
  return pattern;
}

class Fixture {
 public:
  Fixture()
      : dir_(make_state_directory()),
        writer_(open_database(dir_)),
        device_table_(devices()),
        jobs_(io_, writer_, metrics_, device_table_, options(dir_), joule::daemon::JobServiceLinks{&estimates_}),
        open_api_(joule::daemon::ApiServices{jobs_, metrics_, device_table_, &estimates_}),
        guarded_api_(joule::daemon::ApiServices{jobs_, metrics_, device_table_, &estimates_}) {
    require(jobs_.recover({}, {}).ok(), "recovery of an empty database failed");
    // As daemon_app.cpp wires it: every device the job may use, estimated with its model.
    estimates_.set_models({{"cpu", simulated_model()}});
    for (auto* api : {&open_api_, &guarded_api_}) api->set_ready(true);
    joule::daemon::AccessConfig access;
    access.tokens = {{joule::sha256_hex("s3cret"), "admin", joule::daemon::kAdminScopes}};
    guarded_api_.set_access(std::move(access));
    HttpRequest submit{http::verb::post, "/v1/jobs", 11};
    submit.body() = R"({"name": "known", "run": {"command": ["true"]}})";
    const HttpResponse accepted = call(std::move(submit));
    require(accepted.result_int() == 201, "the fixture's job was refused", accepted.body());
    job_id_ = nlohmann::json::parse(accepted.body())["id"].get<std::string>();
  }

  ~Fixture() {
    // Let queued commits land before the writer and the database go, without starting more:
    // a placement completing here would launch a job (and draw its token from OpenSSL).
    jobs_.stop_scheduling();
    for (int i = 0; i < 1000 && jobs_.writes_in_flight() > 0; ++i) io_.run_one_for(std::chrono::milliseconds(10));
  }

  Fixture(const Fixture&) = delete;
  Fixture& operator=(const Fixture&) = delete;

  const std::string& job_id() const { return job_id_; }
  int accepted() const { return accepted_; }

  HttpResponse call(HttpRequest&& request) {
    // Any Authorization header takes the request to the API with a token set, so the bearer
    // checks are fuzzed too; without one, every route is open.
    const bool with_token = request.find(http::field::authorization) != request.end();
    joule::daemon::Api& api = with_token ? guarded_api_ : open_api_;
    const std::string target(request.target());
    std::optional<HttpResponse> response;
    auto busy = boost::asio::make_work_guard(io_);  // keeps run_one_for waiting on a commit
    // A loopback root client: the open API answers it as an admin, the guarded one by its token.
    joule::daemon::HttpPeer peer;
    peer.uid = with_token ? std::nullopt : std::optional<uid_t>(0);
    api.handle(std::move(request), peer, [&](HttpResponse r) {
      require(!response, "a request was answered twice", target);
      response = std::move(r);
    });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!response && std::chrono::steady_clock::now() < deadline) {
      io_.run_one_for(std::chrono::milliseconds(10));
    }
    busy.reset();
    io_.poll();  // what the answer set going (a placement, a failed spawn) runs now, not later
    io_.restart();
    require(response.has_value(), "no reply within 10 s", target);
    if (response->result_int() == 201) ++accepted_;
    return std::move(*response);
  }

 private:
  static std::unique_ptr<joule::adapters::Database> open_database(const std::filesystem::path& dir) {
    auto db = joule::adapters::Database::open(dir / "jouled.db", /*full_sync=*/false);
    require(db.ok(), "the fixture's database did not open", db ? "" : db.error().message);
    return std::move(db).value();
  }

  static std::vector<joule::daemon::Device> devices() {
    std::vector<joule::daemon::Device> out(1);
    out[0].name = "cpu";
    out[0].meter = std::make_unique<joule::adapters::SimulatedMeter>(10.0, now_seconds);
    return out;
  }

  static joule::daemon::JobServiceOptions options(const std::filesystem::path& dir) {
    joule::daemon::JobServiceOptions o;
    o.state_directory = dir;
    o.runner = dir / "no-such-runner";  // see the file comment: nothing fuzzed is ever run
    o.max_queued_jobs = 64;
    o.kill_grace_seconds = 0.1;
    return o;
  }

  struct RemovedDirectory {
    std::filesystem::path path;
    explicit RemovedDirectory(std::filesystem::path p) : path(std::move(p)) {}
    ~RemovedDirectory() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
    operator const std::filesystem::path&() const { return path; }  // NOLINT: used as a path
  };

  RemovedDirectory dir_;  // first: removed after everything that writes into it is gone
  boost::asio::io_context io_;
  joule::adapters::StorageWriter writer_;
  joule::daemon::Metrics metrics_;
  joule::daemon::DeviceTable device_table_;
  joule::daemon::EstimateService estimates_{device_table_};
  joule::daemon::JobService jobs_;
  joule::daemon::Api open_api_;
  joule::daemon::Api guarded_api_;
  std::string job_id_;
  int accepted_ = 0;
};

std::unique_ptr<Fixture>& fixture() {
  static std::unique_ptr<Fixture> instance;
  if (!instance || instance->accepted() > kSubmissionsPerFixture) {
    instance.reset();
    instance = std::make_unique<Fixture>();
  }
  return instance;
}

void replace_all(std::string& text, std::string_view from, const std::string& to) {
  for (auto at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
}

// The input as the server's parser would deliver it, or nullopt where it is no whole request.
std::optional<HttpRequest> parse_http(std::string_view bytes) {
  http::request_parser<http::string_body> parser;
  parser.eager(true);
  parser.body_limit(kMaxBodyBytes);
  parser.header_limit(kHeaderLimit);
  boost::beast::error_code ec;
  std::size_t used = 0;
  while (used < bytes.size() && !parser.is_done()) {
    const std::size_t n = parser.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    if (ec == http::error::need_more) break;
    if (ec) return std::nullopt;
    if (n == 0) break;
    used += n;
  }
  if (!parser.is_done()) return std::nullopt;
  return parser.release();
}

// Derives a request from bytes that are no HTTP: method from byte 0, target to the first
// newline, body after it.
HttpRequest derive_request(std::string_view bytes) {
  static constexpr http::verb kMethods[] = {http::verb::get,  http::verb::post,  http::verb::delete_, http::verb::put,
                                            http::verb::head, http::verb::patch, http::verb::options};
  http::verb method = http::verb::get;
  if (!bytes.empty()) {
    method = kMethods[static_cast<unsigned char>(bytes[0]) % std::size(kMethods)];
    bytes.remove_prefix(1);
  }
  const auto newline = bytes.find('\n');
  HttpRequest request{method, bytes.substr(0, newline), 11};
  if (newline != std::string_view::npos) request.body() = std::string(bytes.substr(newline + 1));
  return request;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Logging would cost more than the requests; JOULE_FUZZ_LOG=1 keeps it for a reproduction.
  if (std::getenv("JOULE_FUZZ_LOG") == nullptr) spdlog::set_level(spdlog::level::off);
  // OpenSSL registers its cleanup with atexit when first used. Initialised here, before the
  // fixture (a function-local static) exists, it is cleaned up after the fixture is destroyed
  // at exit; first used by a job launch, it was gone while the fixture still drained commits.
  OPENSSL_init_crypto(0, nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > kMaxBodyBytes + kHeaderLimit) return 0;  // the server refuses these before the API
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  Fixture& f = *fixture();
  HttpRequest request = [&] {
    if (auto parsed = parse_http(bytes)) return std::move(*parsed);
    return derive_request(bytes);
  }();
  std::string target(request.target());
  replace_all(target, "{id}", f.job_id());
  request.target(target);

  const HttpResponse response = f.call(std::move(request));
  const unsigned status = response.result_int();
  const auto content_type = response[http::field::content_type];
  if (status >= 400 || content_type == "application/json") {
    const auto body = nlohmann::json::parse(response.body(), nullptr, false);
    require(!body.is_discarded(), "an answer that should be JSON is not", response.body());
    if (status >= 400)
      require(body.is_object() && body.contains("status"), "a problem without a status", response.body());
  }
  require(status != 500 || response.body().find("failed to answer") == std::string::npos,
          "a route threw (Api::handle caught it and answered 500)", target);
  return 0;
}
