#pragma once
// The results of a joule-sim run, for people (a table, policies as rows) and for programs (JSON).
// Every joule figure is labelled "simulated": it is the simulator's truth, not a meter reading.
// Energy ratios are given against the oracle and against round-robin, in total and per
// completed job (a policy that leaves jobs unrun uses less energy in total for that reason).

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/simulator/replay.hpp"

namespace joule::simulator {

struct SimulationReport {
  std::string cluster;  ///< file names, for the header
  std::string trace;
  std::string policy;
  std::uint64_t seed = 1;
  std::size_t devices = 0;
  std::size_t jobs = 0;
  std::vector<std::string> notes;
  std::vector<PolicyMetrics> runs;
};

nlohmann::json to_json(const PolicyMetrics& metrics);
/// The whole report; ratios are added to each run (`energy_vs_oracle`, `energy_vs_round_robin`,
/// and the `_per_job` versions), null where the reference is missing or zero.
nlohmann::json to_json(const SimulationReport& report);

/// A fixed-width table and the notes under it.
std::string format_table(const SimulationReport& report);

}  // namespace joule::simulator
