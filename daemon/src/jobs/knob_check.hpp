#pragma once
// Whether a device can take the knobs a job asks for: checked at submission (the error names the
// field) and by placement, which leaves such a device out of the job's candidates.

#include <optional>

#include "joule/common/result.hpp"
#include "joule/daemon/device_table.hpp"
#include "joule/schedulers/job.hpp"

namespace joule::daemon {

/// Why `device` cannot take `knobs` (a JSON pointer into the spec names the knob), or nothing.
std::optional<Error> knob_problem(const Device& device, const schedulers::Knobs& knobs);

}  // namespace joule::daemon
