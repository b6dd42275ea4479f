#include "joule/daemon/cluster_service.hpp"

#include "nodes/device_views.hpp"

#include <list>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/uuid/random_generator.hpp>
#include <boost/uuid/uuid_io.hpp>

#include "joule/client/http_client.hpp"
#include "joule/daemon/run_on_loop.hpp"
#include "joule/schedulers/time_format.hpp"

namespace joule::daemon {

namespace asio = boost::asio;
using nlohmann::json;

namespace {

std::chrono::steady_clock::duration seconds(double value) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(value));
}

std::int64_t millis(double seconds) { return static_cast<std::int64_t>(seconds * 1000.0); }

}  // namespace

// ---------------------------------------------------------------- coordinator

ClusterCoordinator::ClusterCoordinator(asio::io_context& io, JobService& jobs, const DeviceTable& devices,
                                       ModelService& models, Metrics& metrics, CoordinatorOptions options,
                                       const Clock& clock)
    : io_(io),
      jobs_(jobs),
      devices_(devices),
      models_(models),
      metrics_(metrics),
      options_(options),
      clock_(clock),
      registry_(millis(options.lost_after_seconds), now_ms()),
      lease_timer_(io) {
  static thread_local boost::uuids::random_generator make_uuid;
  incarnation_ = boost::uuids::to_string(make_uuid());
  jobs_.nodes().add_node_changed_hook([this, alive = alive_](const std::string& node) {
    if (*alive) release_held(node, false);
  });
}

ClusterCoordinator::~ClusterCoordinator() { *alive_ = false; }

std::int64_t ClusterCoordinator::now_ms() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(clock_.steady().time_since_epoch()).count();
}

std::int64_t ClusterCoordinator::wall_ms(std::int64_t registry_ms) const {
  return clock_.unix_ms() - (now_ms() - registry_ms);
}

void ClusterCoordinator::start() {
  for (const auto& node : jobs_.nodes().nodes_with_jobs()) {
    registry_.expect(node, now_ms());
    spdlog::info("node {}: expected back within {} s (it holds placed or running jobs)", node,
                 options_.lost_after_seconds);
  }
  publish_node_counts();
  check_leases();
}

void ClusterCoordinator::stop() {
  lease_timer_.cancel();
  for (auto& [node, held] : held_)
    for (auto& sync : held) {
      sync.timer->cancel();
      sync.answer(make_error(ErrorCode::unavailable, "the coordinator is stopping"));
    }
  held_.clear();
}

void ClusterCoordinator::set_options(CoordinatorOptions options) {
  options_ = options;
  registry_.set_lease(millis(options.lost_after_seconds));
}

void ClusterCoordinator::check_leases() {
  const auto lost = registry_.expire(now_ms());
  for (const auto& node : lost) {
    spdlog::warn("node {}: lost (not heard from for {} s); its jobs are queued again or fail per their restart policy",
                 node, options_.lost_after_seconds);
    jobs_.nodes().node_lost(node);
  }
  if (!lost.empty()) publish_node_counts();
  // Leases are checked often enough that a lost node is declared within a tenth of its lease.
  lease_timer_.expires_after(seconds(std::clamp(options_.lost_after_seconds / 10.0, 0.05, 1.0)));
  lease_timer_.async_wait([this, alive = alive_](boost::system::error_code ec) {
    if (!ec && *alive) check_leases();
  });
}

void ClusterCoordinator::publish_node_counts() {
  std::map<std::string, double> counts{{"joining", 0}, {"ready", 0}, {"lost", 0}};
  for (const auto& [name, node] : registry_.nodes()) counts[std::string(cluster::to_string(node.state))] += 1;
  for (const auto& [state, count] : counts) metrics_.set_nodes_in_state(state, count);
}

