#include "joule/schedulers/placement.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace joule::schedulers {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

std::string joules_text(double joules) {
  const double magnitude = std::abs(joules);
  if (magnitude >= 1e9) return fmt::format("{:.3g} GJ", joules / 1e9);
  if (magnitude >= 1e6) return fmt::format("{:.3g} MJ", joules / 1e6);
  if (magnitude >= 1e3) return fmt::format("{:.3g} kJ", joules / 1e3);
  return fmt::format("{:.3g} J", joules);
}

// Which reason to show when no device is feasible: the one a user can act on first.
int precedence(WaitReason::Kind kind) {
  switch (kind) {
    case WaitReason::Kind::budget:
      return 0;
    case WaitReason::Kind::max_energy:
      return 1;
    case WaitReason::Kind::battery_floor:
      return 2;
    case WaitReason::Kind::power_cap:
      return 3;
    case WaitReason::Kind::no_estimate:
      return 4;
    case WaitReason::Kind::deadline:
      return 5;
    case WaitReason::Kind::device_busy:
    case WaitReason::Kind::no_free_device:
    case WaitReason::Kind::cleaner_window:
    case WaitReason::Kind::not_before:
    case WaitReason::Kind::quota:
      return 6;
    case WaitReason::Kind::unavailable:
      return 7;
    case WaitReason::Kind::behind:
      return 8;
  }
  return 9;
}

// Cantelli's bound, P(X - mean >= t) <= var / (var + t^2), holds for any distribution: when it is
// already below the risk the log-normal need not be evaluated.
bool surely_within(const EnergyDistribution& energy, double limit, double risk) {
  const double t = limit - energy.mean_joules;
  return t > 0.0 && energy.variance / (energy.variance + t * t) < risk;
}

bool waits_for_best(Objective objective) {
  return objective == Objective::min_energy || objective == Objective::min_edp ||
         objective == Objective::earliest_finish || objective == Objective::flops_greedy ||
         objective == Objective::min_carbon || objective == Objective::min_cost;
}

// When `signal` next falls below its value at `now`; nullopt if it never does.
std::optional<UnixMillis> falls_after(const GridSignal& signal, UnixMillis now) {
  const double value = signal.mean_extended(now, now + 1);
  for (const auto& point : signal.points())
    if (point.at > now && point.value < value) return point.at;
  return std::nullopt;
}

// The lowest rate a joule on `device` is ever counted at in `unit` (the signal's lowest value);
// nullopt without the signal.
std::optional<double> lowest_rate(const DeviceStatus& device, BudgetUnit unit) {
  if (unit == BudgetUnit::joules) return 1.0;
  const GridSignal* signal = unit == BudgetUnit::grams ? device.carbon : device.price;
  if (!signal) return std::nullopt;
  double lowest = signal->points().front().value;
  for (const auto& point : signal->points()) lowest = std::min(lowest, point.value);
  return lowest / 3.6e6;
}

// The signal a deferring objective times jobs by: min-carbon's carbon, min-cost's price.
const GridSignal* timing_signal(Objective objective, const DeviceStatus& device) {
  if (objective == Objective::min_carbon) return device.carbon;
  if (objective == Objective::min_cost) return device.price;
  return nullptr;
}

// The state a pass keeps of each device while it hands out work.
struct DeviceView {
  bool free = false;             // some job could start on it: accepts work, not held whole, a core left
  int cores = 0;                 // DeviceStatus::cores: shared among jobs asking for cores; 0: one job
  int cores_held = 0;            // of those, held, with this pass's placements
  // A job earlier in the queue waits for this shared device's cores, expected to start then:
  // later jobs may take cores now only if they are expected to end by then (backfilling), so a
  // job that asks for many cores, or for the whole device, is not passed by small ones forever.
  std::optional<UnixMillis> held_for;
  UnixMillis available_at = 0;   // when a newly placed job could start
  double assigned_seconds = 0.0;  // least-loaded: work handed out in this pass
  std::vector<std::size_t> budgets;  // budgets covering it
  std::vector<std::size_t> caps;
  std::vector<std::size_t> floors;
  // min-carbon: the runs this pass deferred to it, [start, end): later jobs look for their
  // window around them, so that two jobs waiting for one clean hour do not both count on it.
  std::vector<std::pair<UnixMillis, UnixMillis>> deferred;
};

// A job waits for the shared device's cores from its expected start: later jobs backfill only
// what ends by then.
// A job on several GPUs likewise holds the free ones among them from `from`, when the last of
// them is expected free.
void hold_for_waiting(DeviceView& view, std::optional<UnixMillis> from = std::nullopt) {
  const UnixMillis start = from.value_or(view.available_at);
  view.held_for = std::min(view.held_for.value_or(start), start);
}

// Whether a job asking for `job_cores` (0: the whole device) could start on it now, in this pass.
bool fits_now(const DeviceView& view, int job_cores) {
  if (!view.free) return false;
  if (view.cores > 0 && job_cores > 0) return view.cores_held + job_cores <= view.cores;
  return view.cores_held == 0;
}

// A job asking for GPUs: its candidates' devices that accept work, by group, in their order.
using Gangs = std::unordered_map<std::string_view, std::vector<std::size_t>>;
Gangs gangs_of(const PendingJob& job, std::span<const DeviceStatus> devices) {
  Gangs gangs;
  for (const Candidate& candidate : job.candidates) {
    const DeviceStatus& device = devices[candidate.device];
    if (device.accepts_work && !device.group.empty()) gangs[device.group].push_back(candidate.device);
  }
  return gangs;
}

// Why a job asking for GPUs can never run with `device` as the first of them: it is no GPU, or
// its group has fewer the job may run on than it asks for. nullopt: it can.
std::optional<WaitReason> gang_problem(const PendingJob& job, const DeviceStatus& device, const Gangs& gangs) {
  const std::string where = device.ref.qualified();
  if (device.group.empty())
    return WaitReason{WaitReason::Kind::unavailable,
                      fmt::format("it asks for {} GPU{}; {} is not a GPU that can be held for it (a CPU, or another "
                                  "node's GPU: jobs that ask for GPUs run on the node they are submitted to)",
                                  job.gpus, job.gpus == 1 ? "" : "s", where),
                      where};
  const auto it = gangs.find(device.group);
  if (it != gangs.end() && it->second.size() >= static_cast<std::size_t>(job.gpus)) return std::nullopt;
  std::string_view largest;
  std::size_t most = 0;
  for (const auto& [group, members] : gangs)
    if (members.size() > most || (members.size() == most && group < largest)) {
      largest = group;
      most = members.size();
    }
  return WaitReason{
      WaitReason::Kind::unavailable,
      fmt::format("it asks for {} GPUs of one kind on one node; {} has {} it may run on", job.gpus, largest, most),
      where};
}

