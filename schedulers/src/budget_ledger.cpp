#include "joule/schedulers/budget_ledger.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace joule::schedulers {
namespace {

constexpr UnixMillis kMinute = 60'000;
constexpr UnixMillis kDay = 86'400'000;

UnixMillis floor_div(UnixMillis a, UnixMillis b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// Days since 1970-01-01 of a civil date, and back (H. Hinnant's algorithms).
std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

std::pair<std::int64_t, unsigned> year_month_of(std::int64_t days) {
  days += 719468;
  const std::int64_t era = (days >= 0 ? days : days - 146096) / 146097;
  const auto doe = static_cast<unsigned>(days - era * 146097);
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const std::int64_t y = static_cast<std::int64_t>(yoe) + era * 400;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const unsigned mp = (5 * doy + 2) / 153;
  const unsigned m = mp < 10 ? mp + 3 : mp - 9;
  return {y + (m <= 2), m};
}

// The share of a use's interval that falls in [from, to] (all of it or none for an instant).
double fraction_in(const EnergyUse& use, UnixMillis from, UnixMillis to) {
  if (use.end <= use.start) return use.end >= from && use.end <= to ? 1.0 : 0.0;
  const UnixMillis overlap = std::min(use.end, to) - std::max(use.start, from);
  if (overlap <= 0) return 0.0;
  return static_cast<double>(overlap) / static_cast<double>(use.end - use.start);
}

std::optional<double> sum(std::optional<double> a, std::optional<double> b) {
  if (!a || !b) return std::nullopt;
  return *a + *b;
}

// `amount` less what earlier stretches counted of it, where both are known.
std::optional<double> less_recorded(std::optional<double> amount, std::optional<double> recorded) {
  if (!amount) return std::nullopt;
  return std::max(0.0, *amount - recorded.value_or(0.0));
}

UnixMillis window_length(const BudgetWindow& window) {
  switch (window.kind) {
    case BudgetWindow::Kind::rolling:
      return window.rolling_seconds * 1000;
    case BudgetWindow::Kind::day:
      return kDay;
    case BudgetWindow::Kind::week:
      return 7 * kDay;
    case BudgetWindow::Kind::month:
      return 31 * kDay;
  }
  return kDay;
}

}  // namespace

std::optional<double> UseRates::of(BudgetUnit unit) const {
  switch (unit) {
    case BudgetUnit::joules:
      return 1.0;
    case BudgetUnit::grams:
      return grams_per_joule;
    case BudgetUnit::money:
      return cost_per_joule;
  }
  return std::nullopt;
}

std::optional<double> EnergyUse::amount(BudgetUnit unit) const {
  switch (unit) {
    case BudgetUnit::joules:
      return joules;
    case BudgetUnit::grams:
      return grams;
    case BudgetUnit::money:
      return cost;
  }
  return std::nullopt;
}

void BudgetLedger::set_budgets(std::vector<EnergyBudget> budgets) {
  ++revision_;
  budgets_ = std::move(budgets);
  covered_.assign(budgets_.size(), {});
  for (std::size_t i = 0; i < uses_.size(); ++i)
    for (std::size_t b = 0; b < budgets_.size(); ++b)
      if (counts(budgets_[b], uses_[i])) covered_[b].push_back(first_use_ + i);
}

void BudgetLedger::record(EnergyUse use) {
  ++revision_;
  // The many short jobs of a busy device add up in one use per device and wall-clock minute, so
  // the uses kept (a day, or the longest window) grow with devices and minutes, not with jobs.
  // Calendar windows start on whole minutes and count such a use exactly; the edge of a rolling
  // window may prorate that minute's energy over the merged span instead of each job's own.
  // One owner's and project's: their budgets count them apart.
  const std::string key = use.device.qualified() + '\n' + use.owner + '\n' + use.project;
  const UnixMillis minute = floor_div(use.start, kMinute);
  if (minute == floor_div(use.end, kMinute)) {
    const auto last = last_use_.find(key);
    if (last != last_use_.end() && last->second >= first_use_) {
      EnergyUse& into = uses_[last->second - first_use_];
      if (floor_div(into.start, kMinute) == minute && floor_div(into.end, kMinute) == minute &&
          into.source == use.source && into.grams.has_value() == use.grams.has_value() &&
          into.cost.has_value() == use.cost.has_value()) {
        into.start = std::min(into.start, use.start);
        into.end = std::max(into.end, use.end);
        into.joules += use.joules;
        into.grams = sum(into.grams, use.grams);
        into.cost = sum(into.cost, use.cost);
        return;
      }
    }
  }
  const std::uint64_t number = first_use_ + uses_.size();
  last_use_[key] = number;
  for (std::size_t b = 0; b < budgets_.size(); ++b)
    if (counts(budgets_[b], use)) covered_[b].push_back(number);
  uses_.push_back(std::move(use));
}

void BudgetLedger::set_policy(const Policy& policy) {
  ++revision_;
  for (auto& use : uses_) use.device.groups = policy.groups_of(use.device.node);
  for (auto& [id, running] : jobs_) {
    running.device.groups = policy.groups_of(running.device.node);
    if (running.so_far) running.so_far->device.groups = running.device.groups;
  }
  set_budgets(policy.budgets);
}

template <class Visit>
void BudgetLedger::for_each_covered(std::size_t budget, Visit&& visit) const {
  for (const std::uint64_t number : covered_[budget]) visit(uses_[number - first_use_]);
}

void BudgetLedger::reserve(const std::string& job, const DeviceRef& device, EnergyDistribution expected,
                           std::string owner, std::string project, UseRates rates) {
  ++revision_;
  Running running;
  running.device = device;
  running.owner = std::move(owner);
  running.project = std::move(project);
  running.expected = expected;
  running.ahead = rates;
  running.spent = rates;
  jobs_[job] = std::move(running);
}

void BudgetLedger::update_running(const std::string& job, UnixMillis start, UnixMillis now, double used_joules,
                                  EnergyDistribution still_expected, UseRates spent_rates, UseRates ahead_rates) {
  ++revision_;
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  Running& running = it->second;
  running.expected = still_expected;
  running.ahead = ahead_rates;
  if (running.paused) return;
  running.spent = spent_rates;
  const double joules = std::max(0.0, used_joules - running.recorded.joules);
  auto at = [&](const std::optional<double>& per_joule) {
    return per_joule ? std::optional<double>(joules * *per_joule) : std::nullopt;
  };
  running.so_far = EnergyUse{running.device,
                             job,
                             running.stretch_start.value_or(start),
                             now,
                             joules,
                             {},
                             running.owner,
                             running.project,
                             at(spent_rates.grams_per_joule),
                             at(spent_rates.cost_per_joule)};
}

std::optional<EnergyUse> BudgetLedger::pause_running(const std::string& job, UnixMillis now) {
  ++revision_;
  auto it = jobs_.find(job);
  if (it == jobs_.end() || it->second.paused) return std::nullopt;
  Running& running = it->second;
  running.paused = true;
  if (!running.so_far) return std::nullopt;
  EnergyUse stretch = *running.so_far;
  stretch.end = std::max(stretch.start, now);
  running.recorded.joules += stretch.joules;
  running.recorded.grams = running.recorded.grams.value_or(0.0) + stretch.grams.value_or(0.0);
  running.recorded.cost = running.recorded.cost.value_or(0.0) + stretch.cost.value_or(0.0);
  running.so_far.reset();
  record(stretch);
  return stretch;
}

void BudgetLedger::resume_running(const std::string& job, UnixMillis now) {
  ++revision_;
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  it->second.paused = false;
  it->second.stretch_start = now;
}

std::optional<EnergyUse> BudgetLedger::settle(const std::string& job, std::optional<EnergyUse> metered) {
  ++revision_;
  const auto it = jobs_.find(job);
  if (metered && it != jobs_.end()) {
    if (metered->owner.empty()) metered->owner = it->second.owner;
    if (metered->project.empty()) metered->project = it->second.project;
  }
  if (metered && it != jobs_.end() && it->second.recorded.joules > 0.0) {
    // The last stretch: from the last resume, with what the earlier stretches did not count.
    const EnergyUse& recorded = it->second.recorded;
    if (it->second.stretch_start) metered->start = std::min(*it->second.stretch_start, metered->end);
    metered->joules = std::max(0.0, metered->joules - recorded.joules);
    metered->grams = less_recorded(metered->grams, recorded.grams);
    metered->cost = less_recorded(metered->cost, recorded.cost);
  }
  if (it != jobs_.end()) jobs_.erase(it);
  if (!metered) return std::nullopt;
  record(*metered);
  return metered;
}

std::pair<UnixMillis, UnixMillis> BudgetLedger::calendar_window(BudgetWindow::Kind kind, UnixMillis now) const {
  const UnixMillis offset = utc_offset_minutes_ * kMinute;
  const std::int64_t day = floor_div(now + offset, kDay);
  std::int64_t first = day;
  std::int64_t next = day + 1;
  if (kind == BudgetWindow::Kind::week) {
    const std::int64_t weekday = ((day + 3) % 7 + 7) % 7;  // 1970-01-01 was a Thursday; Monday is 0
    first = day - weekday;
    next = first + 7;
  } else if (kind == BudgetWindow::Kind::month) {
    const auto [year, month] = year_month_of(day);
    first = days_from_civil(year, month, 1);
    next = month == 12 ? days_from_civil(year + 1, 1, 1) : days_from_civil(year, month + 1, 1);
  }
  return {first * kDay - offset, next * kDay - offset};
}

std::pair<double, double> BudgetLedger::spent_in(std::size_t budget, UnixMillis from, UnixMillis to) const {
  const BudgetUnit unit = budgets_[budget].unit;
  double spent = 0.0, uncounted = 0.0;
  auto add = [&](const EnergyUse& use) {
    const double fraction = fraction_in(use, from, to);
    if (fraction <= 0.0) return;
    if (const auto amount = use.amount(unit))
      spent += *amount * fraction;
    else
      uncounted += use.joules * fraction;
  };
  for_each_covered(budget, add);
  for (const auto& [id, running] : jobs_)
    if (running.so_far && counts(budgets_[budget], running)) add(*running.so_far);
  return {spent, uncounted};
}

std::vector<BudgetState> BudgetLedger::states(UnixMillis now) const {
  std::vector<BudgetState> out;
  out.reserve(budgets_.size());
  for (std::size_t b = 0; b < budgets_.size(); ++b) {
    const EnergyBudget& budget = budgets_[b];
    BudgetState state;
    state.budget = budget;
    state.index = b;
    if (budget.window.kind == BudgetWindow::Kind::rolling) {
      const UnixMillis length = window_length(budget.window);
      state.window_start = now - length;
      std::optional<UnixMillis> oldest;
      auto consider = [&](const EnergyUse& use) {
        if (fraction_in(use, state.window_start, now) <= 0.0) return;
        const UnixMillis from = std::max(use.start, state.window_start);
        oldest = oldest ? std::min(*oldest, from) : from;
      };
      for_each_covered(b, consider);
      for (const auto& [id, running] : jobs_)
        if (running.so_far && counts(budget, running)) consider(*running.so_far);
      if (oldest) state.resets_at = *oldest + length;
    } else {
      const auto [start, end] = calendar_window(budget.window.kind, now);
      state.window_start = start;
      state.resets_at = end;
    }
    std::tie(state.spent, state.uncounted_joules) = spent_in(b, state.window_start, now);
    for (const auto& [id, running] : jobs_) {
      if (!counts(budget, running)) continue;
      // A job without the signal a grams or money budget needs is reserved nothing there.
      if (const auto rate = running.ahead.of(budget.unit))
        state.reserved = state.reserved + EnergyDistribution{running.expected.mean_joules * *rate,
                                                             running.expected.variance * *rate * *rate};
    }
    out.push_back(std::move(state));
  }
  return out;
}

std::optional<UnixMillis> BudgetLedger::frees_by(const BudgetState& state, double amount, UnixMillis now) const {
  if (amount <= 0.0) return now;
  if (amount > state.spent + 1e-9) return std::nullopt;
  if (state.budget.window.kind != BudgetWindow::Kind::rolling) return state.resets_at;
  // Spent energy leaves a rolling window as time passes; each use has left entirely once its
  // end is a window length ago. Check those moments in order (ignoring new spending).
  if (state.index >= budgets_.size() || budgets_[state.index].name != state.budget.name) return std::nullopt;
  const UnixMillis length = window_length(state.budget.window);
  std::vector<const EnergyUse*> counted;
  for_each_covered(state.index, [&](const EnergyUse& use) {
    if (use.end + length > now) counted.push_back(&use);
  });
  for (const auto& [id, running] : jobs_)
    if (running.so_far && counts(state.budget, running)) counted.push_back(&*running.so_far);
  std::sort(counted.begin(), counted.end(), [](const EnergyUse* a, const EnergyUse* b) { return a->end < b->end; });
  const BudgetUnit unit = state.budget.unit;
  for (const EnergyUse* leaving : counted) {
    const UnixMillis at = leaving->end + length;
    double still = 0.0;
    for (const EnergyUse* use : counted) still += use->amount(unit).value_or(0.0) * fraction_in(*use, at - length, now);
    if (state.spent - still >= amount - 1e-9) return at;
  }
  return std::nullopt;
}

std::vector<std::string> BudgetLedger::owners() const {
  std::vector<std::string> out;
  for (const auto& use : uses_)
    if (!use.owner.empty()) out.push_back(use.owner);
  for (const auto& [id, running] : jobs_)
    if (!running.owner.empty()) out.push_back(running.owner);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void BudgetLedger::prune(UnixMillis now) {
  ++revision_;
  // Keep at least a day so that a budget added by a reload still sees the recent past.
  UnixMillis keep = kDay;
  for (const auto& budget : budgets_) keep = std::max(keep, window_length(budget.window));
  while (!uses_.empty() && uses_.front().end < now - keep) {
    for (auto& numbers : covered_)
      if (!numbers.empty() && numbers.front() == first_use_) numbers.pop_front();
    uses_.pop_front();
    ++first_use_;
  }
}

}  // namespace joule::schedulers