cluster::SyncReply ClusterCoordinator::reply_for(const std::string& node) {
  cluster::SyncReply reply;
  reply.coordinator = incarnation_;
  reply.revision = ++revision_;
  reply.lease_seconds = options_.lost_after_seconds;
  reply.heartbeat_seconds = options_.heartbeat_seconds;
  reply.jobs = jobs_.nodes().desired_for(node);
  reply.digest = cluster::digest_of(reply.jobs);
  // The node's own devices only, found in the sorted map: walking every device of the cluster
  // on every sync was a sixth of a 1,000-node coordinator's CPU.
  const std::string prefix = node + "/";
  for (auto it = model_versions_.lower_bound(prefix); it != model_versions_.end() && it->first.starts_with(prefix);
       ++it)
    reply.model_versions[it->first.substr(prefix.size())] = it->second;
  if (const auto digest = signal_digests_.find(node); digest != signal_digests_.end())
    reply.signals_digest = digest->second;
  return reply;
}

json ClusterCoordinator::node_signals_view(const std::string& node) const {
  // Its devices carry what it reported (all of them the same).
  std::shared_ptr<const cluster::ReportedSignal> carbon, price;
  for (const std::size_t index : devices_.of_node(node)) {
    carbon = devices_[index].reported_carbon;
    price = devices_[index].reported_price;
  }
  const auto now = now_ms();
  auto view = [&](const std::shared_ptr<const cluster::ReportedSignal>& signal) {
    if (!signal) return json(nullptr);
    return json{{"value_now", signal->signal.mean_extended(now, now + 1)},
                {"signal", signal->label},
                {"currency", signal->currency.empty() ? json(nullptr) : json(signal->currency)}};
  };
  return {{"carbon", view(carbon)}, {"price", view(price)}};
}

void ClusterCoordinator::take_signals(const cluster::SyncRequest& request) {
  auto price = request.price;
  if (price && price->currency != options_.price_currency) {
    spdlog::warn(
        "node {}: its prices are in {} but {}: they are not taken (its jobs are costed at this node's prices, "
        "if any)",
        request.node, price->currency,
        options_.price_currency.empty() ? "this coordinator has no [price]"
                                        : "this coordinator's are in " + options_.price_currency);
    price.reset();
  }
  auto shared = [](std::optional<cluster::ReportedSignal> signal) {
    return signal ? std::make_shared<const cluster::ReportedSignal>(std::move(*signal)) : nullptr;
  };
  spdlog::info("node {}: signals of its own: carbon {}, price {}", request.node,
               request.carbon ? request.carbon->label : "none (this node's stands in)",
               price ? price->label : "none (this node's stands in)");
  jobs_.nodes().set_node_signals(request.node, shared(request.carbon), shared(std::move(price)));
  signal_digests_[request.node] = request.signals_digest;
}

