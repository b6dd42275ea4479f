#pragma once
// An agent's report of one job, as cluster tests build them.

#include <cstdint>
#include <string>

#include "joule/cluster/sync.hpp"

namespace joule::testing {

inline cluster::ReportedJob reported_job(const std::string& id, std::int64_t epoch, const std::string& state) {
  cluster::ReportedJob out;
  out.id = id;
  out.epoch = epoch;
  out.state = state;
  return out;
}

}  // namespace joule::testing
