#pragma once
// The model specs shipped in examples/models/, for tests: one copy of LeNet-5 and friends, and
// the shipped files are exercised by every test that uses them.

#include <fstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace joule::testing {

/// examples/models/<name>.json, parsed.
inline nlohmann::json example_model(const std::string& name) {
  std::ifstream in(std::string(JOULE_SOURCE_DIR) + "/examples/models/" + name + ".json");
  if (!in) throw std::runtime_error("no example model " + name);
  return nlohmann::json::parse(in);
}

}  // namespace joule::testing