void ClusterCoordinator::sync(const json& body, Answer answer) {
  auto request = cluster::parse_sync_request(body);
  if (!request) return answer(request.error());
  const auto now = now_ms();
  const auto heard = registry_.heard_from(*request, now);
  if (heard.new_node)
    spdlog::info("node {}: registered ({} devices, jouled {})", request->node, request->devices.size(),
                 request->version);
  if (heard.came_back) spdlog::info("node {}: heard from again; reconciling its jobs", request->node);
  if (heard.restarted) spdlog::info("node {}: its jouled restarted; reconciling its jobs", request->node);
  // Counted when a node changes state, not on every sync (it walks every node).
  if (heard.new_node || heard.came_back || heard.joined) publish_node_counts();
  // Its reports first: a node coming back with the end of a job queued again while it was lost
  // settles that job before its devices, ready again, are offered to the queue (which would
  // otherwise run the job a second time).
  auto recorded = jobs_.nodes().apply_reports(request->node, request->jobs);
  jobs_.nodes().update_node(request->node, request->devices);

  for (const auto& device : request->devices) {
    // A model kept from before this coordinator restarted (ModelService::keep): not asked for again.
    const std::string name = request->node + "/" + device.name;
    if (!model_versions_.contains(name))
      if (const auto kept = models_.version(name); kept > 0) model_versions_[name] = kept;
  }
  for (const auto& upload : request->models) {
    const std::string name = request->node + "/" + upload.device;
    auto model = estimator::DeviceEnergyModel::load(upload.snapshot);
    model_versions_[name] = upload.version;  // not asked for again, even when unreadable
    if (!model) {
      spdlog::warn("node {}: energy model of {} (version {}) is unreadable: {}", request->node, upload.device,
                   upload.version, model.error().message);
      continue;
    }
    spdlog::info("node {}: energy model of {} version {} installed", request->node, upload.device, upload.version);
    std::string source;
    for (const auto& device : request->devices)
      if (device.name == upload.device) source = device.source;
    models_.keep(name, upload.snapshot, upload.version, source,
                 std::make_shared<const estimator::DeviceEnergyModel>(std::move(model).value()));
  }
  if (request->signals_sent) take_signals(*request);
  auto reply = reply_for(request->node);
  reply.recorded = std::move(recorded);
  bool wants_upload = false;
  for (const auto& device : request->devices) {
    const auto it = model_versions_.find(request->node + "/" + device.name);
    wants_upload = wants_upload || device.model_version > (it == model_versions_.end() ? 0 : it->second);
  }
  const bool nothing_to_say = reply.digest == request->digest && reply.recorded.empty() && !wants_upload;
  if (request->wait_seconds <= 0 || !nothing_to_say) return answer(cluster::to_json(reply));

  // Long poll: answer when the node's desired state changes, or when the wait is over.
  auto& held = held_[request->node];
  held.push_back(HeldSync{reply.digest, std::move(answer), std::make_unique<asio::steady_timer>(io_)});
  auto where = std::prev(held.end());
  where->timer->expires_after(seconds(request->wait_seconds));
  where->timer->async_wait([this, alive = alive_, node = request->node](boost::system::error_code ec) {
    if (!ec && *alive) release_held(node, true);
  });
}

void ClusterCoordinator::release_held(const std::string& node, bool timed_out_only) {
  auto it = held_.find(node);
  if (it == held_.end()) return;
  const auto reply = reply_for(node);
  const auto now = std::chrono::steady_clock::now();
  for (auto sync = it->second.begin(); sync != it->second.end();) {
    const bool expired = sync->timer->expiry() <= now;
    const bool changed = sync->digest != reply.digest;
    if ((timed_out_only && !expired) || (!timed_out_only && !changed && !expired)) {
      ++sync;
      continue;
    }
    sync->timer->cancel();
    // Holding a sync is hearing from the node: its lease runs from the answer.
    cluster::SyncRequest touch;
    touch.node = node;
    if (const auto* record = registry_.find(node)) {
      touch.incarnation = record->incarnation;
      touch.version = record->version;
      touch.devices = record->devices;
    }
    registry_.heard_from(touch, now_ms());
    sync->answer(cluster::to_json(reply));
    sync = it->second.erase(sync);
  }
  if (it->second.empty()) held_.erase(it);
}

