// The job book's finished jobs out of memory: they leave it once their last row is committed and
// are read back from the database, page by page, when the API asks for them.

#include <algorithm>
#include <filesystem>
#include <memory>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "chosen_setting.hpp"
#include "executors/local_executor.hpp"
#include "job_record.hpp"
#include "joule/daemon/job_service.hpp"

namespace joule::daemon {

using adapters::StoredEvent;
using adapters::StoredJob;
using nlohmann::json;
using schedulers::JobState;

namespace {

bool finished_row(const StoredJob& row) {
  const auto state = schedulers::job_state_from_string(row.state);
  return state && schedulers::is_terminal(*state);
}

}  // namespace

void JobService::keep_finished_in(adapters::Database& archive, std::size_t kept) {
  archive_ = &archive;
  // The job that just finished stays: the answer to whoever finished it is built from it.
  finished_kept_ = std::max<std::size_t>(kept, 1);
}

std::pair<std::int64_t, std::int64_t> JobService::recent_use_span() const {
  const std::int64_t half_life = core_.policy().tenancy.usage_half_life_seconds;
  const std::int64_t now = now_ms();
  return {now - std::min<std::int64_t>(20 * half_life, 366 * 86400) * 1000, now};
}

void JobService::remember_recent_use(const std::vector<adapters::RecentUse>& uses) {
  for (const auto& use : uses) core().add_recent_use(use.owner, use.project, use.joules, use.last_end_ms);
}

void JobService::evict_finished() {
  if (!archive_) return;
  const auto now = now_ms();
  while (finished_order_.size() > finished_kept_) {
    const auto it = jobs_.find(finished_order_.front());
    if (it != jobs_.end()) {
      const Job& job = *it->second;
      const auto shown = schedulers::job_state_from_string(job.shown.state);
      // A run for a coordinator: its end is reported until acknowledged, for kReportEndsForMs at
      // most, and its id must stay known so that the assignment is never taken up again.
      if (!job.row.origin.empty() && now - job.row.finished_ms.value_or(now) <= kReportEndsForMs) return;
      if (!shown || !schedulers::is_terminal(*shown)) return;  // its end is not committed yet
      sequences_by_state_[static_cast<std::size_t>(*shown)].erase(job.row.sequence);
      ++evicted_by_state_[static_cast<std::size_t>(*shown)];
      by_sequence_.erase(job.row.sequence);
      jobs_.erase(it);
    }
    finished_order_.pop_front();
  }
}

void JobService::forget_old_finished() {
  if (options_.keep_finished_days <= 0 || forgetting_ || now_ms() < forget_again_at_ms_) return;
  constexpr std::size_t kBatch = 1000;
  constexpr std::int64_t kDayMs = 86'400'000;
  forgetting_ = true;
  auto forgotten = std::make_shared<std::vector<std::pair<std::string, std::string>>>();
  const std::int64_t before = now_ms() - options_.keep_finished_days * kDayMs;
  persist(
      [forgotten, before](adapters::Database& db) -> Status {
        auto deleted = db.forget_finished_jobs(before, kBatch);
        if (!deleted) return deleted.error();
        *forgotten = std::move(deleted).value();
        return {};
      },
      [this, forgotten](Status status) {
        forgetting_ = false;
        forget_again_at_ms_ = now_ms() + (status && forgotten->size() == kBatch ? 0 : 60'000);
        if (!status || forgotten->empty()) return;
        std::vector<std::filesystem::path> directories;
        for (const auto& [id, state_name] : *forgotten) {
          const auto state = schedulers::job_state_from_string(state_name);
          if (!state) continue;
          const auto index = static_cast<std::size_t>(*state);
          if (const auto it = jobs_.find(id); it != jobs_.end()) {
            // Still among the latest finished in memory (an idle node's): it leaves memory too.
            sequences_by_state_[index].erase(it->second->row.sequence);
            by_sequence_.erase(it->second->row.sequence);
            jobs_.erase(it);
            finished_order_.erase(std::remove(finished_order_.begin(), finished_order_.end(), id),
                                  finished_order_.end());
          } else if (evicted_by_state_[index] > 0) {
            --evicted_by_state_[index];
          }
          directories.push_back(local_->job_directory(id));
          directories.push_back(local_->work_directory(id));
        }
        refresh_state_metrics();
        spdlog::info("{} finished job{} older than {} day{} deleted with {} log and work directories",
                     forgotten->size(), forgotten->size() == 1 ? "" : "s", options_.keep_finished_days,
                     options_.keep_finished_days == 1 ? "" : "s", forgotten->size() == 1 ? "its" : "their");
        // Thousands of small directories: not on the loop.
        boost::asio::post(*dataset_checks_, [directories = std::move(directories)] {
          for (const auto& directory : directories) {
            std::error_code ignored;
            std::filesystem::remove_all(directory, ignored);
          }
        });
      });
}

std::size_t JobService::count_in(JobState state) const {
  const auto index = static_cast<std::size_t>(state);
  return sequences_by_state_[index].size() + evicted_by_state_[index];
}

std::unique_ptr<JobRecord> JobService::record_of(StoredJob row, std::vector<StoredEvent> events) const {
  auto job = std::make_unique<Job>();
  // A finished row whose spec no longer parses is still shown as stored.
  if (auto spec = schedulers::parse_job_spec(json::parse(row.spec_json, nullptr, false))) job->spec = std::move(*spec);
  job->state = *schedulers::job_state_from_string(row.state);
  job->estimates = read_estimates(row.estimate_json);
  job->shown = ShownRow::of(row);
  job->events = std::move(events);
  job->events_shown = job->events.size();
  job->row = std::move(row);
  restore_chosen_setting(*job);
  return job;
}

Result<std::unique_ptr<JobRecord>> JobService::read_back(const std::string& id, bool with_events) const {
  if (!archive_) return make_error(ErrorCode::not_found, fmt::format("no job {}", id), "id");
  auto row = archive_->find_job(id);
  if (!row) return make_error(ErrorCode::unavailable, fmt::format("cannot read job {}: {}", id, row.error().message));
  // A job not finished is in memory, unless its row could not be read at start: skipped, as
  // there (the row stays in the database for inspection).
  if (!*row || !finished_row(**row)) return make_error(ErrorCode::not_found, fmt::format("no job {}", id), "id");
  std::vector<StoredEvent> events;
  if (with_events) {
    auto stored = archive_->load_job_events(id);
    if (!stored)
      return make_error(ErrorCode::unavailable, fmt::format("cannot read job {}: {}", id, stored.error().message));
    events = std::move(stored).value();
  }
  return record_of(std::move(**row), std::move(events));
}

Error JobService::not_in_memory(const std::string& id, const std::string& finished_why) const {
  auto job = read_back(id, false);
  if (!job) return job.error();
  return make_error(ErrorCode::conflict,
                    fmt::format("job {} {}", id, fmt::format(fmt::runtime(finished_why), (*job)->row.state)));
}

Result<JobPage> JobService::archived_page(const std::optional<std::string>& state, std::size_t limit,
                                          std::optional<std::int64_t> after_sequence, bool newest_first) const {
  auto rows = archive_->page_jobs(state, after_sequence, limit + 1, newest_first);
  if (!rows) return make_error(ErrorCode::unavailable, fmt::format("cannot list jobs: {}", rows.error().message));
  const bool more = rows->size() > limit;
  if (more) rows->resize(limit);
  JobPage out;
  if (more) out.next = rows->back().id;
  for (auto& row : *rows) {
    // What is in memory may be newer than the row (a commit whose answer is on its way): the
    // API shows a job one way whichever path reads it. A row out of memory that is not
    // finished is one skipped at start, or a submission whose commit is not answered yet.
    if (const auto it = jobs_.find(row.id); it != jobs_.end())
      out.jobs.push_back(view_of(*it->second));
    else if (finished_row(row))
      out.jobs.push_back(view_of(record_of(std::move(row), {})));
  }
  if (state) {
    out.total = count_in(*schedulers::job_state_from_string(*state));
  } else {
    for (std::size_t i = 0; i < sequences_by_state_.size(); ++i) out.total += count_in(static_cast<JobState>(i));
  }
  return out;
}

std::vector<JobService::Feedback> JobService::archived_feedback() const {
  // Read a chunk at a time: a row's estimates are its largest part (hundreds of KB on a
  // coordinator of a thousand devices), and only its device's estimate is kept.
  constexpr std::size_t kChunk = 100;
  std::vector<Feedback> out;
  for (std::size_t offset = 0; offset < kFeedbackRows; offset += kChunk) {
    auto rows = archive_->latest_succeeded_jobs(std::min(kChunk, kFeedbackRows - offset), offset);
    if (!rows) {
      spdlog::error("estimates: cannot read finished jobs to learn from: {}", rows.error().message);
      break;
    }
    for (const StoredJob& row : *rows) {
      if (!row.energy_joules || !row.finished_ms || row.estimate_json.empty()) continue;
      auto estimate = estimate_as_run(read_estimates(row.estimate_json), row);
      if (estimate) estimate = estimate_at_setting_ran(std::move(*estimate), row);
      if (!estimate) continue;
      std::optional<double> seconds;
      if (row.started_ms)
        seconds = static_cast<double>(std::max<std::int64_t>(0, *row.finished_ms - *row.started_ms)) / 1000.0;
      out.push_back(feedback_of(row, *estimate, seconds));
    }
    if (rows->size() < kChunk) break;
  }
  // Newest first from the database; the feedback goes oldest first, as the jobs ended.
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace joule::daemon
