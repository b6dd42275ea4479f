// libFuzzer target: a job submission body (POST /v1/jobs) through parse_job_spec, then the
// canonical form that jouled stores (to_json(spec).dump()) and parses again on recovery.

#include <cstddef>
#include <cstdint>

#include "fuzz_support.hpp"
#include "joule/schedulers/job.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using joule::fuzz::require;
  const nlohmann::json body = joule::fuzz::parse_json(data, size);
  if (body.is_discarded()) return 0;
  auto spec = joule::schedulers::parse_job_spec(body);
  if (!spec) return 0;
  // jouled stores this text in SQLite and reads it back after a restart: it must dump (a
  // throw here is a string that is not UTF-8) and must parse as a job again.
  const nlohmann::json canonical = joule::schedulers::to_json(*spec);
  const std::string stored = canonical.dump();
  auto again = joule::schedulers::parse_job_spec(nlohmann::json::parse(stored));
  require(again.ok(), "the stored form of an accepted job is refused", again ? stored : again.error().message);
  require(joule::schedulers::to_json(*again) == canonical, "the stored form of a job does not round-trip", stored);
  return 0;
}