// The cleanest start in [earliest, latest] for a run of `run_ms` that overlaps none of
// `taken`: the signal's lowest_start over each gap between them.
std::optional<SignalWindow> lowest_start_around(const GridSignal& signal, UnixMillis earliest, UnixMillis latest,
                                                UnixMillis run_ms,
                                                std::vector<std::pair<UnixMillis, UnixMillis>> taken) {
  std::sort(taken.begin(), taken.end());
  std::optional<SignalWindow> best;
  UnixMillis from = earliest;
  auto consider = [&](UnixMillis to) {
    if (to < from) return;
    if (auto window = signal.lowest_start(from, to, run_ms); window && (!best || window->mean < best->mean))
      best = window;
  };
  for (const auto& [start, end] : taken) {
    consider(std::min(latest, start - run_ms));  // ends by the time the taken run starts
    from = std::max(from, end);
  }
  consider(latest);
  return best;
}

struct CapView {
  double watts = 0.0;  // metered average of the scope, plus what the pass added
  bool has_work = false;
};

UnixMillis finish_after(UnixMillis start, double seconds) {
  return start + static_cast<UnixMillis>(std::llround(seconds * 1000.0));
}

// The setting `knobs` prefers for the job on this candidate started at `start`, or nullptr for
// the device's defaults (preferred_setting), keeping a deadline the defaults keep.
const SettingOption* choose_setting(const KnobPolicy& knobs, double risk, const PendingJob& job,
                                    const Candidate& candidate, UnixMillis start) {
  if (knobs.goal == KnobGoal::off || candidate.settings.empty() || !candidate.estimate) return nullptr;
  const Estimate& base = *candidate.estimate;
  const std::optional<double> max_slowdown = job.max_slowdown ? job.max_slowdown : knobs.max_slowdown;
  const bool deadline_holds = !job.deadline || finish_after(start, base.seconds_mean) <= *job.deadline;
  return preferred_setting(knobs, risk, max_slowdown, base, candidate.settings, [&](const SettingOption& option) {
    return !(deadline_holds && job.deadline && finish_after(start, option.estimate.seconds_mean) > *job.deadline);
  });
}

}  // namespace

const SettingOption* preferred_setting(const KnobPolicy& knobs, double risk, std::optional<double> max_slowdown,
                                       const Estimate& base, const std::vector<SettingOption>& settings,
                                       const std::function<bool(const SettingOption&)>& allowed) {
  if (knobs.goal == KnobGoal::off || settings.empty()) return nullptr;
  if (base.joules_mean <= 0.0 || base.seconds_mean <= 0.0) return nullptr;
  auto cost = [&](const Estimate& at) {
    const double energy = at.joules_mean / base.joules_mean;
    const double time = at.seconds_mean / base.seconds_mean;
    switch (knobs.goal) {
      case KnobGoal::zeus:
        return knobs.eta * energy + (1.0 - knobs.eta) * time;
      case KnobGoal::min_edp:
        return energy * time;
      default:
        return energy;
    }
  };
  const SettingOption* best = nullptr;
  double best_cost = cost(base);
  for (const SettingOption& option : settings) {
    // The slowdown it could have at the policy's risk, as budgets are held: a mispredicted
    // response must not make a job slower than it allowed more often than that.
    double time_ratio = option.estimate.seconds_mean / base.seconds_mean;
    if (option.slowdown_log_std > 0.0)
      time_ratio = quantile_above(EnergyDistribution::from_std(time_ratio, time_ratio * option.slowdown_log_std), risk);
    if (max_slowdown && time_ratio - 1.0 > *max_slowdown) continue;
    // A saving the readings cannot tell from their noise does not change the device's settings.
    if (option.saving_log_std > 0.0) {
      const double energy_ratio = option.estimate.joules_mean / base.joules_mean;
      if (quantile_above(EnergyDistribution::from_std(energy_ratio, energy_ratio * option.saving_log_std), risk) >= 1.0)
        continue;
    }
    if (allowed && !allowed(option)) continue;
    if (const double c = cost(option.estimate); c < best_cost) {
      best = &option;
      best_cost = c;
    }
  }
  return best;
}

bool walks_cheapest_first(Objective objective) {
  return objective == Objective::min_energy || objective == Objective::flops_greedy;
}

double score_floor(const Candidate& candidate, Objective objective) {
  // A NaN score never wins (no comparison with it holds): it sorts last, as infinity does.
  auto finite_or_last = [](double joules) { return std::isnan(joules) ? kInfinity : joules; };
  if (objective == Objective::flops_greedy) return finite_or_last(candidate.flops_joules.value_or(kInfinity));
  double floor = candidate.estimate ? finite_or_last(candidate.estimate->joules_mean) : kInfinity;
  for (const SettingOption& setting : candidate.settings)
    floor = std::min(floor, finite_or_last(setting.estimate.joules_mean));
  return floor;
}

void order_candidates(PendingJob& job, Objective objective) {
  CandidateOrder& order = job.order;
  order = CandidateOrder{objective, {}, 0.0};
  if (!walks_cheapest_first(objective)) return;
  std::vector<std::pair<double, std::uint32_t>> keyed;
  keyed.reserve(job.candidates.size());
  for (std::uint32_t i = 0; i < job.candidates.size(); ++i) {
    const Candidate& candidate = job.candidates[i];
    keyed.emplace_back(score_floor(candidate, objective), i);
    if (candidate.estimate) order.widest_std = std::max(order.widest_std, candidate.estimate->joules_std);
    for (const SettingOption& setting : candidate.settings)
      order.widest_std = std::max(order.widest_std, setting.estimate.joules_std);
  }
  std::sort(keyed.begin(), keyed.end());  // equal floors keep the candidates' own order
  order.by_device = std::adjacent_find(job.candidates.begin(), job.candidates.end(), [](const auto& a, const auto& b) {
                      return a.device >= b.device;
                    }) == job.candidates.end();
  order.cheapest_first.reserve(keyed.size());
  for (const auto& [floor, index] : keyed) order.cheapest_first.push_back(index);
}

std::string_view to_string(WaitReason::Kind kind) {
  static constexpr std::array<std::string_view, 13> names{
      "behind",   "device-busy", "no-free-device", "budget",         "max-energy", "power-cap", "battery-floor",
      "deadline", "no-estimate", "unavailable",    "cleaner-window", "not-before", "quota"};
  return names[static_cast<std::size_t>(kind)];
}

Placer::Placer(Policy policy, PlacementOptions options) : policy_(std::move(policy)), options_(options) {}

void Placer::set_policy(Policy policy) { policy_ = std::move(policy); }

UseRates rates_over(const DeviceStatus& device, UnixMillis from, UnixMillis to) {
  UseRates rates;
  auto mean = [&](const GridSignal& signal) {
    return (to > from ? signal.mean_extended(from, to) : signal.mean_extended(from, from + 1)) / 3.6e6;
  };
  if (device.carbon) rates.grams_per_joule = mean(*device.carbon);
  if (device.price) rates.cost_per_joule = mean(*device.price);
  return rates;
}

