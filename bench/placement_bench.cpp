// Placement decision cost: Placer::decide and BudgetLedger::states on a synthetic loaded cluster.
//
//   placement_bench                         Google Benchmark runs: means, plus p50/p99/max counters
//                                           computed from each iteration timed on its own
//   placement_bench --percentiles [--seconds=S] [--uses=U]
//                                           the table: per-decision and per-pass latency
//                                           distributions, their growth with Q and D, and
//                                           BudgetLedger::states at 1k/3k/10k/100k recorded uses
//   placement_bench --profile=WHAT [--d=D] [--q=Q] [--uses=U] [--seconds=S] [--unordered]
//                                           runs one measurement in a loop for `perf record`;
//                                           WHAT: decision-open, decision-tight, pass-open,
//                                           pass-tight, states, submit-open, submit-tight
//                                           (submissions through the scheduling core; with
//                                           --full-passes it never continues a pass)
//
// The state (make_cluster): D devices on ceil(D/4) nodes "compute-NNN" (cuda:0, cuda:1, cpu:0,
// cpu:1 on each), the nodes split into 4 groups rack-a..rack-d; a min-energy policy at 5 % risk
// with 7 energy budgets (cluster calendar day, rack-a rolling 24 h, rack-b day, node compute-000
// rolling 1 h, node compute-001 day, bare device "cuda:0" rolling 6 h, compute-002/cuda:1 day) and
// 2 power caps (cluster, rack-c); a ledger with U uses (default 3,000) over the past 23 h and one
// reservation per running job (half of them with energy used so far); 98 % of the devices busy
// (busy_until 1 min to 4 h ahead), 2 % free (at least one); Q queued jobs, each eligible on every
// device (40 %), on the cuda half (40 %) or on one node's 4 devices (20 %), with estimates that vary
// per device (cpu 2-5x the joules and 4-12x the seconds of cuda), std 5-30 % of the mean, 1 % of
// (job, device) pairs without an estimate, 10 % of jobs with a deadline and 10 % with
// max_energy_joules. Job 0 (the head) is eligible everywhere. Each job's candidates are ordered
// cheapest first, as the scheduling core orders them when a job is queued (--unordered: not, so a
// pass walks every candidate, as before that order existed; the decisions are the same).
//
// Two budget settings over the same state:
//   open   every budget has room: no candidate is refused for a budget.
//   tight  rack-a's rolling 24 h budget has 1 kJ left: every rack-a candidate (a quarter of the
//          devices) is refused with a budget reason, which asks the ledger when it fits again
//          (BudgetLedger::frees_by) and formats the message.
//
// A decision is Placer::decide with a queue of one job (the pass also computes the ledger's
// budget states, once). A pass is Placer::decide with the whole queue: it stops after max_scan =
// 1000 jobs, or max_explain = 64 jobs after no device is left free (PlacementOptions). decide
// changes neither the devices nor the ledger, so each call sees the same state.
//
// Labelled, never gating: there is no peer scheduler to run beside it here, so the
// --percentiles table ends with the ratio of the measured p99 per decision to the aim
// (1 ms at 10k queued jobs and 1,000 devices).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "joule/schedulers/budget_ledger.hpp"
#include "joule/schedulers/energy_risk.hpp"
#include "joule/schedulers/placement.hpp"
#include "joule/schedulers/policy.hpp"
#include "joule/schedulers/scheduling_core.hpp"

namespace {

bool g_unordered = false;    // --unordered: jobs keep their candidates unordered
bool g_full_passes = false;  // --full-passes: the core never continues a pass (submit-*)

namespace js = joule::schedulers;
using Clock = std::chrono::steady_clock;

constexpr js::UnixMillis kMinute = 60'000;
constexpr js::UnixMillis kHour = 3'600'000;
// 2026-11-26T10:00:00Z
constexpr js::UnixMillis kNow = 1'795'687'200'000;

std::string node_name(std::size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "compute-%03zu", i);
  return buf;
}

struct Cluster {
  js::Policy policy;
  std::vector<js::EnergyBudget> open_budgets, tight_budgets;
  std::vector<js::DeviceStatus> devices;
  std::vector<js::PendingJob> jobs;  // queue order
  std::vector<const js::PendingJob*> queue;
  std::vector<const js::PendingJob*> everywhere;  // jobs eligible on every device, in queue order
  js::BudgetLedger ledger{0};
  std::size_t free_devices = 0;
  std::size_t candidates = 0;  // over all jobs

