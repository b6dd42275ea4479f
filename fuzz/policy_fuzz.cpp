// libFuzzer target: policies.d/*.toml through parse_policy_files, as jouled reads the directory
// at start and on SIGHUP. A NUL byte (which TOML text cannot hold) splits the input into
// several files, so the rules that span files (names unique across files, [placement] keys set
// in one file only, groups defined in another file) are reached too.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fuzz_support.hpp"
#include "joule/config/policy_config.hpp"
#include "joule/schedulers/budget_ledger.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::pair<std::string, std::string>> files;
  while (files.size() < 4) {
    const auto nul = rest.find('\0');
    const std::string name = files.empty() ? "fuzz.toml" : "fuzz-" + std::to_string(files.size()) + ".toml";
    files.emplace_back(name, std::string(rest.substr(0, nul)));
    if (nul == std::string_view::npos) break;
    rest.remove_prefix(nul + 1);
  }
  auto loaded = joule::config::parse_policy_files(files);
  if (!loaded) return 0;
  for (const auto& warning : loaded->warnings) (void)warning.describe();

  // What jouled does with an accepted policy: budgets into the ledger, work recorded and
  // reserved against them, and every window's state read for GET /v1/budgets and admission.
  // Fuzzed windows (rolling_seconds, calendar kinds) meet real times here.
  const auto& policy = loaded->policy;
  joule::schedulers::BudgetLedger ledger(120);
  ledger.set_policy(policy);
  constexpr joule::schedulers::UnixMillis kNow = 1'767'225'600'000;  // 2026-01-01T00:00:00Z
  joule::schedulers::DeviceRef device{"localhost", "cpu", policy.groups_of("localhost")};
  ledger.record({device, "job-1", kNow - 3'600'000, kNow - 60'000, 5000.0, "modelled"});
  ledger.reserve("job-2", device, joule::schedulers::EnergyDistribution::from_std(800.0, 100.0));
  for (const auto& state : ledger.states(kNow)) {
    (void)state.budget.scope.describe();
    (void)state.budget.window.describe();
    (void)ledger.frees_by(state, 1000.0, kNow);
    (void)ledger.calendar_window(state.budget.window.kind, kNow);
  }
  for (const auto& cap : policy.power_caps) (void)cap.scope.covers(device);
  for (const auto& floor : policy.battery_floors) (void)floor.scope.covers(device);
  ledger.prune(kNow);
  return 0;
}