bool DeviceStatus::fits_now(int job_cores) const {
  if (!accepts_work || busy) return false;
  if (shares_cores_with(job_cores)) return cores_held + job_cores <= cores;
  return cores_held == 0;
}

void DeviceStatus::hold(int job_cores) {
  if (shares_cores_with(job_cores))
    cores_held += job_cores;
  else
    busy = true;
}

struct PassState::Data {
  std::vector<BudgetState> budgets;
  std::vector<DeviceView> views;
  std::vector<CapView> caps;
  std::size_t free_devices = 0;
  std::vector<std::size_t> free_list;  // the devices free in this pass, in order
  std::size_t explained = 0;           // jobs looked at once no device was free
  std::size_t considered = 0;
  bool limits_running = false;  // the policy limits running jobs: `running` is counted
  RunningByTenant running;      // as given at `begin`, plus the jobs this pass placed
};

PassState::PassState() = default;
PassState::~PassState() = default;
PassState::PassState(PassState&&) noexcept = default;
PassState& PassState::operator=(PassState&&) noexcept = default;

PassResult Placer::decide(UnixMillis now, std::span<const DeviceStatus> devices,
                          std::span<const PendingJob* const> queue, const BudgetLedger& ledger) {
  PassState state = begin(now, devices, ledger);
  return extend(state, now, devices, queue, ledger);
}

PassState Placer::begin(UnixMillis now, std::span<const DeviceStatus> devices, const BudgetLedger& ledger,
                        const RunningByTenant& running) const {
  PassState pass;
  pass.data_ = std::make_unique<PassState::Data>();
  PassState::Data& state = *pass.data_;
  state.limits_running = policy_.tenancy.limits_running();
  if (state.limits_running) state.running = running;
  std::vector<BudgetState>& budgets = state.budgets;
  budgets = ledger.states(now);
  state.views.resize(devices.size());
  state.caps.resize(policy_.power_caps.size());
  for (std::size_t d = 0; d < devices.size(); ++d) {
    const DeviceStatus& device = devices[d];
    DeviceView& view = state.views[d];
    view.free = device.takes_work();
    view.cores = device.cores;
    view.cores_held = device.cores_held;
    state.free_devices += view.free ? 1 : 0;
    if (view.free) state.free_list.push_back(d);
    const bool held = device.busy || device.cores_held > 0;
    view.available_at = held ? std::max(now, device.busy_until.value_or(now)) : now;
    for (std::size_t b = 0; b < budgets.size(); ++b)
      if (budgets[b].budget.scope.covers(device.ref)) view.budgets.push_back(b);
    for (std::size_t c = 0; c < policy_.power_caps.size(); ++c) {
      if (!policy_.power_caps[c].scope.covers(device.ref)) continue;
      view.caps.push_back(c);
      state.caps[c].watts += device.average_power_watts;
      state.caps[c].has_work = state.caps[c].has_work || device.busy || device.cores_held > 0;
    }
    for (std::size_t f = 0; f < policy_.battery_floors.size(); ++f)
      if (policy_.battery_floors[f].scope.covers(device.ref)) view.floors.push_back(f);
  }
  return pass;
}

