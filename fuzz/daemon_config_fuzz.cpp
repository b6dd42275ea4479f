// libFuzzer target: jouled.toml through parse_config, as jouled reads it at start and on SIGHUP,
// and the JSON view of the result that jouled logs as its effective config at start.

#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_support.hpp"
#include "joule/config/daemon_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto loaded = joule::config::parse_config(text, "fuzz.toml", joule::config::DaemonConfig{});
  if (!loaded) {
    (void)loaded.error().message.size();
    return 0;
  }
  for (const auto& warning : loaded->warnings) (void)warning.describe();
  // Strict dump: a string that is not UTF-8 here throws, and that is a finding.
  (void)joule::config::to_json(loaded->config).dump();
  // Parsing again on top of the result (a reload over the running config) must not break either.
  (void)joule::config::parse_config(text, "fuzz.toml", loaded->config);
  return 0;
}
