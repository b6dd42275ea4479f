#pragma once
// A job as the book shows it at one moment: its record as last committed, and what the book
// knows of it beyond the record (its place in the queue, how long it has run, what its energy
// figure covers, where it runs). The book returns these; routes render them
// (src/http/routes/job_json.hpp), so the book writes no JSON for the API.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/schedulers/step_projection.hpp"

namespace joule::daemon {

struct JobRecord;

struct JobView {
  /// The book's own record (valid until the event loop runs on), or one read back from the
  /// database that `owned` keeps alive.
  const JobRecord* record = nullptr;
  std::shared_ptr<const JobRecord> owned;
  /// When the book made the view (its clock): what a queued job's carbon estimate starts from.
  std::int64_t at_ms = 0;
  /// Queued, waiting for no other reason than the jobs ahead of it: how many there are.
  std::optional<std::size_t> jobs_ahead;
  /// How long it has run (or ran): on the monotonic clock where this daemon timed it.
  std::optional<double> seconds;
  /// What its energy figure covers on the device it ran on.
  std::string energy_scope;
  /// The meter of the device it runs on: the source of its energy so far, before it has one of its own.
  std::string meter_source;
  /// The node of the device it runs (or ran) on; empty for this node's own devices.
  std::string node;
  /// Its directory here (logs, checkpoints); empty where it never ran here.
  std::filesystem::path directory;
  /// A built-in job's checkpoint directory (its own, or in its directory here).
  std::filesystem::path checkpoint_directory;

  const JobRecord& job() const { return *record; }
};

/// One page of jobs in the order asked for; `next`: the id to list after, none at the end.
struct JobPage {
  std::vector<JobView> jobs;
  std::size_t total = 0;  ///< every job in the state asked for
  std::optional<std::string> next;
};

/// A running job's "epoch k of N done" (POST /v1/jobs/{id}/progress), as routes read it.
struct ProgressReport {
  std::int64_t epoch = 0;
  std::int64_t epochs = 0;
  /// What training says of itself (loss, accuracy, firing_rates): shown with the progress.
  nlohmann::json figures = nlohmann::json::object();
};

/// What the book answers a progress report with: the job's energy so far and its projection.
struct ProgressAnswer {
  std::optional<double> joules;  ///< none where the device's meter could not be read
  std::string source;            ///< of the joules (the device's meter)
  bool partial = false;          ///< adopted after a restart: part of its energy was not metered
  std::optional<schedulers::Projection> projection;
  std::string note;  ///< why there is no energy or projection
};

}  // namespace joule::daemon