PassResult Placer::extend(PassState& pass, UnixMillis now, std::span<const DeviceStatus> devices,
                          std::span<const PendingJob* const> queue, const BudgetLedger& ledger) {
  PassResult result;
  PassState::Data& state = *pass.data_;
  std::vector<BudgetState>& budgets = state.budgets;
  std::vector<DeviceView>& views = state.views;
  std::vector<CapView>& caps = state.caps;
  std::size_t& free_devices = state.free_devices;
  std::vector<std::size_t>& free_list = state.free_list;
  const Objective objective = policy_.objective;
  const bool admission = policy_.admission;
  for (const PendingJob* job : queue) {
    if (state.considered >= options_.max_scan) break;
    if (free_devices == 0 && state.explained++ >= options_.max_explain) break;
    ++state.considered;
    ++result.considered;
    if (job->not_before && now < *job->not_before) {
      // Held by its owner until then: no device is considered or reserved for it.
      WaitReason why{WaitReason::Kind::not_before,
                     fmt::format("not before {}, as it asked", format_rfc3339(*job->not_before))};
      why.retry_at = *job->not_before;
      result.next_retry = std::min(result.next_retry.value_or(*job->not_before), *job->not_before);
      result.waiting.emplace_back(job->id, std::move(why));
      continue;
    }
    if (state.limits_running)
      if (auto held = quota_hold(*job, state.running)) {
        // Its owner or project runs all it may: no device is considered or reserved for it; a
        // job of theirs that ends (an event, so a pass) frees the slot.
        result.waiting.emplace_back(job->id, std::move(*held));
        continue;
      }

    // A job on several GPUs: the N - 1 others it would hold beside the first (those free
    // soonest, free ones first), when they all are, and whether that is now.
    const Gangs gangs = job->gpus > 0 ? gangs_of(*job, devices) : Gangs{};
    struct Gang {
      std::vector<std::size_t> others;
      UnixMillis ready = 0;
      bool now = true;
    };
    auto gang_beside = [&](std::size_t first, const std::optional<Estimate>& estimate) {
      Gang gang;
      if (job->gpus <= 1) return gang;
      const auto it = gangs.find(devices[first].group);
      std::vector<std::tuple<UnixMillis, bool, std::size_t>> order;  // (free at, not free now, device)
      if (it != gangs.end())
        for (const std::size_t m : it->second)
          if (m != first) {
            // One held for a job waiting before this one is free only to a run that ends by then.
            const bool free =
                fits_now(views[m], 0) &&
                (!views[m].held_for || (estimate && finish_after(now, estimate->seconds_mean) <= *views[m].held_for));
            order.emplace_back(free ? now : std::max(now, views[m].available_at), !free, m);
          }
      const auto wanted = static_cast<std::size_t>(job->gpus - 1);
      gang.now = order.size() >= wanted;
      const std::size_t take = std::min(wanted, order.size());
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(take), order.end());
      for (std::size_t i = 0; i < take; ++i) {
        gang.others.push_back(std::get<2>(order[i]));
        gang.ready = std::max(gang.ready, std::get<0>(order[i]));
        gang.now = gang.now && !std::get<1>(order[i]);
      }
      return gang;
    };

    std::optional<WaitReason> reason;
    // Whether a reason of this kind could replace the one noted (so it is worth formatting).
    auto wants = [&](WaitReason::Kind kind) { return !reason || precedence(kind) <= precedence(reason->kind); };
    // A budget reason's retry time is worked out once, after the devices, for the budget and
    // deficit of the reason kept (frees_by scans the ledger).
    std::size_t budget_index = 0;
    const GridSignal* budget_signal = nullptr;  // the signal a grams or money budget reason counts at
    double budget_deficit = 0.0;
    // The first reason of the kind that ranks highest is kept (budget reasons are set below).
    auto note_reason = [&](WaitReason candidate) {
      if (!reason || precedence(candidate.kind) < precedence(reason->kind)) reason = std::move(candidate);
    };

    struct Choice {
      const Candidate* candidate = nullptr;
      std::optional<Estimate> estimate;
      double score = kInfinity;
      double tie = kInfinity;
      UnixMillis finish = 0;
      const SettingOption* setting = nullptr;
      UnixMillis run_start = 0;  // min-carbon, min-cost: when it would start (later than now: a better window)
      double signal = 0.0;       // min-carbon, min-cost: the signal's mean over its run
      double signal_now = 0.0;   // the same if it started as soon as it could
      std::size_t index = 0;     // in job->candidates: equal scores and finishes go to the first
    };
    Choice best;          // feasible
    Choice best_free;     // feasible and free now
    Choice late;          // feasible but for the deadline: used when no device can meet it
    std::size_t eligible = 0;
    // Baselines: the shared devices it could not start on now, held for it if it waits for one;
    // for a job on several GPUs, the first GPU it could not start on (its others held with it).
    std::vector<std::size_t> short_of_cores;
    const Candidate* short_of_gpus = nullptr;
    // Whether (score, tie, index) beats the slot's choice.
    auto better = [](const Choice& slot, double score, double tie, std::size_t index) {
      return score < slot.score ||
             (score == slot.score && (tie < slot.tie || (slot.candidate && tie == slot.tie && index < slot.index)));
    };

    // Whether the job could start on the candidate's device now: it fits, and it ends before an
    // earlier job that waits for the device's cores is expected to start (without an estimate
    // it cannot say, so it waits too).
    // The cores a candidate holds: its own count, else the job's.
    auto cores_of = [&](const Candidate& candidate) { return candidate.cores > 0 ? candidate.cores : job->cores; };
    auto starts_now = [&](const Candidate& candidate) {
      const DeviceView& view = views[candidate.device];
      if (!fits_now(view, cores_of(candidate))) return false;
      if (job->gpus > 1 && !gang_beside(candidate.device, candidate.estimate).now) return false;
      if (!view.held_for) return true;
      return candidate.estimate && finish_after(now, candidate.estimate->seconds_mean) <= *view.held_for;
    };

    auto consider = [&](std::size_t index) {
      const Candidate& candidate = job->candidates[index];
      ++result.weighed;
      const DeviceStatus& device = devices[candidate.device];
      DeviceView& view = views[candidate.device];
      auto where = [&] { return device.ref.qualified(); };
      if (!device.accepts_work) {
        if (wants(WaitReason::Kind::unavailable))
          note_reason({WaitReason::Kind::unavailable, fmt::format("{} accepts no work now", where()), where()});
        return;
      }
      if (job->gpus > 0)
        if (auto why = gang_problem(*job, device, gangs)) {
          if (wants(WaitReason::Kind::unavailable)) note_reason(std::move(*why));
          return;
        }
      if (view.cores > 0 && cores_of(candidate) > view.cores) {
        if (wants(WaitReason::Kind::unavailable))
          note_reason({WaitReason::Kind::unavailable,
                       fmt::format("it asks for {} cores; {} shares {}", cores_of(candidate), where(), view.cores),
                       where()});
        return;
      }
      ++eligible;
      const bool free_now = starts_now(candidate);
      const bool baseline = !waits_for_best(objective);
      if (baseline && !free_now) {
        if (wants(WaitReason::Kind::no_free_device))
          note_reason({WaitReason::Kind::no_free_device, "every eligible device is busy", where()});
        if (view.cores > 0) short_of_cores.push_back(candidate.device);
        if (job->gpus > 1 && !short_of_gpus) short_of_gpus = &candidate;
        return;
      }

      // max: a pass continued later than it began may find a device's expected end passed.
      UnixMillis start = free_now ? now : std::max(now, view.available_at);
      if (!free_now && job->gpus > 1) start = std::max(start, gang_beside(candidate.device, candidate.estimate).ready);
      // The setting the knob goal prefers here (nullptr: the defaults); what follows is
      // judged at it: energy, budgets, power, finish.
      const SettingOption* setting =
          uses_estimates(objective) ? choose_setting(policy_.knobs, policy_.risk, *job, candidate, start) : nullptr;
      const std::optional<Estimate> modelled =
          setting ? std::optional<Estimate>(setting->estimate) : candidate.estimate;
      std::optional<Estimate> estimate = modelled;
      if (objective == Objective::flops_greedy) {
        if (candidate.flops_joules)
          estimate = Estimate{*candidate.flops_joules, 0.0, candidate.estimate ? candidate.estimate->seconds_mean : 0.0};
        else
          estimate.reset();
      }
      // min-carbon, min-cost: the start in [start, deadline - run] with the cleanest or cheapest
      // run on this device's grid; a job without a deadline is not deferred.
      UnixMillis run_start = start;
      double signal = 0.0, signal_now = 0.0;
      const GridSignal* timing = timing_signal(objective, device);
      if (timing && estimate) {
        const auto run_ms = static_cast<UnixMillis>(std::llround(estimate->seconds_mean * 1000.0));
        signal = signal_now = timing->mean_extended(start, start + run_ms);
        // A deferred job must still meet its deadline if it runs long: its run at the policy's
        // risk, its time taken as unsure as its energy (the estimate's relative spread).
        const double relative = estimate->joules_mean > 0 ? estimate->joules_std / estimate->joules_mean : 0.0;
        const double long_seconds =
            relative > 0 ? quantile_above(
                               EnergyDistribution::from_std(estimate->seconds_mean, estimate->seconds_mean * relative),
                               policy_.risk)
                         : estimate->seconds_mean;
        const auto latest =
            job->deadline ? *job->deadline - static_cast<UnixMillis>(std::llround(long_seconds * 1000.0)) : start;
        if (latest > start) {
          const auto window = view.deferred.empty()
                                  ? timing->lowest_start(start, latest, run_ms)
                                  : lowest_start_around(*timing, start, latest, run_ms, view.deferred);
          if (window && window->mean < signal_now) {
            run_start = window->start;
            signal = window->mean;
          }
        }
      }
      const UnixMillis finish = estimate ? finish_after(run_start, estimate->seconds_mean) : run_start;
      // A candidate that cannot become the choice needs no feasibility check (budgets, caps,
      // floors: most of a pass's time on a thousand devices). Under min-energy its score is its
      // joules: one above the best so far, and, if free, above the best free one, is never
      // chosen; and the reasons to wait are shown only when nothing is chosen, which a feasible
      // best rules out. Equal scores are checked in full (the finish breaks the tie).
      if (walks_cheapest_first(objective) && estimate && best.candidate &&
          (!job->deadline || finish <= *job->deadline) && estimate->joules_mean > best.score &&
          (!free_now || estimate->joules_mean > best_free.score))
        return;

      std::optional<EnergyDistribution> energy;
      if (modelled)
        energy = modelled->energy();
      else if (job->max_energy_joules)
        energy = EnergyDistribution{*job->max_energy_joules, 0.0};

      bool feasible = true;
      if (modelled && job->max_energy_joules &&
          !surely_within(modelled->energy(), *job->max_energy_joules, policy_.risk) &&
          overrun_probability(modelled->energy(), *job->max_energy_joules) >= policy_.risk) {
        feasible = false;
        if (wants(WaitReason::Kind::max_energy)) {
          WaitReason why{WaitReason::Kind::max_energy,
                         fmt::format("on {} it would likely use more than its max_energy_joules ({} expected, "
                                     "limit {})",
                                     where(), joules_text(modelled->joules_mean), joules_text(*job->max_energy_joules)),
                         where()};
          why.limit = *job->max_energy_joules;
          note_reason(std::move(why));
        }
      }
      if (admission) {
        // Grams and money budgets count the job's joules at the signals over its run here
        // (worked out for the first such budget only: most policies have none).
        std::optional<UseRates> rates;
        for (const std::size_t b : view.budgets) {
          const BudgetState& state = budgets[b];
          if (!state.budget.counts_work_of(job->owner, job->project)) continue;
          if (!energy) {
            feasible = false;
            if (wants(WaitReason::Kind::no_estimate))
              note_reason({WaitReason::Kind::no_estimate,
                           fmt::format("budget {} covers {}, which has no energy model for this job yet (and the job "
                                       "sets no constraints.max_energy_joules)",
                                       state.budget.name, where()),
                           where(), state.budget.name});
            continue;
          }
          if (!rates && state.budget.unit != BudgetUnit::joules)
            rates = rates_over(device, run_start, finish_after(run_start, estimate ? estimate->seconds_mean : 0.0));
          const std::optional<double> rate = rates ? rates->of(state.budget.unit) : std::optional<double>(1.0);
          if (!rate) {
            feasible = false;
            if (wants(WaitReason::Kind::no_estimate))
              note_reason(
                  {WaitReason::Kind::no_estimate,
                   fmt::format("budget {} counts {} and {} has no {} signal to count this job's joules at",
                               state.budget.name, state.budget.unit == BudgetUnit::grams ? "grams CO2e" : "money",
                               where(), state.budget.unit == BudgetUnit::grams ? "carbon" : "price"),
                   where(), state.budget.name});
            continue;
          }
          const EnergyDistribution amount = energy->scaled(*rate);
          const double room = state.budget.limit - state.spent;
          const EnergyDistribution total = state.reserved + amount;
          if (surely_within(total, room, policy_.risk) || overrun_probability(total, room) < policy_.risk) continue;
          feasible = false;
          const double deficit = state.spent + quantile_above(total, policy_.risk) - state.budget.limit;
          // Among budget reasons, the one closest to fitting.
          if (reason && reason->kind == WaitReason::Kind::budget && deficit >= budget_deficit) continue;
          if (!wants(WaitReason::Kind::budget)) continue;
          const EnergyBudget& budget = state.budget;
          WaitReason why{WaitReason::Kind::budget, {}, where(), budget.name};
          why.limit = budget.limit;
          why.unit = budget.unit;
          why.remaining = state.remaining();
          why.needed = quantile_above(amount, policy_.risk);
          why.message = fmt::format(
              "budget {} ({}, {}): {} left of {} ({} spent, {} reserved); the job needs {} on {} at {:g}% risk",
              budget.name, budget.describe_scope(), budget.window.describe(),
              budget.amount_text(std::max(0.0, *why.remaining)), budget.amount_text(budget.limit),
              budget.amount_text(state.spent), budget.amount_text(state.reserved.mean_joules),
              budget.amount_text(*why.needed), where(), policy_.risk * 100.0);
          reason = std::move(why);  // a budget reason outranks every other kind
          budget_index = b;
          budget_signal = budget.unit == BudgetUnit::grams   ? device.carbon
                          : budget.unit == BudgetUnit::money ? device.price
                                                             : nullptr;
          budget_deficit = deficit;
        }
        const double job_watts =
            estimate && estimate->seconds_mean > 0 ? estimate->joules_mean / estimate->seconds_mean : 0.0;
        for (const std::size_t c : view.caps) {
          const PowerCap& cap = policy_.power_caps[c];
          const bool over = caps[c].watts >= cap.watts || (caps[c].has_work && caps[c].watts + job_watts > cap.watts);
          if (!over) continue;
          feasible = false;
          if (!wants(WaitReason::Kind::power_cap)) continue;
          WaitReason why{WaitReason::Kind::power_cap,
                         fmt::format("power cap {} ({}): {:.1f} W of {:.1f} W in use{}", cap.name, cap.scope.describe(),
                                     caps[c].watts, cap.watts,
                                     job_watts > 0 ? fmt::format("; the job adds about {:.1f} W", job_watts) : ""),
                         where(), cap.name};
          why.limit = cap.watts;
          note_reason(std::move(why));
        }
        for (const std::size_t f : view.floors) {
          const BatteryFloor& floor = policy_.battery_floors[f];
          if (!device.battery_percent) continue;
          const double percent = *device.battery_percent;
          bool low = percent <= floor.percent;
          if (!low && energy && device.battery_capacity_joules) {
            const double headroom = (percent - floor.percent) / 100.0 * *device.battery_capacity_joules;
            low = overrun_probability(*energy, headroom) >= policy_.risk;
          }
          if (!low) continue;
          feasible = false;
          if (!wants(WaitReason::Kind::battery_floor)) continue;
          WaitReason why{WaitReason::Kind::battery_floor,
                         fmt::format("battery floor {} ({}): {:.0f}% charge, floor {:.0f}%{}", floor.name,
                                     floor.scope.describe(), percent, floor.percent,
                                     percent > floor.percent ? "; the job would take it below" : ""),
                         where(), floor.name};
          why.limit = floor.percent;
          note_reason(std::move(why));
        }
      }
      if (!feasible) return;

      double score = 0.0;
      double tie = static_cast<double>(finish);
      switch (objective) {
        case Objective::min_energy:
        case Objective::flops_greedy:
          score = estimate ? estimate->joules_mean : kInfinity;
          break;
        case Objective::min_carbon:
        case Objective::min_cost:
          // Grams CO2e or money. A device whose grid is unknown ranks after every known one;
          // among those (no signal at all) the fewest joules win, as min-energy.
          score = estimate ? (timing ? estimate->joules_mean / 3.6e6 * signal : kInfinity) : kInfinity;
          tie = estimate ? estimate->joules_mean : kInfinity;
          break;
        case Objective::min_edp:
          score = estimate ? estimate->joules_mean * static_cast<double>(finish - now) / 1000.0 : kInfinity;
          break;
        case Objective::earliest_finish:
          score = estimate ? static_cast<double>(finish) : kInfinity;
          tie = estimate ? estimate->joules_mean : kInfinity;
          break;
        case Objective::fifo:
          score = static_cast<double>(candidate.device);
          break;
        case Objective::round_robin:
          score = static_cast<double>((candidate.device + devices.size() - round_robin_next_ % devices.size()) %
                                      devices.size());
          break;
        case Objective::least_loaded:
          score = device.work_seconds + view.assigned_seconds;
          tie = static_cast<double>(candidate.device);
          break;
      }
      const bool meets_deadline = !job->deadline || !estimate || finish <= *job->deadline;
      Choice& slot = meets_deadline ? best : late;
      const double slot_score = meets_deadline ? score : static_cast<double>(finish);
      if (better(slot, slot_score, tie, index))
        slot = Choice{&candidate, estimate, slot_score, tie, finish, setting, run_start, signal, signal_now, index};
      if (meets_deadline && free_now && better(best_free, score, tie, index))
        best_free = Choice{&candidate, estimate, score, tie, finish, setting, run_start, signal, signal_now, index};
      if (!meets_deadline && wants(WaitReason::Kind::deadline)) {
        WaitReason why{WaitReason::Kind::deadline,
                       fmt::format("on {} it would finish at {}, after its deadline {}", where(), format_rfc3339(finish),
                                   format_rfc3339(*job->deadline)),
                       where()};
        note_reason(std::move(why));
      }
    };

    const CandidateOrder& order = job->order;
    const bool ordered = walks_cheapest_first(objective) && order.objective == objective &&
                         order.cheapest_first.size() == job->candidates.size();
    if (ordered) {
      // Cheapest first: once a candidate's floor is above the best (a busy device), no later
      // one can be chosen; only a free one may still replace it, if it is within the spread
      // min-energy forgives, or cheaper than the best free one found.
      const std::vector<Candidate>& candidates = job->candidates;
      auto free_bound = [&] {
        if (best_free.candidate) return best_free.score;
        const double forgiven = objective == Objective::min_energy && best.estimate
                                    ? std::hypot(best.estimate->joules_std, order.widest_std)
                                    : 0.0;
        return best.score + forgiven;
      };
      std::size_t position = 0;
      double from_floor = kInfinity;
      for (; position < order.cheapest_first.size(); ++position) {
        const std::uint32_t index = order.cheapest_first[position];
        if (best.candidate) {
          // Without estimates every score is infinite and a run finishes as it starts: a device
          // free now is the earliest, and the candidates after it come later in their order.
          if (std::isinf(best.score) && best.finish <= now && starts_now(*best.candidate)) break;
          from_floor = score_floor(candidates[index], objective);
          if (from_floor > best.score) break;
        }
        consider(index);
      }
      if (position < order.cheapest_first.size() && !starts_now(*best.candidate)) {
        // The rest, (floor, index) at or after where the walk stopped: only free devices count.
        const std::uint32_t from = order.cheapest_first[position];
        auto in_rest = [&](std::uint32_t index, double floor) {
          return floor > from_floor || (floor == from_floor && index >= from);
        };
        // A few free devices among many candidates: find each one's candidate. Many free: walk
        // on cheapest first, which stops at the first floor beyond what a free one could win.
        if (order.by_device && free_list.size() * 16 < candidates.size()) {
          for (const std::size_t d : free_list) {
            const auto it = std::lower_bound(candidates.begin(), candidates.end(), d,
                                             [](const Candidate& c, std::size_t device) { return c.device < device; });
            if (it == candidates.end() || it->device != d) continue;
            const auto index = static_cast<std::uint32_t>(it - candidates.begin());
            const double floor = score_floor(*it, objective);
            if (in_rest(index, floor) && floor <= free_bound()) consider(index);
          }
        } else {
          for (; position < order.cheapest_first.size(); ++position) {
            const std::uint32_t index = order.cheapest_first[position];
            if (score_floor(candidates[index], objective) > free_bound()) break;
            if (starts_now(candidates[index])) consider(index);
          }
        }
      }
      // Nothing can run: walk them again in their own order, so the reason shown is the one
      // the unordered walk gives (the first of the kind that ranks highest).
      if (!best.candidate && !late.candidate) {
        reason.reset();
        budget_index = 0;
        budget_signal = nullptr;
        budget_deficit = 0.0;
        best_free = Choice{};
        eligible = 0;
        short_of_cores.clear();
        short_of_gpus = nullptr;
        for (std::size_t index = 0; index < job->candidates.size(); ++index) consider(index);
      }
    } else {
      for (std::size_t index = 0; index < job->candidates.size(); ++index) consider(index);
    }

    // Waiting for a busy device is worth it only if it is cheaper beyond what the estimates can
    // tell apart (1 sigma of the difference): otherwise take the free one now.
    if (objective == Objective::min_energy && best.candidate && best_free.candidate &&
        best.candidate != best_free.candidate && !starts_now(*best.candidate) && best.estimate && best_free.estimate) {
      const double spread = std::hypot(best.estimate->joules_std, best_free.estimate->joules_std);
      if (best_free.score - best.score <= spread) best = best_free;
    }
    // Where the objective cannot tell them apart (no estimates, equal scores), a free device
    // beats waiting for a busy one.
    if (best.candidate && best_free.candidate && best.candidate != best_free.candidate &&
        !starts_now(*best.candidate) && best_free.score <= best.score)
      best = best_free;
    bool misses_deadline = false;
    if (!best.candidate && late.candidate) {
      // No device can meet the deadline any more: a late result beats none, so take the
      // earliest finish and say so.
      best = late;
      misses_deadline = true;
    }
    if (!best.candidate) {
      // A budget reason's retry time only now that it is the one shown (frees_by scans the ledger).
      if (reason && reason->kind == WaitReason::Kind::budget) {
        reason->retry_at = ledger.frees_by(budgets[budget_index], budget_deficit, now);
        // Grams and money: a cleaner or cheaper hour counts the same joules for less.
        const std::optional<UnixMillis> falls = budget_signal ? falls_after(*budget_signal, now) : std::nullopt;
        if (reason->retry_at)
          reason->message += fmt::format("; fits again at {}", format_rfc3339(*reason->retry_at));
        else if (falls)
          reason->message +=
              fmt::format("; the {} signal falls at {}, when it may fit",
                          reason->unit == BudgetUnit::grams ? "carbon" : "price", format_rfc3339(*falls));
        else
          reason->message += "; waiting alone will not free enough";
        if (!reason->retry_at) reason->retry_at = falls;
      }
      if (!reason) reason = WaitReason{WaitReason::Kind::unavailable, "no eligible device", {}};
      if (eligible == 0 && reason->kind != WaitReason::Kind::unavailable) reason->kind = WaitReason::Kind::unavailable;
      if (reason->retry_at) result.next_retry = std::min(result.next_retry.value_or(*reason->retry_at), *reason->retry_at);
      // A baseline keeps queue order on shared devices too: later jobs take cores it waits for
      // only if they end before it can start (as for the objectives that wait for a device).
      if (reason->kind == WaitReason::Kind::no_free_device) {
        for (const std::size_t d : short_of_cores) hold_for_waiting(views[d]);
        // Its GPUs likewise, from when the last of them is expected free: a stream of one-GPU
        // jobs does not keep it waiting for ever.
        if (short_of_gpus) {
          const std::size_t d = short_of_gpus->device;
          const Gang gang = gang_beside(d, short_of_gpus->estimate);
          const UnixMillis free_at = std::max({now, fits_now(views[d], 0) ? now : views[d].available_at, gang.ready});
          for (const std::size_t m : gang.others) hold_for_waiting(views[m], free_at);
          hold_for_waiting(views[d], free_at);
        }
      }
      result.waiting.emplace_back(job->id, std::move(*reason));
      continue;
    }

    const std::size_t d = best.candidate->device;
    DeviceView& view = views[d];
    const std::string where = devices[d].ref.qualified();
    const double seconds = best.estimate ? best.estimate->seconds_mean : 0.0;
    const Gang gang = gang_beside(d, best.candidate->estimate);
    if (!starts_now(*best.candidate)) {
      const std::string wanted = view.cores > 0 && cores_of(*best.candidate) > 0
                                     ? fmt::format("{} of {}'s cores ({} of {} held)", cores_of(*best.candidate), where,
                                                   view.cores_held, view.cores)
                                 : job->gpus > 1
                                     ? fmt::format("{} GPUs of {}, {} first", job->gpus, devices[d].group, where)
                                     : where;
      const UnixMillis free_at = std::max(view.available_at, gang.ready);
      WaitReason why{
          WaitReason::Kind::device_busy,
          fmt::format("waiting for {}, the best device by {}{}; expected free at {}", wanted, to_string(objective),
                      best.estimate ? fmt::format(" ({} expected)", joules_text(best.estimate->joules_mean)) : "",
                      format_rfc3339(free_at)),
          where};
      why.retry_at = free_at;
      if (view.cores > 0) hold_for_waiting(view);
      view.available_at = best.finish;
      // Its GPUs free before then are held for it: later jobs take them only if they end by then.
      for (const std::size_t m : gang.others) {
        hold_for_waiting(views[m], free_at);
        views[m].available_at = std::max(views[m].available_at, best.finish);
      }
      if (!gang.others.empty()) hold_for_waiting(view, free_at);
      result.waiting.emplace_back(job->id, std::move(why));
      continue;
    }

    if (timing_signal(objective, devices[d]) && best.run_start > now) {
      // Free now, but a cleaner or cheaper window comes before its deadline: the device stays
      // free for others meanwhile; the pass runs again when the window opens.
      const double less = 100.0 * (1.0 - best.signal / std::max(best.signal_now, 1e-12));
      WaitReason why{WaitReason::Kind::cleaner_window,
                     objective == Objective::min_carbon
                         ? fmt::format("waiting for a cleaner window on {} at {}: {:.0f}% less carbon than now ({:.0f} "
                                       "against {:.0f} gCO2e/kWh)",
                                       where, format_rfc3339(best.run_start), less, best.signal, best.signal_now)
                         : fmt::format("waiting for a cheaper window on {} at {}: {:.0f}% less cost than now ({:.4g} "
                                       "against {:.4g} per kWh)",
                                       where, format_rfc3339(best.run_start), less, best.signal, best.signal_now),
                     where};
      why.retry_at = best.run_start;
      result.next_retry = std::min(result.next_retry.value_or(best.run_start), best.run_start);
      view.deferred.emplace_back(best.run_start, best.finish);
      result.waiting.emplace_back(job->id, std::move(why));
      continue;
    }

    Placement placement;
    placement.job = job->id;
    placement.device = d;
    placement.estimate = best.setting ? std::optional<Estimate>(best.setting->estimate) : best.candidate->estimate;
    if (best.setting) {
      placement.setting = *best.setting;
      placement.at_default = best.candidate->estimate;
    }
    placement.misses_deadline = misses_deadline;
    if (placement.estimate)
      placement.reserve = placement.estimate->energy();
    else if (job->max_energy_joules) placement.reserve = EnergyDistribution{*job->max_energy_joules, 0.0};
    if (objective == Objective::min_energy && best.estimate) {
      std::string others;
      int listed = 0;
      for (const Candidate& other : job->candidates) {
        if (&other == best.candidate || !other.estimate || listed == 3) continue;
        others += fmt::format("{}{} {}", listed++ ? ", " : "", devices[other.device].ref.qualified(),
                              joules_text(other.estimate->joules_mean));
      }
      placement.note = fmt::format("fewest expected joules: {} on {}{}", joules_text(best.estimate->joules_mean),
                                   where, others.empty() ? "" : " (" + others + ")");
    } else {
      placement.note = fmt::format("{} chose {}", to_string(objective), where);
    }
    if (best.setting && best.candidate->estimate) {
      const Estimate& before = *best.candidate->estimate;
      placement.note +=
          fmt::format("; at {} {} ({}): {:.0f}% fewer joules, {:.0f}% more time than at its defaults",
                      best.setting->knob, best.setting->label, to_string(policy_.knobs.goal),
                      100.0 * (1.0 - best.setting->estimate.joules_mean / std::max(before.joules_mean, 1e-12)),
                      100.0 * (best.setting->estimate.seconds_mean / std::max(before.seconds_mean, 1e-12) - 1.0));
    }
    if (objective == Objective::min_carbon && best.estimate && devices[d].carbon)
      placement.note += fmt::format("; {:.1f} g CO2e expected at {:.0f} gCO2e/kWh",
                                    best.estimate->joules_mean / 3.6e6 * best.signal, best.signal);
    if (objective == Objective::min_cost && best.estimate && devices[d].price)
      placement.note += fmt::format("; {:.4g} expected at {:.4g} per kWh",
                                    best.estimate->joules_mean / 3.6e6 * best.signal, best.signal);
    placement.rates = rates_over(devices[d], best.run_start, best.finish);
    if (misses_deadline) placement.note += "; no device can meet its deadline, so it runs where it finishes first";

    placement.cores = view.cores > 0 && cores_of(*best.candidate) > 0 ? cores_of(*best.candidate) : 0;
    if (best.candidate->cores > 0 && placement.cores > 0)
      placement.note += fmt::format("; on {} cores", placement.cores);
    if (placement.cores > 0)
      view.cores_held += placement.cores;
    else
      view.cores_held = std::max(view.cores, 1);  // the whole device
    if (view.cores_held >= std::max(view.cores, 1)) {
      view.free = false;
      --free_devices;
      free_list.erase(std::find(free_list.begin(), free_list.end(), d));
    }
    view.available_at = std::max(view.available_at, best.finish);
    view.assigned_seconds += seconds;
    for (const std::size_t m : gang.others) {
      DeviceView& other = views[m];
      other.cores_held = std::max(other.cores, 1);
      if (other.free) {
        other.free = false;
        --free_devices;
        free_list.erase(std::find(free_list.begin(), free_list.end(), m));
      }
      other.available_at = std::max(other.available_at, best.finish);
    }
    placement.companions = gang.others;
    if (!gang.others.empty()) {
      std::string others;
      for (const std::size_t m : gang.others) others += (others.empty() ? "" : ", ") + devices[m].ref.qualified();
      placement.note += fmt::format("; with {} ({} GPUs)", others, job->gpus);
    }
    for (const std::size_t b : view.budgets)
      if (budgets[b].budget.counts_work_of(job->owner, job->project))
        if (const auto rate = placement.rates.of(budgets[b].budget.unit))
          budgets[b].reserved = budgets[b].reserved + placement.reserve.scaled(*rate);
    const double job_watts = best.estimate && best.estimate->seconds_mean > 0
                                 ? best.estimate->joules_mean / best.estimate->seconds_mean
                                 : 0.0;
    for (const std::size_t c : view.caps) {
      caps[c].watts += job_watts;
      caps[c].has_work = true;
    }
    if (objective == Objective::round_robin) round_robin_next_ = d + 1;
    if (state.limits_running) {
      ++state.running.owners[job->owner];
      if (!job->project.empty()) ++state.running.projects[job->project];
    }
    result.placements.push_back(std::move(placement));
  }
  return result;
}

