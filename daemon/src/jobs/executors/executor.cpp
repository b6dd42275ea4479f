#include "executor.hpp"

#include "joule/daemon/device_table.hpp"

namespace joule::daemon {

std::string Executor::source_so_far(const JobRecord& /*job*/, const Device& device) const {
  return std::string(device.meter->source());
}

}  // namespace joule::daemon
