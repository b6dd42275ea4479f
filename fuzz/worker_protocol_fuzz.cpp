// libFuzzer target: the jouled <-> joule-worker protocol. jouled parses what a worker prints on
// stdout (parse_probe_result), and joule-worker parses the request file jouled wrote
// (parse_probe_request); a crashed or hostile worker must not take jouled down.

#include <cstddef>
#include <cstdint>

#include "fuzz_support.hpp"
#include "joule/common/energy_source.hpp"
#include "joule/worker/protocol.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using joule::fuzz::require;
  namespace worker = joule::worker;
  const nlohmann::json body = joule::fuzz::parse_json(data, size);
  if (body.is_discarded()) return 0;

  if (auto result = worker::parse_probe_result(body)) {
    (void)result->environment.fingerprint();
    (void)joule::is_measurement(result->meter_source);
    const nlohmann::json json = worker::to_json(*result);
    auto again = worker::parse_probe_result(nlohmann::json::parse(json.dump()));
    require(again.ok(), "a probe result does not parse from its own JSON", again ? json.dump() : again.error().message);
    for (const auto& network : result->networks) {
      std::vector<double> joules;
      for (const auto& repetition : network.repetitions) joules.push_back(repetition.joules_per_step);
      if (!joules.empty()) (void)worker::spread_of(joules);
    }
  }
  if (auto request = worker::parse_probe_request(body)) {
    const nlohmann::json json = worker::to_json(*request);
    auto again = worker::parse_probe_request(nlohmann::json::parse(json.dump()));
    require(again.ok(), "a probe request does not parse from its own JSON",
            again ? json.dump() : again.error().message);
    require(worker::to_json(*again) == json, "a probe request does not round-trip", json.dump());
  }
  return 0;
}
