#pragma once
// Jobs as the API shows them (GET /v1/jobs, /v1/jobs/{id}, the answers of submit, cancel, pause
// and progress), rendered from what the book returns (joule/daemon/job_view.hpp), and a progress
// report read from its body.

#include <string>

#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"
#include "joule/daemon/grid_signal_feed.hpp"
#include "joule/daemon/job_view.hpp"
#include "joule/schedulers/step_projection.hpp"

namespace joule::daemon::routes {

/// A job; `with_events`: with its spec and history too (GET /v1/jobs/{id}). `signals`: where
/// set, a job that has not started says what it would emit and cost on each device if it
/// started now.
nlohmann::json job_json(const JobView& view, bool with_events, const SignalFeeds& signals);
/// A job as JSON text, as the API answers it: its stored estimate goes into the text as it is
/// stored (its "estimate" then comes last), not parsed and written out again, unless something
/// is added to it (grams or cost before the job runs). Reads back as job_json's.
std::string job_text(const JobView& view, bool with_events, const SignalFeeds& signals);
/// {"jobs": [job_text...], "next": id or null, "total": N}, as text.
std::string job_page_text(const JobPage& page, const SignalFeeds& signals);
/// A STEP projection; `source` is the meter source of the joules it projects.
nlohmann::json projection_json(const schedulers::Projection& projection, const std::string& source);

/// The body of POST /v1/jobs/{id}/progress: {"epoch": k, "epochs": N} and what training says of
/// itself (loss, accuracy, firing_rates); the error names the field (JSON pointer).
Result<ProgressReport> parse_progress(const nlohmann::json& body);
nlohmann::json progress_json(const std::string& id, const ProgressReport& report, const ProgressAnswer& answer);

}  // namespace joule::daemon::routes
