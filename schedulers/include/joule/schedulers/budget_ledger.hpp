#pragma once
// The budget ledger: energy spent and reserved against each budget of the policy, in the
// budget's unit (joules, grams CO2e, money).
//
// Spent energy is metered work (jobs and probes) with the interval it ran in, and its grams and
// cost where the caller priced it at the signals over that interval; it counts in a window in
// proportion to how much of its interval lies in the window (a job that ran from 23:00 to 01:00
// counts half in each calendar day). Reservations are what placed and running jobs are still
// expected to use, as distributions of joules with the rates (grams and cost per joule) of the
// signals over their expected run, so admission can ask how likely the whole lot is to overrun.
// Pure: time and rates are passed in; calendar windows use a fixed offset from UTC that the
// caller supplies (the node's local time).

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "joule/schedulers/energy_risk.hpp"
#include "joule/schedulers/policy.hpp"
#include "joule/schedulers/time_format.hpp"

namespace joule::schedulers {

/// What a joule of work drawn over some interval emits and costs: the mean carbon intensity and
/// price of the signals over it, per joule; nullopt where the device has no such signal.
struct UseRates {
  std::optional<double> grams_per_joule;
  std::optional<double> cost_per_joule;
  /// The rate a budget of `unit` counts joules at (1 for joules).
  std::optional<double> of(BudgetUnit unit) const;
  bool operator==(const UseRates&) const = default;
};

/// Metered energy of one piece of finished (or running-so-far) work on one device.
struct EnergyUse {
  DeviceRef device;
  std::string work;  ///< job id or "probe"
  UnixMillis start = 0;
  UnixMillis end = 0;
  double joules = 0.0;
  std::string source;  ///< meter source: what kind of joules these are
  std::string owner{};    ///< the job's owner, for owners' budgets; empty for probes
  std::string project{};  ///< the job's project, for projects' budgets; empty: none
  std::optional<double> grams{};  ///< CO2e at the carbon signal over [start, end); nullopt: no signal
  std::optional<double> cost{};   ///< at the price signal over [start, end); nullopt: no signal

  /// Its amount in `unit`; nullopt where it was not priced in that unit.
  std::optional<double> amount(BudgetUnit unit) const;
};

/// One budget at one moment, in the budget's unit.
struct BudgetState {
  EnergyBudget budget;
  std::size_t index = 0;  ///< the budget's place in the ledger's budgets
  double spent = 0.0;
  EnergyDistribution reserved;  ///< what placed and running jobs are still expected to use
  /// Grams and money budgets: joules of work in the window they cover whose grams or cost is
  /// unknown (drawn where no signal was in force); counted as nothing, shown so it is not hidden.
  double uncounted_joules = 0.0;
  UnixMillis window_start = 0;
  /// Calendar windows: when the window starts again. Rolling: when the oldest spent energy
  /// now in the window starts to leave it (nullopt when nothing is spent).
  std::optional<UnixMillis> resets_at;
  double remaining() const { return budget.limit - spent - reserved.mean_joules; }
};

class BudgetLedger {
 public:
  /// `utc_offset_minutes`: local time minus UTC, for calendar days, weeks (from Monday) and months.
  BudgetLedger() = default;
  explicit BudgetLedger(int utc_offset_minutes) : utc_offset_minutes_(utc_offset_minutes) {}
  /// A new offset (daylight saving time began or ended): calendar windows follow it.
  void set_utc_offset_minutes(int minutes) {
    utc_offset_minutes_ = minutes;
    ++revision_;
  }
  /// Changes with every change to what the ledger holds (a pass left open is valid only while
  /// it stays the same).
  std::uint64_t revision() const { return revision_; }

  /// Replaces the budgets (policy reload); spent energy and reservations are kept. With a
  /// policy, the node groups of every recorded use and reservation are taken from it first (a
  /// reload may move nodes between groups).
  void set_budgets(std::vector<EnergyBudget> budgets);
  void set_policy(const Policy& policy);
  const std::vector<EnergyBudget>& budgets() const { return budgets_; }