json ClusterCoordinator::nodes(std::size_t limit, const std::optional<std::string>& after) const {
  json out = json::array();
  const auto now = now_ms();
  const auto budgets = jobs_.budgets_view();
  const auto& all = registry_.nodes();
  json states = json::object();
  for (const auto& [name, node] : all) {
    auto& count = states[std::string(cluster::to_string(node.state))];
    count = count.is_null() ? 1 : count.get<std::size_t>() + 1;
  }
  auto it = after ? all.upper_bound(*after) : all.begin();
  for (; it != all.end() && out.size() < limit; ++it) {
    const auto& [name, node] = *it;
    json devices = node_devices_view(devices_, name, estimates_);
    double power = 0.0;
    std::size_t running = 0;
    for (const auto& device : devices) {
      power += device.value("power_watts", 0.0);
      running += device["job"].is_null() ? 0 : 1;
    }
    // The budgets that count this node's energy, with what is left of them.
    json covering = json::array();
    for (const auto& budget : budgets.budgets) {
      const auto& rule = budget.state.budget;
      const bool covers = std::any_of(node.devices.begin(), node.devices.end(), [&](const auto& device) {
        return rule.scope.covers(jobs_.budgets().device_ref(name + "/" + device.name));
      });
      if (!covers) continue;
      const bool joules = rule.unit == schedulers::BudgetUnit::joules;
      covering.push_back({{"name", rule.name},
                          {"unit", schedulers::to_string(rule.unit)},
                          {"limit", rule.limit},
                          {"remaining", budget.state.remaining()},
                          {"limit_joules", joules ? json(rule.limit) : json(nullptr)},
                          {"remaining_joules", joules ? json(budget.state.remaining()) : json(nullptr)}});
    }
    out.push_back({{"name", name},
                   {"state", cluster::to_string(node.state)},
                   {"since", schedulers::format_rfc3339(wall_ms(node.since))},
                   {"last_heartbeat",
                    node.last_heard ? json(schedulers::format_rfc3339(wall_ms(*node.last_heard))) : json(nullptr)},
                   {"seconds_since_heartbeat",
                    node.last_heard ? json(static_cast<double>(now - *node.last_heard) / 1000.0) : json(nullptr)},
                   {"version", node.version},
                   {"power_watts", power},
                   {"running_jobs", running},
                   {"devices", devices},
                   {"budgets", covering},
                   {"signals", node_signals_view(name)}});
  }
  const bool more = it != all.end();
  return json{{"role", "coordinator"},
              {"lost_after_seconds", options_.lost_after_seconds},
              {"heartbeat_seconds", options_.heartbeat_seconds},
              {"total", all.size()},
              {"states", states},
              {"next", more && !out.empty() ? json(out.back()["name"]) : json(nullptr)},
              {"nodes", out}};
}

// ---------------------------------------------------------------- agent

ClusterAgent::ClusterAgent(asio::io_context& io, AgentJobs& jobs, ModelService& models, AgentOptions options,
                           const Clock& clock)
    : io_(io),
      jobs_(jobs),
      models_(models),
      options_(std::move(options)),
      clock_(clock),
      lease_seconds_(options_.lost_after_seconds) {
  tls_.ca_file = options_.ca_file;
  static thread_local boost::uuids::random_generator make_uuid;
  incarnation_ = boost::uuids::to_string(make_uuid());
}

ClusterAgent::~ClusterAgent() { stop(); }

void ClusterAgent::start() {
  auto url = client::parse_server_url(options_.coordinator);
  if (!url) throw std::runtime_error("cluster.coordinator: " + url.error().message);
  spdlog::info("agent {}: syncing with coordinator {}", options_.node, options_.coordinator);
  last_ok_ = clock_.steady();
  jobs_.set_assignment_changed_hook([this] { report_soon(); });
  poller_ = std::thread([this, url = *url] { poll(url); });
  reporter_ = std::thread([this, url = *url] { report(url); });
}

