// What an idle node's probing check costs: jouled asks the planner for its next probe once a
// second while a device is idle (ProbeService::needs_probing), also once the model has
// converged. The planner keeps its answer until the model or its own state changes, so the
// idle check is the kept answer and a change costs one computation. The workload is examples/models (11 networks) at
// batch 32 and 64, as queued jobs would name them; the model is a simulated device's after a 120-probe campaign on it.

#include <benchmark/benchmark.h>

#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/model_spec.hpp"
#include "joule/estimator/probe_campaign.hpp"
#include "joule/estimator/simulated_device.hpp"
#include "model_files.hpp"

using namespace joule::estimator;

namespace {

std::vector<WorkloadItem> example_workload() {
  std::vector<WorkloadItem> out;
  for (const auto& spec : joule::bench::load_model_specs(JOULE_EXAMPLE_MODELS))
    for (std::int64_t batch : {32, 64}) out.push_back(WorkloadItem{spec, batch});
  return out;
}

struct Trained {
  std::vector<WorkloadItem> workload = example_workload();
  DeviceEnergyModel model{"sim:laptop-cpu", "simulated"};
  CampaignOptions options;
  Trained() {
    SimulatedDevice device(*find_simulated_profile("laptop-cpu"), 1);
    options.probes = 120;
    options.gp.restarts = 1;
    (void)run_campaign(model, workload, simulated_network_meter(device, 1), options);
  }
};

Trained& trained() {
  static Trained state;
  return state;
}

// A planner as the daemon's is after its seeds were probed: past them, every answer weighs every
// candidate (its σ under the model, its key's share of the workload's estimated energy).
ProbePlanner planner_past_its_seeds(const Trained& t) {
  ProbePlanner planner(t.workload, t.options);
  while (planner.seeding()) {
    auto plan = planner.next(t.model);
    if (!plan) break;
    planner.mark_probed(plan->target);
  }
  return planner;
}

void BM_next_planned_on_an_idle_check(benchmark::State& state) {
  auto& t = trained();
  ProbePlanner planner = planner_past_its_seeds(t);
  state.counters["probed"] = static_cast<double>(planner.probed_count());
  state.counters["workload_items"] = static_cast<double>(t.workload.size());
  state.counters["candidates"] = static_cast<double>(planner.candidate_count());
  for (auto _ : state) {
    auto planned = planner.next_planned(t.model);
    benchmark::DoNotOptimize(planned);
  }
}
BENCHMARK(BM_next_planned_on_an_idle_check)->Unit(benchmark::kMicrosecond);

// The same question after something changed (here the σ target, between two values that plan
// alike): the answer is computed again, as after a probe, a fit or a new workload.
void BM_next_planned_after_a_change(benchmark::State& state) {
  auto& t = trained();
  ProbePlanner planner = planner_past_its_seeds(t);
  bool flip = false;
  for (auto _ : state) {
    planner.set_target_sigma((flip = !flip) ? 1e-12 : 0.0);
    auto planned = planner.next_planned(t.model);
    benchmark::DoNotOptimize(planned);
  }
}
BENCHMARK(BM_next_planned_after_a_change)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
