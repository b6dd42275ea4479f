#pragma once
// The model specs of a directory (examples/models), for the accuracy benches.

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "joule/estimator/model_spec.hpp"

namespace joule::bench {

/// Every *.json of `dir`, in name order, parsed as a model spec; a file that is not one stops
/// the bench, naming it and why.
inline std::vector<estimator::ModelSpec> load_model_specs(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  std::vector<estimator::ModelSpec> out;
  for (const auto& file : files) {
    std::ifstream in(file);
    auto spec = estimator::parse_model_spec(nlohmann::json::parse(in), "/model");
    if (!spec) {
      fmt::print(stderr, "{}: {}\n", file.string(), spec.error().message);
      std::exit(1);
    }
    out.push_back(std::move(*spec));
  }
  return out;
}

}  // namespace joule::bench