void ClusterAgent::stop() {
  {
    std::lock_guard lock(wake_mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (poller_.joinable()) poller_.join();
  if (reporter_.joinable()) reporter_.join();
  jobs_.set_assignment_changed_hook({});
}

bool ClusterAgent::on_loop(const std::function<void()>& work) { return run_on_loop(io_, work, stopping_); }

cluster::SyncRequest ClusterAgent::build_request(double wait_seconds) {
  cluster::SyncRequest request;
  request.node = options_.node;
  request.incarnation = incarnation_;
  request.version = options_.version;
  request.devices = jobs_.reported_devices();
  for (auto& device : request.devices) {
    device.model_version = models_.version(device.name);
    const auto& models = models_.models();
    const auto model = models.find(device.name);
    const auto known = coordinator_models_.find(device.name);
    const bool coordinator_has_it = known != coordinator_models_.end() && known->second >= device.model_version;
    if (model != models.end() && model->second && device.model_version > 0 && !coordinator_has_it &&
        knows_coordinator_models_)
      request.models.push_back({device.name, device.model_version, model->second->save()});
  }
  request.jobs = jobs_.assignment_reports(acknowledged_);
  request.wait_seconds = wait_seconds;
  request.digest = digest_;
  // This node's signals in force, whole only when the coordinator holds others.
  const auto now = clock_.unix_ms();
  auto reported = [&](const GridSignalFeed* feed) -> std::optional<cluster::ReportedSignal> {
    const SignalInForce force = feed ? feed->in_force(now) : SignalInForce{};
    if (!force.signal) return std::nullopt;
    return cluster::ReportedSignal{*force.signal, force.label(), feed->currency()};
  };
  auto carbon = reported(options_.carbon);
  auto price = reported(options_.price);
  request.signals_digest = cluster::digest_of_signals(carbon, price);
  if (request.signals_digest != coordinator_signals_ && knows_coordinator_models_) {
    request.signals_sent = true;
    request.carbon = std::move(carbon);
    request.price = std::move(price);
  }
  return request;
}

void ClusterAgent::apply(const cluster::SyncReply& reply) {
  // The poller's and the reporter's requests may cross: an older desired state never follows a newer one.
  if (reply.coordinator == applied_from_ && reply.revision <= applied_revision_) return;
  applied_from_ = reply.coordinator;
  applied_revision_ = reply.revision;
  for (const auto& ended : reply.recorded) acknowledged_.insert(ended);
  coordinator_models_ = reply.model_versions;
  coordinator_signals_ = reply.signals_digest;
  knows_coordinator_models_ = true;
  if (fenced_) {
    spdlog::info("agent {}: the coordinator answers again; reconciling", options_.node);
    fenced_ = false;
  }
  // A job run here holds a lease its runner enforces: if this jouled dies, the job pauses within
  // half the coordinator's lease, before the coordinator may place it elsewhere.
  jobs_.set_lease_seconds(reply.lease_seconds / 2.0);
  const auto plan = cluster::plan_agent(reply.jobs, jobs_.local_assignments());
  for (const auto& [local_id, why] : plan.stop) jobs_.stop_assignment(local_id, why);
  for (const auto& local_id : plan.pause) jobs_.pause_assignment(local_id, true, "paused by the coordinator's policy");
  for (const auto& local_id : plan.resume) jobs_.pause_assignment(local_id, false, "resumed by the coordinator");
  for (const auto& assignment : plan.start) jobs_.assign(assignment);
  digest_ = reply.digest;
}

void ClusterAgent::fence(double silent_seconds) {
  if (fenced_) return;
  fenced_ = true;
  std::size_t paused = 0;
  for (const auto& job : jobs_.local_assignments()) {
    if (job.terminal || job.paused) continue;
    jobs_.pause_assignment(job.local_id, true,
                           fmt::format("fenced: no answer from the coordinator for {:.0f} s (its lease); it may be "
                                       "placed elsewhere now",
                                       silent_seconds));
    ++paused;
  }
  spdlog::warn("agent {}: coordinator unreachable for {:.1f} s, past the lease: {} job{} paused until it answers",
               options_.node, silent_seconds, paused, paused == 1 ? "" : "s");
}

std::optional<cluster::SyncReply> ClusterAgent::exchange(client::HttpConnection& connection, bool wait) {
  double wait_seconds = 0.0;
  double lease = 30.0;
  {
    std::lock_guard lock(status_mutex_);
    wait_seconds = wait ? heartbeat_seconds_ : 0.0;
    lease = lease_seconds_;
  }
  cluster::SyncRequest request;
  if (!on_loop([&] { request = build_request(wait_seconds); })) return std::nullopt;
  // Past the lease without an answer the agent must notice, so no request outlives it.
  const double patience = wait_seconds + std::clamp(lease / 2.0, 1.0, 10.0);
  auto answer = connection.request("POST", "/v1/cluster/sync", cluster::to_json(request).dump(),
                                   std::chrono::milliseconds(static_cast<std::int64_t>(patience * 1000)));
  std::string error;
  std::optional<cluster::SyncReply> reply;
  if (!answer) {
    error = answer.error().message;
  } else if (answer->status != 200) {
    const auto problem = json::parse(answer->body, nullptr, false);
    error = fmt::format("HTTP {}: {}", answer->status,
                        problem.is_object() ? problem.value("detail", answer->body) : answer->body);
  } else {
    auto parsed = cluster::parse_sync_reply(json::parse(answer->body, nullptr, false));
    if (parsed)
      reply = std::move(parsed).value();
    else
      error = fmt::format("the coordinator's answer does not parse: {} at {}", parsed.error().message,
                          parsed.error().where);
  }
  std::lock_guard lock(status_mutex_);
  if (reply) {
    last_ok_ = clock_.steady();
    last_sync_ms_ = clock_.unix_ms();
    last_error_.clear();
    lease_seconds_ = reply->lease_seconds;
    heartbeat_seconds_ = reply->heartbeat_seconds;
  } else {
    if (last_error_ != error)
      spdlog::warn("agent {}: sync with {} failed: {}", options_.node, options_.coordinator, error);
    last_error_ = error;
  }
  if (reply && !on_loop([&] { apply(*reply); })) return std::nullopt;
  return reply;
}

void ClusterAgent::poll(const client::ServerUrl& url) {
  // Kept alive from sync to sync: one TLS handshake per agent, not one per heartbeat.
  client::HttpConnection connection(client::HttpClient(url, options_.token, std::chrono::seconds(30), tls_));
  double backoff = 0.2;
  bool first = true;
  while (!stopping_) {
    // The first exchange after a start or an outage does not wait: it reconciles at once.
    if (exchange(connection, !first)) {
      backoff = 0.2;
      first = false;
      continue;
    }
    first = true;
    double silent = 0.0, lease = 30.0, heartbeat = 1.0;
    {
      std::lock_guard lock(status_mutex_);
      silent = std::chrono::duration<double>(clock_.steady() - last_ok_).count();
      lease = lease_seconds_;
      heartbeat = heartbeat_seconds_;
    }
    if (silent >= lease && !on_loop([&] { fence(silent); })) break;
    std::unique_lock lock(wake_mutex_);
    wake_.wait_for(lock, seconds(backoff), [this] { return stopping_.load(); });
    backoff = std::min(backoff * 2, std::max(heartbeat, 0.2));
  }
}

void ClusterAgent::report(const client::ServerUrl& url) {
  client::HttpConnection connection(client::HttpClient(url, options_.token, std::chrono::seconds(30), tls_));
  // A job that starts or ends here is told at once, not at the poller's next turn.
  while (!stopping_) {
    {
      std::unique_lock lock(wake_mutex_);
      wake_.wait(lock, [this] { return stopping_.load() || report_wanted_; });
      report_wanted_ = false;
    }
    if (!stopping_) (void)exchange(connection, false);
  }
}

void ClusterAgent::report_soon() {
  {
    std::lock_guard lock(wake_mutex_);
    report_wanted_ = true;
  }
  wake_.notify_all();
}

json ClusterAgent::status() const {
  std::lock_guard lock(status_mutex_);
  json out = {{"role", "agent"},
              {"node", options_.node},
              {"coordinator", options_.coordinator},
              {"lease_seconds", lease_seconds_},
              {"last_sync", nullptr},
              {"error", last_error_.empty() ? json(nullptr) : json(last_error_)}};
  if (last_sync_ms_) out["last_sync"] = schedulers::format_rfc3339(*last_sync_ms_);
  return out;
}

}  // namespace joule::daemon
