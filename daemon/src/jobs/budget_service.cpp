#include "joule/daemon/budget_service.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace joule::daemon {

namespace sched = joule::schedulers;

namespace {

constexpr sched::UnixMillis kDay = 86'400'000;

sched::EnergyUse to_use(const adapters::StoredEnergyUse& row, const std::vector<std::string>& groups) {
  return sched::EnergyUse{sched::DeviceRef{row.node, row.device, groups},
                          row.work,
                          row.start_ms,
                          row.end_ms,
                          row.joules,
                          row.source,
                          row.owner,
                          row.project,
                          row.grams,
                          row.cost};
}

}  // namespace

BudgetService::BudgetService(adapters::StorageWriter& storage, Metrics& metrics, std::string node,
                             sched::SchedulingCore& core, SignalFeeds signals)
    : storage_(storage), metrics_(metrics), node_(std::move(node)), core_(core), signals_(signals) {}

void BudgetService::set_policy(sched::Policy policy) {
  // A budget in money that names no currency counts in the price signal's.
  if (signals_.price)
    for (auto& budget : policy.budgets)
      if (budget.unit == sched::BudgetUnit::money && budget.currency.empty())
        budget.currency = signals_.price->currency();
  core_.set_policy(std::move(policy));
  const sched::Policy& installed = core_.policy();
  spdlog::info("policy from {}: objective {}, risk {:g}, {} budgets, {} power caps, {} battery floors",
               installed.source, sched::to_string(installed.objective), installed.risk, installed.budgets.size(),
               installed.power_caps.size(), installed.battery_floors.size());
}

sched::DeviceRef BudgetService::device_ref(const std::string& device) const {
  // An agent's device on the coordinator is "node/device".
  const auto slash = device.find('/');
  if (slash == std::string::npos) return sched::DeviceRef{node_, device, core_.policy().groups_of(node_)};
  const std::string node = device.substr(0, slash);
  return sched::DeviceRef{node, device.substr(slash + 1), core_.policy().groups_of(node)};
}

sched::UnixMillis BudgetService::history_needed(sched::UnixMillis now) { return now - 367 * kDay; }

void BudgetService::load(const std::vector<adapters::StoredEnergyUse>& uses) {
  for (const auto& row : uses) core_.ledger().record(to_use(row, core_.policy().groups_of(row.node)));
}

namespace {
adapters::StoredEnergyUse to_row(const sched::EnergyUse& use) {
  return adapters::StoredEnergyUse{use.device.node, use.device.name, use.work,    use.start, use.end, use.joules,
                                   use.source,      use.owner,       use.project, use.grams, use.cost};
}
}  // namespace

void BudgetService::settle(const std::string& job, std::optional<adapters::StoredEnergyUse> metered) {
  std::optional<sched::EnergyUse> use;
  if (metered) use = to_use(*metered, core_.policy().groups_of(metered->node));
  if (auto recorded = core_.end(job, use)) store(to_row(*recorded));
}

void BudgetService::pause_running(const std::string& job, sched::UnixMillis now, const std::string& source) {
  if (auto stretch = core_.paused(job, now)) {
    auto row = to_row(*stretch);
    row.source = source;
    store(row);
  }
}

void BudgetService::resume_running(const std::string& job, sched::UnixMillis now) { core_.resumed(job, now); }

void BudgetService::store(const adapters::StoredEnergyUse& row) {
  storage_.submit([row](adapters::Database& db) { return db.insert_energy_use(row); },
                  [](Status status) {
                    if (!status) spdlog::error("budget ledger: {}", status.error().message);
                  });
}

void BudgetService::record(adapters::StoredEnergyUse use) {
  if (signals_.carbon) use.grams = signals_.carbon->amount(use.joules, use.start_ms, use.end_ms);
  if (signals_.price) use.cost = signals_.price->amount(use.joules, use.start_ms, use.end_ms);
  core_.ledger().record(to_use(use, core_.policy().groups_of(use.node)));
  store(use);
}

BudgetsView BudgetService::view(sched::UnixMillis now, std::span<const sched::DeviceStatus> devices) const {
  const auto& policy = core_.policy();
  BudgetsView out{node_, policy.source, policy.objective, policy.risk, policy.warmup_epochs, {}, {}, {}};
  for (auto& state : core_.ledger().states(now)) {
    const bool covers = std::any_of(devices.begin(), devices.end(),
                                    [&](const auto& device) { return state.budget.scope.covers(device.ref); });
    out.budgets.push_back({std::move(state), covers});
  }
  for (const auto& cap : policy.power_caps) {
    double watts = 0.0;
    for (const auto& device : devices)
      if (cap.scope.covers(device.ref)) watts += device.average_power_watts;
    out.caps.push_back({cap, watts});
  }
  for (const auto& floor : policy.battery_floors) {
    std::optional<double> charge;
    for (const auto& device : devices)
      if (floor.scope.covers(device.ref) && device.battery_percent) charge = *device.battery_percent;
    out.floors.push_back({floor, charge});
  }
  return out;
}

void BudgetService::publish(sched::UnixMillis now) {
  std::vector<Metrics::BudgetFigures> figures;
  for (const auto& state : core_.ledger().states(now))
    // One series per budget of the policy: every owner's own of an each-owner template would make
    // as many as there are owners (GET /v1/budgets lists them).
    if (state.budget.template_name.empty())
      figures.push_back({state.budget.name, state.budget.unit, state.budget.currency, state.budget.limit, state.spent,
                         state.reserved.mean_joules, state.remaining()});
  metrics_.set_budgets(figures);
  // The core forgets uses no window can count by itself; the stored ones go here.
  if (now - last_prune_ > 3'600'000) {
    last_prune_ = now;
    storage_.submit([before = history_needed(now)](adapters::Database& db) { return db.forget_energy_uses(before); },
                    [](Status status) {
                      if (!status) spdlog::error("budget ledger: {}", status.error().message);
                    });
  }
}

}  // namespace joule::daemon