std::optional<WaitReason> Placer::quota_hold(const PendingJob& job, const RunningByTenant& running) const {
  const Tenancy& tenancy = policy_.tenancy;
  auto count = [](const std::unordered_map<std::string, std::size_t>& counts, const std::string& name) {
    const auto it = counts.find(name);
    return it == counts.end() ? std::size_t{0} : it->second;
  };
  auto held = [](std::string rule, std::size_t runs, std::int64_t limit) {
    WaitReason why{WaitReason::Kind::quota,
                   fmt::format("{} runs {} job{}, as many as its quota allows (max_running_jobs = {})", rule, runs,
                               runs == 1 ? "" : "s", limit),
                   {},
                   rule};
    why.limit = static_cast<double>(limit);
    return why;
  };
  if (const auto limit = tenancy.quota_of_owner(job.owner).max_running_jobs) {
    const std::size_t runs = count(running.owners, job.owner);
    if (static_cast<std::int64_t>(runs) >= *limit) return held("owner " + job.owner, runs, *limit);
  }
  if (!job.project.empty())
    if (const Project* project = tenancy.project(job.project); project && project->quota.max_running_jobs) {
      const std::size_t runs = count(running.projects, job.project);
      if (static_cast<std::int64_t>(runs) >= *project->quota.max_running_jobs)
        return held("project " + job.project, runs, *project->quota.max_running_jobs);
    }
  return std::nullopt;
}

