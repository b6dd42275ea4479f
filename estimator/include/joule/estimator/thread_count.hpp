#pragma once
// A job on another number of threads than its device's model was learnt at (resources.cores):
// the device measures networks whole at the thread counts queued jobs ask for, and a network's
// estimate at such a count is a setting of the `threads` knob like any other (its own reading's
// ratio to the defaults, or a response fitted over the networks that were measured there).

#include <optional>
#include <string>
#include <vector>

#include "joule/estimator/device_energy_model.hpp"
#include "joule/estimator/knob_response.hpp"

namespace joule::estimator {

/// The knob a thread count is measured under: not a device's setting, the worker's own.
inline constexpr const char* kThreadsKnob = "threads";

/// The setting of `threads` threads ("4 threads").
KnobSetting threads_setting(int threads);

/// `estimate` (at the device's `device_threads`) for a job that runs at `threads`: where the
/// estimate has a line for that count, its figures become the line's (noted, with its basis) and
/// true is returned; otherwise a warning says the estimate is outside what was probed, and false.
/// Either way the thread counts' lines are dropped; the knob settings' stay (a job that sets its
/// own knobs is weighed at them, their ratios taken as they were measured at the device's count).
bool at_thread_count(Estimate& estimate, int threads, int device_threads);

/// `estimate` for a job that lets placement choose its count in [low, high]: the lines of the
/// counts in the range are kept (placement weighs the job at each, and at `device_threads` by
/// the estimate's own figures where it is in the range), every other setting's line dropped, and
/// a note names the counts placement may choose from (or, with none, that the job runs at `low`
/// outside what was probed). The counts, in increasing order.
std::vector<int> over_core_range(Estimate& estimate, int low, int high, int device_threads);

}  // namespace joule::estimator
