#pragma once
// GET /v1/budgets as the API shows it, written from the book's BudgetsView.

#include <nlohmann/json.hpp>

#include "joule/daemon/budget_service.hpp"

namespace joule::daemon::routes {

/// {"node", "policy", "budgets", "power_caps", "battery_floors", "note"}.
nlohmann::json budgets_json(const BudgetsView& view);

}  // namespace joule::daemon::routes
