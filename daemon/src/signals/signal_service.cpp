#include "joule/daemon/signal_service.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>

#include "joule/client/http_client.hpp"
#include "joule/common/text.hpp"
#include "joule/config/grid_signal_file.hpp"

namespace joule::daemon {

namespace {

// A forecast or a year of hourly history is well under a megabyte; more is not a signal file.
constexpr std::uintmax_t kMaxSignalBytes = 16u << 20;

std::string describe_source(const config::SignalConfig& config) {
  if (!config.file.empty()) return "file " + config.file.string();
  if (!config.url.empty()) return "url " + config.url;
  return {};
}

// "https://host[:port]/path?query" as the client's server (the port from the scheme where the
// URL names none) and the request target.
Result<std::pair<client::ServerUrl, std::string>> split_url(const std::string& url) {
  const std::size_t scheme_end = url.find("://");
  const std::size_t authority = scheme_end == std::string::npos ? 0 : scheme_end + 3;
  const std::size_t path = url.find_first_of("/?", authority);
  std::string host_part = url.substr(authority, path == std::string::npos ? std::string::npos : path - authority);
  std::string target = path == std::string::npos ? "/" : url.substr(path);
  if (target.front() == '?') target.insert(0, "/");
  const bool tls = url.starts_with("https://");
  const std::size_t bracket = host_part.rfind(']');
  const std::size_t colon = host_part.rfind(':');
  if (colon == std::string::npos || (bracket != std::string::npos && colon < bracket))
    host_part += tls ? ":443" : ":80";
  auto server = client::parse_server_url(url.substr(0, authority) + host_part);
  if (!server) return server.error();
  return std::pair{std::move(server).value(), std::move(target)};
}

// "{now}" in a URL's target as the time of the request, to the minute, in UTC.
std::string with_now(std::string target, schedulers::UnixMillis now) {
  const std::string stamp = schedulers::format_rfc3339(now).substr(0, 16) + "Z";  // 2026-11-29T10:30Z
  for (std::size_t at = target.find("{now}"); at != std::string::npos; at = target.find("{now}", at + stamp.size()))
    target.replace(at, 5, stamp);
  return target;
}

Result<std::string> read_token(const std::filesystem::path& file, const std::string& section) {
  if (file.empty()) return std::string();
  std::ifstream in(file);
  std::string token;
  if (!in || !std::getline(in, token))
    return make_error(ErrorCode::io, fmt::format("{}.token_file {}: cannot read it", section, file.string()));
  token = std::string(trim(token));
  if (token.empty())
    return make_error(ErrorCode::io, fmt::format("{}.token_file {}: it is empty", section, file.string()));
  return token;
}

std::string currency_of(const config::SignalConfig& config, config::SignalKind kind) {
  return kind == config::SignalKind::price ? config.currency : std::string();
}

}  // namespace

SignalService::SignalService(boost::asio::io_context& io, Metrics& metrics, config::SignalConfig config,
                             config::SignalKind kind, const Clock& clock)
    : io_(io),
      metrics_(metrics),
      config_(std::move(config)),
      kind_(kind),
      name_(kind == config::SignalKind::price ? "price" : "carbon"),
      clock_(clock),
      feed_(describe_source(config_), config_.constant, currency_of(config_, kind)),
      timer_(io, clock) {}

SignalService::~SignalService() { stop(); }

void SignalService::reconfigure(config::SignalConfig config) {
  if (config == config_) return;
  stop();
  const bool same_source = describe_source(config) == describe_source(config_) && config.constant == config_.constant &&
                           config.currency == config_.currency;
  config_ = std::move(config);
  if (!same_source) {
    feed_ = GridSignalFeed(describe_source(config_), config_.constant, currency_of(config_, kind_));
    read_stamp_.reset();
  }
  {
    std::lock_guard lock(wake_mutex_);
    stopping_ = false;
    fetch_wanted_ = false;
  }
  alive_ = std::make_shared<std::atomic<bool>>(true);
  if (!configured()) spdlog::info("{} signal: none ([{}] was removed)", name_, name_);
  start();
  publish();
  if (changed_) changed_();
}

void SignalService::start() {
  if (!configured()) return;
  spdlog::info("{} signal: {}{}", name_, config_.file.empty() && config_.url.empty() ? "" : describe_source(config_),
               config_.constant
                   ? fmt::format("{}constant {:g} {} where it says nothing",
                                 config_.file.empty() && config_.url.empty() ? "" : "; ", *config_.constant,
                                 kind_ == config::SignalKind::price ? feed_.unit() : "g/kWh")
                   : "");
  if (!config_.url.empty()) fetcher_ = std::thread([this] { fetch_loop(); });
  refresh();
}

void SignalService::stop() {
  timer_.cancel();
  {
    std::lock_guard lock(wake_mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (fetcher_.joinable()) fetcher_.join();
  alive_->store(false);
}

nlohmann::json SignalService::describe() const {
  if (!configured()) return describe_none(kind_);
  nlohmann::json signal = feed_.describe(clock_.unix_ms());
  signal["refresh_seconds"] = config_.refresh_seconds;
  return {{name_, std::move(signal)}};
}

nlohmann::json SignalService::describe_none(config::SignalKind kind) {
  const bool price = kind == config::SignalKind::price;
  GridSignalFeed none({}, std::nullopt);
  nlohmann::json signal = none.describe(0);
  signal["unit"] = nullptr;
  signal["message"] = price ? "no price signal: set [price] currency and a file, url or per_kwh in jouled.toml"
                            : "no carbon signal: set [carbon] file, url or intensity in jouled.toml";
  if (!price) signal["unit"] = "gCO2e/kWh";
  return {{price ? "price" : "carbon", std::move(signal)}};
}

void SignalService::refresh() {
  if (!config_.file.empty()) read_file();
  if (!config_.url.empty()) {
    {
      std::lock_guard lock(wake_mutex_);
      fetch_wanted_ = true;
      fetch_at_ = clock_.unix_ms();  // read here, on the loop: the clock is the loop's
    }
    wake_.notify_all();
  }
  publish();
  timer_.wait_for(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(config_.refresh_seconds)),
                  [this] { refresh(); });
}

void SignalService::read_file() {
  const std::string& name = config_.file.string();
  std::error_code ec;
  const auto size = std::filesystem::file_size(config_.file, ec);
  const auto modified = ec ? std::filesystem::file_time_type{} : std::filesystem::last_write_time(config_.file, ec);
  if (ec) {
    read_stamp_.reset();
    return accept(make_error(ErrorCode::io, fmt::format("{}: {}", name, ec.message())));
  }
  const FileStamp stamp{modified.time_since_epoch().count(), size};
  if (read_stamp_ == stamp) return;  // unchanged since it was last read, well or not
  read_stamp_ = stamp;
  if (size > kMaxSignalBytes)
    return accept(make_error(ErrorCode::invalid_argument, fmt::format("{}: {} bytes, more than a signal file's {} MiB",
                                                                      name, size, kMaxSignalBytes >> 20)));
  std::ifstream in(config_.file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return accept(make_error(ErrorCode::io, fmt::format("{}: cannot read it", name)));
  accept(config::parse_grid_signal(text.str(), name, kind_));
}

void SignalService::fetch_loop() {
  auto where = split_url(config_.url);
  auto token = read_token(config_.token_file, name_);
  std::optional<client::HttpClient> http;
  if (where && token) {
    http.emplace(where->first, *token,
                 std::chrono::milliseconds(static_cast<std::int64_t>(config_.timeout_seconds * 1000.0)));
    http->set_token_header(config_.token_header);
  }
  for (;;) {
    schedulers::UnixMillis at = 0;
    {
      std::unique_lock lock(wake_mutex_);
      wake_.wait(lock, [this] { return stopping_ || fetch_wanted_; });
      if (stopping_) return;
      fetch_wanted_ = false;
      at = fetch_at_;
    }
    Result<schedulers::GridSignal> result = make_error(ErrorCode::invalid_argument, "");
    if (!where)
      result = where.error();
    else if (!token)
      result = token.error();
    else if (auto reply = http->request("GET", with_now(where->second, at), {}, {}); !reply)
      result = make_error(reply.error().code, fmt::format("{}: {}", config_.url, reply.error().message));
    else if (reply->status != 200)
      result =
          make_error(ErrorCode::unavailable, fmt::format("{}: HTTP {}{}", config_.url, reply->status,
                                                         reply->body.empty() ? "" : ": " + reply->body.substr(0, 200)));
    else
      result = config::parse_grid_signal(reply->body, config_.url, kind_);
    boost::asio::post(io_, [this, alive = alive_, result = std::move(result)]() mutable {
      if (!alive->load()) return;
      accept(std::move(result));
      publish();
    });
  }
}

void SignalService::accept(Result<schedulers::GridSignal> signal) {
  const auto now = clock_.unix_ms();
  if (signal) {
    const bool was_fresh = feed_.in_force(now).state == SignalState::fresh;
    const auto ends = signal->end();
    feed_.loaded(std::move(signal).value(), now);
    if (now >= ends)
      spdlog::warn("{} signal: {} ends at {}, before now: {} stands in", name_, describe_source(config_),
                   schedulers::format_rfc3339(ends), config_.constant ? "the constant" : "its last value");
    else if (!was_fresh)
      spdlog::info("{} signal: {} in force, {:.4g} {} now", name_, describe_source(config_), *feed_.value_at(now),
                   kind_ == config::SignalKind::price ? feed_.unit() : "g/kWh");
    if (changed_) changed_();
    return;
  }
  if (feed_.failed(signal.error().message, now))
    spdlog::warn("{} signal: {} (the previous signal stays in force)", name_, signal.error().message);
}

void SignalService::publish() {
  const auto now = clock_.unix_ms();
  if (kind_ == config::SignalKind::price)
    metrics_.set_price_signal(feed_.value_at(now), feed_.currency(), to_string(feed_.in_force(now).state),
                              feed_.failures());
  else
    metrics_.set_carbon_signal(feed_.value_at(now), to_string(feed_.in_force(now).state), feed_.failures());
}

}  // namespace joule::daemon
