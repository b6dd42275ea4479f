#include "http/routes/budget_json.hpp"

#include <cmath>

#include "joule/schedulers/time_format.hpp"

namespace joule::daemon::routes {

namespace sched = joule::schedulers;
using nlohmann::json;

json budgets_json(const BudgetsView& view) {
  json budgets = json::array();
  for (const auto& [state, covers_this_node] : view.budgets) {
    const auto& budget = state.budget;
    const bool joules = budget.unit == sched::BudgetUnit::joules;
    // Joule budgets' figures also under the names they had before budgets had units.
    auto in_joules = [&](double value) { return joules ? json(value) : json(nullptr); };
    budgets.push_back({{"name", budget.name},
                       {"scope", sched::to_string(budget.scope.scope)},
                       {"target", budget.scope.target},
                       {"owner", budget.owner.empty() ? json(nullptr) : json(budget.owner)},
                       {"project", budget.project.empty() ? json(nullptr) : json(budget.project)},
                       {"window", budget.window.describe()},
                       {"window_start", sched::format_rfc3339(state.window_start)},
                       {"resets_at", state.resets_at ? json(sched::format_rfc3339(*state.resets_at)) : json(nullptr)},
                       {"unit", sched::to_string(budget.unit)},
                       {"currency", budget.currency.empty() ? json(nullptr) : json(budget.currency)},
                       {"limit", budget.limit},
                       {"spent", state.spent},
                       {"reserved", state.reserved.mean_joules},
                       {"reserved_std", std::sqrt(state.reserved.variance)},
                       {"remaining", state.remaining()},
                       {"uncounted_joules", state.uncounted_joules},
                       {"limit_joules", in_joules(budget.limit)},
                       {"spent_joules", in_joules(state.spent)},
                       {"reserved_joules", in_joules(state.reserved.mean_joules)},
                       {"reserved_std_joules", in_joules(std::sqrt(state.reserved.variance))},
                       {"remaining_joules", in_joules(state.remaining())},
                       {"covers_this_node", covers_this_node}});
  }
  json caps = json::array();
  for (const auto& [cap, power_watts] : view.caps)
    caps.push_back({{"name", cap.name},
                    {"scope", sched::to_string(cap.scope.scope)},
                    {"target", cap.scope.target},
                    {"limit_watts", cap.watts},
                    {"average_seconds", cap.average_seconds},
                    {"power_watts", power_watts}});
  json floors = json::array();
  for (const auto& [floor, charge] : view.floors)
    floors.push_back({{"name", floor.name},
                      {"scope", sched::to_string(floor.scope.scope)},
                      {"target", floor.scope.target},
                      {"floor_percent", floor.percent},
                      {"margin_percent", floor.margin_percent},
                      {"charge_percent", charge ? json(*charge) : json(nullptr)}});
  return json{{"node", view.node},
              {"policy",
               {{"source", view.policy_source},
                {"objective", sched::to_string(view.objective)},
                {"risk", view.risk},
                {"warmup_epochs", view.warmup_epochs}}},
              {"budgets", budgets},
              {"power_caps", caps},
              {"battery_floors", floors},
              {"note",
               "spent is the metered energy of the jobs and probes jouled ran (by their meters' sources; idle power is "
               "not counted), in each budget's unit: joules, grams of CO2e or money at the carbon or price signal "
               "over the work; reserved is what placed and running jobs are still expected to use; "
               "uncounted_joules is work a grams or money budget covers that ran with no signal to count it at"}};
}

}  // namespace joule::daemon::routes