  /// Records metered work that has ended (a finished job, a probe). Work that ran inside one
  /// wall-clock minute adds to its device's use of that minute, if there is one.
  void record(EnergyUse use);
  /// Reserves what a placed job of `owner` in `project` is expected to use on its device, at
  /// `rates` (the signals over its expected run); its use so far and at the end counts for them too.
  void reserve(const std::string& job, const DeviceRef& device, EnergyDistribution expected, std::string owner = {},
               std::string project = {}, UseRates rates = {});
  /// A running job: what it has used so far (from `start` to `now`, at `spent_rates`: the signals
  /// over that stretch) and what it is still expected to use (from its projection, at
  /// `ahead_rates`). Replaces the job's previous figures.
  void update_running(const std::string& job, UnixMillis start, UnixMillis now, double used_joules,
                      EnergyDistribution still_expected, UseRates spent_rates = {}, UseRates ahead_rates = {});
  /// A running job is paused: what it used since it last started counts from then to `now`
  /// (not spread over the pause). Returns that stretch, recorded, for the caller to store.
  std::optional<EnergyUse> pause_running(const std::string& job, UnixMillis now);
  /// A paused job runs again: its next stretch starts `now`.
  void resume_running(const std::string& job, UnixMillis now);
  /// Ends a job's reservation; records its metered use when there is one (`metered` covers the
  /// whole run; the stretches recorded at pauses are taken off; an owner and project it lacks
  /// are the reservation's). Returns what was recorded.
  std::optional<EnergyUse> settle(const std::string& job, std::optional<EnergyUse> metered);
  bool has_reservation(const std::string& job) const { return jobs_.contains(job); }

  /// Every budget's state at `now`, in policy order.
  std::vector<BudgetState> states(UnixMillis now) const;
  /// The earliest time at or after `now` when the budget's spent amount will have fallen by at
  /// least `amount` (rolling windows: as uses leave it; calendar ones: at the reset). nullopt
  /// if waiting cannot free that much.
  std::optional<UnixMillis> frees_by(const BudgetState& state, double amount, UnixMillis now) const;
  /// Forgets uses that no window can count any more.
  void prune(UnixMillis now);
  std::size_t uses() const { return uses_.size(); }
  /// Every owner of a use or reservation held, once each, sorted.
  std::vector<std::string> owners() const;

  /// Where a window that contains `now` starts and when it ends.
  std::pair<UnixMillis, UnixMillis> calendar_window(BudgetWindow::Kind kind, UnixMillis now) const;

 private:
  struct Running {
    DeviceRef device;
    std::string owner;
    std::string project;
    EnergyDistribution expected;  ///< still to come
    UseRates ahead;               ///< what a joule still to come emits and costs
    UseRates spent;               ///< the same over the current stretch so far
    std::optional<EnergyUse> so_far;  ///< the current stretch (since the start or the last resume)
    EnergyUse recorded;               ///< stretches already recorded at pauses: their sums
    std::optional<UnixMillis> stretch_start;
    bool paused = false;
  };
  // The budget's spent amount in [from, to], and the joules in it its unit could not count.
  std::pair<double, double> spent_in(std::size_t budget, UnixMillis from, UnixMillis to) const;
  static bool counts(const EnergyBudget& budget, const EnergyUse& use) {
    return budget.counts_work_of(use.owner, use.project) && budget.scope.covers(use.device);
  }
  static bool counts(const EnergyBudget& budget, const Running& running) {
    return budget.counts_work_of(running.owner, running.project) && budget.scope.covers(running.device);
  }
  /// Calls `visit` with every recorded use the budget covers, oldest first.
  template <class Visit>
  void for_each_covered(std::size_t budget, Visit&& visit) const;

  int utc_offset_minutes_ = 0;
  std::uint64_t revision_ = 0;
  std::vector<EnergyBudget> budgets_;
  std::deque<EnergyUse> uses_;  // in the order recorded
  /// Each device's ("node/name") latest use, by number: short uses of one minute merge into it.
  std::unordered_map<std::string, std::uint64_t> last_use_;
  // Per budget, the numbers of the uses it covers (use n is uses_[n - first_use_]): a budget
  // reads only its own uses, and the scope test runs once per use, when it is recorded.
  std::vector<std::deque<std::uint64_t>> covered_;
  std::uint64_t first_use_ = 0;
  std::unordered_map<std::string, Running> jobs_;
};

}  // namespace joule::schedulers