std::optional<WaitReason> Placer::never_fits(UnixMillis now, std::span<const DeviceStatus> devices,
                                             const PendingJob& job, const BudgetLedger& ledger) const {
  const std::vector<BudgetState> budgets = ledger.states(now);
  const Gangs gangs = job.gpus > 0 ? gangs_of(job, devices) : Gangs{};
  std::optional<WaitReason> reason;
  for (const Candidate& candidate : job.candidates) {
    const DeviceStatus& device = devices[candidate.device];
    if (!device.accepts_work) continue;
    if (job.gpus > 0)
      if (auto why = gang_problem(job, device, gangs)) {
        reason = std::move(*why);
        continue;
      }
    const std::string where = device.ref.qualified();
    const int cores = candidate.cores > 0 ? candidate.cores : job.cores;
    if (device.cores > 0 && cores > device.cores) {
      reason = WaitReason{WaitReason::Kind::unavailable,
                          fmt::format("it asks for {} cores; {} shares {}", cores, where, device.cores), where};
      continue;
    }
    // Nothing known yet: it may fit, unless the job's own max_energy_joules (what it would
    // reserve) is more than a whole budget.
    if (!candidate.estimate && !job.max_energy_joules) return std::nullopt;
    const Estimate estimate = candidate.estimate.value_or(Estimate{*job.max_energy_joules, 0.0, 0.0});
    if (job.deadline && now + static_cast<UnixMillis>(estimate.seconds_mean * 1000.0) > *job.deadline) {
      reason = WaitReason{WaitReason::Kind::deadline,
                          fmt::format("on {} it needs about {:.0f} s, more than is left before its deadline", where,
                                      estimate.seconds_mean),
                          where};
      continue;
    }
    // Energy as the policy would run it there: at the setting its knob goal would choose (the
    // deadline above is judged at the defaults, the fastest).
    const SettingOption* setting = choose_setting(policy_.knobs, policy_.risk, job, candidate, now);
    const Estimate cheapest = setting ? setting->estimate : estimate;
    if (candidate.estimate && job.max_energy_joules &&
        overrun_probability(cheapest.energy(), *job.max_energy_joules) >= policy_.risk) {
      reason =
          WaitReason{WaitReason::Kind::max_energy,
                     fmt::format("on {} it would likely use more than its max_energy_joules ({} expected, limit {})",
                                 where, joules_text(cheapest.joules_mean), joules_text(*job.max_energy_joules)),
                     where};
      continue;
    }
    bool fits = true;
    if (policy_.admission) {
      for (const auto& state : budgets) {
        const EnergyBudget& budget = state.budget;
        if (!budget.scope.covers(device.ref) || !budget.counts_work_of(job.owner, job.project)) continue;
        // Grams and money at the signal's lowest value: it cannot fit at any hour.
        const std::optional<double> rate = lowest_rate(device, budget.unit);
        if (!rate) continue;  // no signal yet to count it at: it may fit once there is one
        const EnergyDistribution amount = cheapest.energy().scaled(*rate);
        if (overrun_probability(amount, budget.limit) < policy_.risk) continue;
        fits = false;
        WaitReason why{
            WaitReason::Kind::budget,
            fmt::format("on {} it needs {} at {:g}% risk{}, more than the whole of budget {} ({}{} per {})", where,
                        budget.amount_text(quantile_above(amount, policy_.risk)), policy_.risk * 100.0,
                        budget.unit == BudgetUnit::joules ? "" : " at the signal's lowest", budget.name,
                        budget.owner.empty() && budget.project.empty() ? std::string() : budget.describe_scope() + ": ",
                        budget.amount_text(budget.limit), budget.window.describe()),
            where, budget.name};
        why.limit = budget.limit;
        why.unit = budget.unit;
        why.needed = quantile_above(amount, policy_.risk);
        reason = std::move(why);
        break;
      }
    }
    if (fits) return std::nullopt;
  }
  return reason;
}

}  // namespace joule::schedulers
