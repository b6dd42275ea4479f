#pragma once
// Helpers shared by the libFuzzer targets in this directory: bytes to JSON, and a check that
// stops the run (so libFuzzer saves the input) when an invariant of the code under test breaks.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace joule::fuzz {

/// The input as JSON, or a discarded value where it is not JSON. Never throws: a request that is
/// not JSON is refused before any parser of ours sees it, so it is no finding.
inline nlohmann::json parse_json(const std::uint8_t* data, std::size_t size) {
  return nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
}

/// Aborts with `what` when `condition` is false. abort() rather than assert(): the check must
/// hold in every build type, and libFuzzer records an abort as a crash with its input.
inline void require(bool condition, std::string_view what, std::string_view detail = {}) {
  if (condition) return;
  std::fprintf(stderr, "fuzz invariant broken: %.*s\n%.*s\n", static_cast<int>(what.size()), what.data(),
               static_cast<int>(detail.size()), detail.data());
  std::abort();
}

}  // namespace joule::fuzz