  void use(bool tight) {
    ledger.set_budgets(tight ? tight_budgets : open_budgets);
    policy.budgets = tight ? tight_budgets : open_budgets;
  }
};

void record_uses(js::BudgetLedger& ledger, const std::vector<js::DeviceStatus>& devices, std::size_t uses,
                 std::mt19937_64& rng) {
  std::uniform_int_distribution<std::size_t> any(0, devices.size() - 1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<js::EnergyUse> all;
  all.reserve(uses);
  for (std::size_t i = 0; i < uses; ++i) {
    const auto& ref = devices[any(rng)].ref;
    const js::UnixMillis end = kNow - static_cast<js::UnixMillis>(u(rng) * 23.0 * kHour);
    const js::UnixMillis length = kMinute + static_cast<js::UnixMillis>(u(rng) * 119.0 * kMinute);
    const double watts = 50.0 + 250.0 * u(rng);
    const bool cpu = ref.name.starts_with("cpu");
    all.push_back(js::EnergyUse{ref, "done-" + std::to_string(i), end - length, end,
                                watts * static_cast<double>(length) / 1000.0, cpu ? "rapl" : "nvml"});
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.end < b.end; });
  for (auto& use : all) ledger.record(std::move(use));
}

std::unique_ptr<Cluster> make_cluster(std::size_t device_count, std::size_t queued, std::size_t uses,
                                      std::uint64_t seed = 42) {
  auto c = std::make_unique<Cluster>();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  auto between = [&](double lo, double hi) { return lo + (hi - lo) * u(rng); };
  auto log_between = [&](double lo, double hi) { return std::exp(between(std::log(lo), std::log(hi))); };

  // Devices, nodes, groups.
  const std::size_t nodes = (device_count + 3) / 4;
  const char* device_names[] = {"cuda:0", "cuda:1", "cpu:0", "cpu:1"};
  const char* group_names[] = {"rack-a", "rack-b", "rack-c", "rack-d"};
  for (const char* g : group_names) c->policy.groups.push_back(js::NodeGroup{g, {}});
  for (std::size_t n = 0; n < nodes; ++n) c->policy.groups[n * 4 / nodes].nodes.push_back(node_name(n));
  for (std::size_t d = 0; d < device_count; ++d) {
    const std::string node = node_name(d / 4);
    js::DeviceStatus s;
    s.ref = js::DeviceRef{node, device_names[d % 4], c->policy.groups_of(node)};
    c->devices.push_back(std::move(s));
  }
  // 2 % free, the rest busy with a job that ends 1 min to 4 h from now.
  std::vector<std::size_t> order(device_count);
  for (std::size_t i = 0; i < device_count; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  c->free_devices = std::max<std::size_t>(1, device_count / 50);
  for (std::size_t i = 0; i < device_count; ++i) {
    auto& s = c->devices[order[i]];
    const bool cpu = s.ref.name.starts_with("cpu");
    s.work_seconds = between(0.0, 1e6);
    if (i < c->free_devices) {
      s.average_power_watts = cpu ? 10.0 : 25.0;
      continue;
    }
    s.busy = true;
    s.busy_until = kNow + static_cast<js::UnixMillis>(between(1.0, 240.0) * kMinute);
    s.average_power_watts = cpu ? between(40.0, 120.0) : between(100.0, 300.0);
  }

  // Policy: min-energy at 5 % risk; budgets (limits set below), 2 power caps.
  c->policy.objective = js::Objective::min_energy;
  c->policy.risk = 0.05;
  using K = js::BudgetWindow::Kind;
  auto budget = [](std::string name, js::Scope scope, std::string target, js::BudgetWindow window) {
    return js::EnergyBudget{std::move(name), js::ScopeTarget{scope, std::move(target)}, 0.0, window};
  };
  std::vector<js::EnergyBudget> budgets{
      budget("cluster-day", js::Scope::cluster, "", {K::day}),
      budget("rack-a-24h", js::Scope::group, "rack-a", {K::rolling, 86400}),
      budget("rack-b-day", js::Scope::group, "rack-b", {K::day}),
      budget("compute-000-1h", js::Scope::node, node_name(0), {K::rolling, 3600}),
      budget("compute-001-day", js::Scope::node, node_name(1), {K::day}),
      budget("cuda0-6h", js::Scope::device, "cuda:0", {K::rolling, 6 * 3600}),
      budget("compute-002-cuda1-day", js::Scope::device, node_name(2) + "/cuda:1", {K::day}),
  };
  c->policy.power_caps = {
      js::PowerCap{"cluster-power", js::ScopeTarget{js::Scope::cluster, ""}, 400.0 * static_cast<double>(device_count),
                   300.0},
      js::PowerCap{"rack-c-power", js::ScopeTarget{js::Scope::group, "rack-c"}, 400.0 * static_cast<double>(device_count),
                   60.0},
  };

  // Ledger: finished uses, then one reservation per running job (half with energy so far).
  c->ledger.set_budgets(budgets);
  record_uses(c->ledger, c->devices, uses, rng);
  for (std::size_t d = 0; d < device_count; ++d) {
    const auto& s = c->devices[d];
    if (!s.busy) continue;
    const std::string job = "run-" + std::to_string(d);
    const double left_s = static_cast<double>(*s.busy_until - kNow) / 1000.0;
    const double mean = s.average_power_watts * left_s;
    c->ledger.reserve(job, s.ref, js::EnergyDistribution::from_std(mean, 0.2 * mean));
    if (d % 2 == 0) {
      const auto ran = static_cast<js::UnixMillis>(between(5.0, 180.0) * kMinute);
      c->ledger.update_running(job, kNow - ran, kNow, s.average_power_watts * static_cast<double>(ran) / 1000.0,
                               js::EnergyDistribution::from_std(mean, 0.2 * mean));
    }
  }
  // Limits: open = twice what is spent and reserved, plus 1 GJ; tight = rack-a has 1 kJ left.
  const auto states = c->ledger.states(kNow);
  c->open_budgets = budgets;
  for (std::size_t b = 0; b < budgets.size(); ++b)
    c->open_budgets[b].limit = 2.0 * (states[b].spent + states[b].reserved.mean_joules) + 1e9;
  c->tight_budgets = c->open_budgets;
  c->tight_budgets[1].limit = states[1].spent + states[1].reserved.mean_joules + 1e3;

  // Queue.
  std::vector<std::size_t> cuda_devices;
  for (std::size_t d = 0; d < device_count; ++d)
    if (c->devices[d].ref.name.starts_with("cuda")) cuda_devices.push_back(d);
  std::uniform_int_distribution<std::size_t> any_node(0, nodes - 1);
  c->jobs.reserve(queued);
  for (std::size_t j = 0; j < queued; ++j) {
    js::PendingJob job;
    job.id = "job-" + std::to_string(100000 + j);
    job.priority = 0;
    const double kind = j == 0 ? 0.0 : u(rng);
    std::vector<std::size_t> eligible;
    if (kind < 0.4) {
      for (std::size_t d = 0; d < device_count; ++d) eligible.push_back(d);
    } else if (kind < 0.8) {
      eligible = cuda_devices;
    } else {
      const std::size_t n = any_node(rng);
      for (std::size_t d = n * 4; d < std::min(device_count, n * 4 + 4); ++d) eligible.push_back(d);
    }
    const double joules = log_between(1e4, 5e6);  // on a cuda device
    const double seconds = log_between(60.0, 4.0 * 3600.0);
    if (u(rng) < 0.1) job.deadline = kNow + static_cast<js::UnixMillis>(seconds * between(1.5, 20.0) * 1000.0);
    if (u(rng) < 0.1) job.max_energy_joules = joules * between(3.0, 10.0);
    job.candidates.reserve(eligible.size());
    for (const std::size_t d : eligible) {
      js::Candidate cand;
      cand.device = d;
      if (u(rng) >= 0.01) {
        const bool cpu = c->devices[d].ref.name.starts_with("cpu");
        const double jm = joules * (cpu ? between(2.0, 5.0) : between(0.8, 1.25));
        const double sm = seconds * (cpu ? between(4.0, 12.0) : between(0.8, 1.25));
        cand.estimate = js::Estimate{jm, jm * between(0.05, 0.3), sm};
      }
      job.candidates.push_back(cand);
    }
    c->candidates += job.candidates.size();
    // As the scheduling core does when a job is queued (--unordered: each pass walks them all).
    if (!g_unordered) js::order_candidates(job, js::Objective::min_energy);
    c->jobs.push_back(std::move(job));
  }
  for (const auto& job : c->jobs) {
    c->queue.push_back(&job);
    if (job.candidates.size() == device_count) c->everywhere.push_back(&job);
  }
  c->use(false);
  return c;
}

// --- measurements -------------------------------------------------------------------------

struct Tally {
  std::size_t placed = 0, waiting = 0, considered = 0;
};

// One decision: the queue is the one job.
double time_decision(js::Placer& placer, const Cluster& c, const js::PendingJob* job, Tally& tally) {
  const auto t0 = Clock::now();
  auto result = placer.decide(kNow, c.devices, std::span<const js::PendingJob* const>(&job, 1), c.ledger);
  const auto t1 = Clock::now();
  benchmark::DoNotOptimize(result);
  tally.placed += result.placements.size();
  tally.waiting += result.waiting.size();
  tally.considered += result.considered;
  return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

double time_pass(js::Placer& placer, const Cluster& c, std::size_t queued, Tally& tally) {
  const auto queue = std::span<const js::PendingJob* const>(c.queue).first(std::min(queued, c.queue.size()));
  const auto t0 = Clock::now();
  auto result = placer.decide(kNow, c.devices, queue, c.ledger);
  const auto t1 = Clock::now();
  benchmark::DoNotOptimize(result);
  tally.placed += result.placements.size();
  tally.waiting += result.waiting.size();
  tally.considered += result.considered;
  return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

double time_states(const js::BudgetLedger& ledger) {
  const auto t0 = Clock::now();
  auto states = ledger.states(kNow);
  const auto t1 = Clock::now();
  benchmark::DoNotOptimize(states);
  return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

struct Distribution {
  std::size_t n = 0;
  double mean = 0, p50 = 0, p99 = 0, max = 0;
};

// Nearest-rank percentiles.
Distribution distribution(std::vector<double> us) {
  Distribution d;
  if (us.empty()) return d;
  std::sort(us.begin(), us.end());
  auto rank = [&](double p) {
    const auto k = static_cast<std::size_t>(std::ceil(p * static_cast<double>(us.size())));
    return us[std::clamp<std::size_t>(k, 1, us.size()) - 1];
  };
  d.n = us.size();
  for (const double x : us) d.mean += x;
  d.mean /= static_cast<double>(us.size());
  d.p50 = rank(0.50);
  d.p99 = rank(0.99);
  d.max = us.back();
  return d;
}

// Calls `one` until `max_samples` samples or `seconds` have passed (at least `min_samples`).
std::vector<double> sample(const std::function<double()>& one, std::size_t min_samples, std::size_t max_samples,
                           double seconds) {
  std::vector<double> us;
  const auto stop = Clock::now() + std::chrono::duration<double>(seconds);
  while (us.size() < max_samples && (us.size() < min_samples || Clock::now() < stop)) us.push_back(one());
  return us;
}

// --- machine -------------------------------------------------------------------------------

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "?";
}

std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// CPU time of other processes while a row ran, in % of the whole machine: busy jiffies of
// /proc/stat minus this process's utime + stime (/proc/self/stat), over the elapsed jiffies.
struct Others {
  long long busy = 0, total = 0, self = 0;
  static Others now() {
    Others o;
    std::ifstream stat("/proc/stat");
    std::string cpu;
    stat >> cpu;
    long long v[10] = {};
    for (auto& x : v) stat >> x;
    for (int i = 0; i < 8; ++i) o.total += v[i];  // user nice system idle iowait irq softirq steal
    o.busy = o.total - v[3] - v[4];
    std::ifstream self("/proc/self/stat");
    std::string field;
    for (int i = 1; i <= 15 && self >> field; ++i)
      if (i == 14 || i == 15) o.self += std::stoll(field);  // utime, stime
    return o;
  }
  double percent_since(const Others& start) const {
    const long long total_delta = total - start.total;
    if (total_delta <= 0) return 0.0;
    return std::max(0.0, 100.0 * static_cast<double>((busy - start.busy) - (self - start.self)) /
                             static_cast<double>(total_delta));
  }
};

std::string machine() {
  return std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + " CPUs, " + cpu_model();
}

// --- Google Benchmark mode -------------------------------------------------------------------

std::map<std::size_t, std::unique_ptr<Cluster>>& clusters() {
  static std::map<std::size_t, std::unique_ptr<Cluster>> cache;
  return cache;
}

Cluster& cluster(std::size_t devices, std::size_t uses) {
  auto& slot = clusters()[devices * 1'000'000 + uses];
  if (!slot) slot = make_cluster(devices, 10'000, uses);
  return *slot;
}

void set_counters(benchmark::State& state, const std::vector<double>& us, const Tally* tally) {
  const Distribution d = distribution(us);
  state.counters["p50_us"] = d.p50;
  state.counters["p99_us"] = d.p99;
  state.counters["max_us"] = d.max;
  if (!tally) return;
  state.counters["placed"] = benchmark::Counter(static_cast<double>(tally->placed), benchmark::Counter::kAvgIterations);
  state.counters["considered"] =
      benchmark::Counter(static_cast<double>(tally->considered), benchmark::Counter::kAvgIterations);
}

void bm_decision(benchmark::State& state, bool tight) {
  Cluster& c = cluster(static_cast<std::size_t>(state.range(0)), 3000);
  c.use(tight);
  js::Placer placer(c.policy);
  std::vector<double> us;
  Tally tally;
  std::size_t i = 0;
  for (auto _ : state) us.push_back(time_decision(placer, c, c.everywhere[i++ % c.everywhere.size()], tally));
  set_counters(state, us, &tally);
  c.use(false);
}

void bm_pass(benchmark::State& state, bool tight) {
  Cluster& c = cluster(static_cast<std::size_t>(state.range(0)), 3000);
  c.use(tight);
  js::Placer placer(c.policy);
  std::vector<double> us;
  Tally tally;
  for (auto _ : state) us.push_back(time_pass(placer, c, static_cast<std::size_t>(state.range(1)), tally));
  set_counters(state, us, &tally);
  c.use(false);
}

void bm_states(benchmark::State& state) {
  Cluster& c = cluster(1000, static_cast<std::size_t>(state.range(0)));
  std::vector<double> us;
  for (auto _ : state) us.push_back(time_states(c.ledger));
  set_counters(state, us, nullptr);
}

void register_benchmarks() {
  for (const bool tight : {false, true}) {
    const std::string s = tight ? "tight" : "open";
    benchmark::RegisterBenchmark(("decision/" + s).c_str(), bm_decision, tight)
        ->ArgNames({"D"})
        ->Args({10})
        ->Args({100})
        ->Args({1000})
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("pass/" + s).c_str(), bm_pass, tight)
        ->ArgNames({"D", "Q"})
        ->Args({1000, 100})
        ->Args({1000, 1000})
        ->Args({1000, 10000})
        ->Args({100, 10000})
        ->Args({10, 10000})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::RegisterBenchmark("ledger_states", bm_states)
      ->ArgNames({"uses"})
      ->Args({1000})
      ->Args({10000})
      ->Args({100000})
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}

// --- --percentiles mode ------------------------------------------------------------------------

void print_row(const char* what, const char* budgets, std::size_t d, std::size_t q, const Distribution& x,
               const Tally& t, const char* unit, const Others& since) {
  const double scale = std::string(unit) == "ms" ? 1e-3 : 1.0;
  const double n = static_cast<double>(x.n);
  std::printf("| %-8s | %-5s | %5zu | %6zu | %5zu | %9.3f | %9.3f | %9.3f | %9.3f | %s | %7.1f | %6.1f | %5.0f %% |\n",
              what, budgets, d, q, x.n, x.p50 * scale, x.p99 * scale, x.max * scale, x.mean * scale, unit,
              static_cast<double>(t.considered) / n, static_cast<double>(t.placed) / n,
              Others::now().percent_since(since));
}

// BudgetLedger::frees_by alone, as decide calls it for each candidate that a budget refuses:
// the tight rack-a budget, the deficit of each everywhere-job on each rack-a device.
void frees_by_row(std::size_t uses, double seconds) {
  auto c = make_cluster(1000, 200, uses);
  c->use(true);
  const auto states = c->ledger.states(kNow);
  const js::BudgetState& state = states[1];  // rack-a-24h
  std::vector<double> deficits;
  for (const js::PendingJob* job : c->everywhere)
    for (const auto& cand : job->candidates)
      if (cand.estimate && state.budget.scope.covers(c->devices[cand.device].ref)) {
        const js::EnergyDistribution total = state.reserved + cand.estimate->energy();
        deficits.push_back(state.spent + js::quantile_above(total, c->policy.risk) - state.budget.limit);
      }
  std::size_t i = 0, found = 0;
  const Others since = Others::now();
  const auto us = sample(
      [&] {
        const double deficit = deficits[i++ % deficits.size()];
        const auto t0 = Clock::now();
        const auto at = c->ledger.frees_by(state, deficit, kNow);
        const auto t1 = Clock::now();
        found += at ? 1 : 0;
        return std::chrono::duration<double, std::micro>(t1 - t0).count();
      },
      200, 20000, seconds);
  const Distribution x = distribution(us);
  std::printf("\nBudgetLedger::frees_by(rack-a-24h, deficit, now), D = 1000, %zu uses: n = %zu, p50 %.1f us, "
              "p99 %.1f us, max %.1f us (%zu of %zu found a time; others %.0f %%); decide calls it once per "
              "refused candidate: %zu rack-a devices\n",
              uses, x.n, x.p50, x.p99, x.max, found, x.n, Others::now().percent_since(since),
              static_cast<std::size_t>(std::count_if(c->devices.begin(), c->devices.end(), [&](const auto& d) {
                return state.budget.scope.covers(d.ref);
              })));
}

int percentiles(double seconds, std::size_t uses) {
  std::printf("placement_bench --percentiles: %s; loadavg at start %s\n", machine().c_str(), loadavg().c_str());
  std::printf("state: 2 %% of devices free, 7 budgets, 2 power caps, %zu recorded uses, one reservation per busy "
              "device; up to %.1f s per row\n\n",
              uses, seconds);
  std::printf("| what     | budg. |     D |      Q |     n |       p50 |       p99 |       max |      mean | unit | "
              "scanned | placed |  others |\n");
  std::printf("|----------|-------|------:|-------:|------:|----------:|----------:|----------:|----------:|------|"
              "--------:|-------:|--------:|\n");
  const std::size_t device_counts[] = {10, 100, 1000};
  std::map<std::size_t, std::unique_ptr<Cluster>> built;
  for (const std::size_t d : device_counts) built[d] = make_cluster(d, 10'000, uses);
  double aim_p99[2] = {0.0, 0.0};  // decision p99 at D = 1000, open and tight, in us

  for (const bool tight : {false, true}) {
    const char* b = tight ? "tight" : "open";
    // (a) decisions: the one job, eligible everywhere; cycles through such jobs of the queue.
    for (const std::size_t d : device_counts) {
      Cluster& c = *built[d];
      c.use(tight);
      js::Placer placer(c.policy);
      Tally t;
      std::size_t i = 0;
      for (int w = 0; w < 20; ++w) time_decision(placer, c, c.everywhere[w % c.everywhere.size()], t);
      t = {};
      const Others since = Others::now();
      const auto us = sample([&] { return time_decision(placer, c, c.everywhere[i++ % c.everywhere.size()], t); },
                             200, 20000, seconds);
      const Distribution x = distribution(us);
      if (d == 1000) aim_p99[tight ? 1 : 0] = x.p99;
      print_row("decision", b, d, 1, x, t, "ms", since);
    }
    // (b, c) passes over the queue: Q sweep at D = 1000, D sweep at Q = 10k.
    const std::pair<std::size_t, std::size_t> passes[] = {{1000, 100}, {1000, 1000}, {1000, 10000}, {100, 10000},
                                                          {10, 10000}};
    for (const auto& [d, q] : passes) {
      Cluster& c = *built[d];
      c.use(tight);
      js::Placer placer(c.policy);
      Tally t;
      time_pass(placer, c, q, t);  // warm-up
      t = {};
      const Others since = Others::now();
      const auto us = sample([&] { return time_pass(placer, c, q, t); }, 3, 2000, seconds);
      print_row("pass", b, d, q, distribution(us), t, "ms", since);
    }
    for (auto& [d, c] : built) c->use(false);
  }

  // BudgetLedger::states alone, D = 1000, at 1k / 10k / 100k recorded uses.
  std::printf("\nBudgetLedger::states(now), D = 1000 (7 budgets, %zu running jobs):\n\n",
              built[1000]->devices.size() - built[1000]->free_devices);
  std::printf("|    uses |     n |   p50 ms |   p99 ms |   max ms | us per 1k uses (p50) |  others |\n");
  std::printf("|--------:|------:|---------:|---------:|---------:|---------------------:|--------:|\n");
  built.clear();
  for (const std::size_t n : {std::size_t{1000}, std::size_t{3000}, std::size_t{10000}, std::size_t{100000}}) {
    auto c = make_cluster(1000, 1, n);
    const Others since = Others::now();
    const auto us = sample([&] { return time_states(c->ledger); }, 20, 20000, seconds);
    const Distribution x = distribution(us);
    std::printf("| %7zu | %5zu | %8.3f | %8.3f | %8.3f | %20.1f | %5.0f %% |\n", n, x.n, x.p50 / 1e3, x.p99 / 1e3,
                x.max / 1e3, x.p50 / (static_cast<double>(n) / 1000.0), Others::now().percent_since(since));
  }
  std::printf("\naim (issue): p99 < 1 ms per decision at 10k queued, 1,000 devices. Measured p99: open %.3f ms "
              "(%.2fx the aim), tight %.3f ms (%.2fx)\n",
              aim_p99[0] / 1e3, aim_p99[0] / 1e3, aim_p99[1] / 1e3, aim_p99[1] / 1e3);
  frees_by_row(uses, seconds);
  std::printf("\nscanned, placed: jobs considered and placed per call. others: CPU time of other processes during "
              "the row, %% of the machine (above 10 %%: disturbed, rerun). With n < 100, p99 is the max.\n");
  std::printf("loadavg at end %s\n", loadavg().c_str());
  return 0;
}

// Submissions through the scheduling core, as jouled makes them (POST /v1/jobs): each enqueues
// one job at the tail of Q queued jobs and runs a pass on the D devices; the clock moves on
// 1 ms per submission. The core continues its last pass with the new job while nothing else
// changed for up to a second (CoreOptions::continue_within_ms); --full-passes: every pass is a
// full one. Every 1,000 submissions those 1,000 are cancelled, untimed (the next pass is a full
// one). The first min(Q, 10,000) queued jobs are the usual mix; beyond, jobs eligible on one
// node (4 candidates) stand in for the rest, so that 100,000 fit in memory: a pass never looks
// past max_scan = 1,000 of them.
int submissions(bool tight, std::size_t d, std::size_t q, std::size_t uses, double seconds) {
  auto c = make_cluster(d, std::min<std::size_t>(std::max<std::size_t>(q, 1), 10'000), uses);
  c->use(tight);
  js::CoreOptions options;
  if (g_full_passes) options.continue_within_ms = 0;
  js::SchedulingCore core(c->policy, 0, options);
  std::mt19937_64 rng(7);
  record_uses(core.ledger(), c->devices, uses, rng);
  for (std::size_t i = 0; i < c->devices.size(); ++i) {
    const auto& s = c->devices[i];
    if (!s.busy) continue;
    const double left_s = static_cast<double>(*s.busy_until - kNow) / 1000.0;
    const double mean = s.average_power_watts * left_s;
    js::TrackedRun run;
    run.id = "run-" + std::to_string(i);
    run.device = i;
    run.started = kNow;
    run.prior = js::EnergyDistribution::from_std(mean, 0.2 * mean);
    run.expected_seconds = left_s;
    core.track_run(std::move(run), s.ref);
  }
  std::vector<const js::PendingJob*> one_node;
  for (const auto& job : c->jobs)
    if (job.candidates.size() <= 4) one_node.push_back(&job);
  std::int64_t sequence = 0;
  auto enqueue = [&](const js::PendingJob& job) {
    js::PendingJob copy = job;
    copy.id = "q-" + std::to_string(sequence);
    core.enqueue(std::move(copy), sequence++);
  };
  for (std::size_t i = 0; i < q; ++i) enqueue(i < c->jobs.size() ? c->jobs[i] : *one_node[i % one_node.size()]);
  std::vector<js::DeviceStatus> devices = c->devices;
  js::UnixMillis now = kNow;
  std::size_t weighed = 0, placed = 0, k = 0;
  std::vector<double> full_us, continued_us;
  std::vector<std::string> submitted;
  auto submit = [&] {
    // Every 1,000 submissions the last 1,000 are cancelled (untimed), so that the queue stays
    // at Q and memory with it; the pass after a cancel is a full one.
    if (submitted.size() == 1000) {
      for (const auto& id : submitted) core.dequeue(id);
      submitted.clear();
    }
    const js::PendingJob& job = c->jobs[k++ % c->jobs.size()];
    js::PendingJob copy = job;
    copy.id = "q-" + std::to_string(sequence);
    submitted.push_back(copy.id);
    const auto t0 = Clock::now();
    core.enqueue(std::move(copy), sequence++);
    const js::PassResult pass = core.place(++now, devices);
    const auto t1 = Clock::now();
    const double us = std::chrono::duration<double, std::micro>(t1 - t0).count();
    (pass.continued ? continued_us : full_us).push_back(us);
    weighed += pass.weighed;
    placed += pass.placements.size();
    for (const auto& placement : pass.placements) devices[placement.device].busy = true;
    return us;
  };
  submit();  // the first pass after the queue was filled: a full one, not a submission's
  full_us.clear();
  weighed = placed = 0;
  const auto start = Clock::now();
  const auto us = sample(submit, 1, 100'000'000, seconds);
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const Distribution x = distribution(us), f = distribution(full_us), n = distribution(continued_us);
  std::printf(
      "submit-%s%s D=%zu Q=%zu uses=%zu: n=%zu (%.0f /s) p50 %.3f ms p99 %.3f ms max %.3f ms; "
      "full passes %zu (p50 %.3f max %.3f ms), continued %zu (p50 %.3f p99 %.3f max %.3f ms); candidates "
      "weighed %.1f per submission; placed %zu\n",
      tight ? "tight" : "open", g_full_passes ? " (full passes)" : "", d, q, uses, x.n, static_cast<double>(x.n) / wall,
      x.p50 / 1e3, x.p99 / 1e3, x.max / 1e3, f.n, f.p50 / 1e3, f.max / 1e3, n.n, n.p50 / 1e3, n.p99 / 1e3, n.max / 1e3,
      static_cast<double>(weighed) / static_cast<double>(std::max<std::size_t>(x.n, 1)), placed);
  return 0;
}

int profile(const std::string& what, std::size_t d, std::size_t q, std::size_t uses, double seconds) {
  if (what.starts_with("submit")) return submissions(what.ends_with("tight"), d, q, uses, seconds);
  auto c = make_cluster(d, std::max<std::size_t>(q, 1), uses);
  const bool tight = what.ends_with("tight");
  c->use(tight);
  js::Placer placer(c->policy);
  Tally t;
  std::vector<double> us;
  std::size_t i = 0;
  if (what.starts_with("decision"))
    us = sample([&] { return time_decision(placer, *c, c->everywhere[i++ % c->everywhere.size()], t); }, 1,
                100'000'000, seconds);
  else if (what.starts_with("pass"))
    us = sample([&] { return time_pass(placer, *c, q, t); }, 1, 100'000'000, seconds);
  else if (what == "states")
    us = sample([&] { return time_states(c->ledger); }, 1, 100'000'000, seconds);
  else {
    std::fprintf(stderr, "unknown --profile=%s\n", what.c_str());
    return 2;
  }
  const Distribution x = distribution(us);
  std::printf("%s D=%zu Q=%zu uses=%zu: n=%zu p50 %.3f ms p99 %.3f ms max %.3f ms\n", what.c_str(), d, q, uses, x.n,
              x.p50 / 1e3, x.p99 / 1e3, x.max / 1e3);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool table = false;
  std::string profile_what;
  double seconds = 3.0;
  std::size_t uses = 3000, d = 1000, q = 10000;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--percentiles") table = true;
    else if (a.rfind("--profile=", 0) == 0) profile_what = a.substr(10);
    else if (a.rfind("--seconds=", 0) == 0) seconds = std::stod(a.substr(10));
    else if (a.rfind("--uses=", 0) == 0) uses = std::stoul(a.substr(7));
    else if (a.rfind("--d=", 0) == 0) d = std::stoul(a.substr(4));
    else if (a.rfind("--q=", 0) == 0) q = std::stoul(a.substr(4));
    else if (a == "--unordered")
      g_unordered = true;
    else if (a == "--full-passes")
      g_full_passes = true;
    else rest.push_back(argv[i]);
  }
  if (!profile_what.empty()) return profile(profile_what, d, q, uses, seconds);
  if (table) return percentiles(seconds, uses);

  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_argc, rest.data())) return 2;
  benchmark::AddCustomContext("cpu_model", cpu_model());
  benchmark::AddCustomContext("loadavg_at_start", loadavg());
  register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
