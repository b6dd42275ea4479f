// What the job book shows: a job, a page of jobs, the finished jobs' feedback, the summary
// line, as records and views (routes render them).
#include "joule/daemon/job_service.hpp"

#include "chosen_setting.hpp"
#include "executors/agent_runner.hpp"
#include "executors/local_executor.hpp"
#include "executors/node_executor.hpp"
#include "job_record.hpp"

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "joule/common/energy_source.hpp"
#include "joule/common/text.hpp"
#include "joule/schedulers/step_projection.hpp"

namespace joule::daemon {

namespace asio = boost::asio;
using adapters::StoredEvent;
using adapters::StoredJob;
using nlohmann::json;
using schedulers::JobState;

Result<JobView> JobService::job(const std::string& id, bool with_events) const {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    auto archived = read_back(id, with_events);
    if (!archived) return archived.error();
    return view_of(std::move(archived).value());
  }
  return view_of(*it->second);
}

Result<JobPage> JobService::jobs(const std::optional<std::string>& state, std::size_t limit,
                                 const std::optional<std::string>& after, bool newest_first) const {
  if (state && !schedulers::job_state_from_string(*state)) {
    return make_error(
        ErrorCode::invalid_argument,
        fmt::format("unknown state \"{}\"; use queued, placed, running, throttled, succeeded, failed or cancelled",
                    *state),
        "state");
  }
  std::optional<std::int64_t> after_sequence;
  if (after) {
    auto it = jobs_.find(*after);
    if (it != jobs_.end()) {
      after_sequence = it->second->row.sequence;
    } else if (auto archived = read_back(*after, false)) {
      after_sequence = (*archived)->row.sequence;
    } else if (archived.error().code != ErrorCode::not_found) {
      return archived.error();
    } else {
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("no job {} to list after; start again without \"after\"", *after), "after");
    }
  }
  // Every job, or the finished ones of a state, may be out of memory: the database pages them.
  if (archive_ && (!state || schedulers::is_terminal(*schedulers::job_state_from_string(*state))))
    return archived_page(state, limit, after_sequence, newest_first);
  // A page costs its own jobs plus a logarithm: the submission numbers are kept sorted, in all
  // (by_sequence_) and per state, so listing never walks or sorts the jobs it does not show.
  const auto page = [&](const auto& sequences, std::size_t total) {
    const auto sequence_of = [](const auto& entry) -> std::int64_t {
      if constexpr (std::is_same_v<std::decay_t<decltype(entry)>, std::int64_t>)
        return entry;
      else
        return entry.first;
    };
    JobPage out;
    out.total = total;
    const Job* last = nullptr;
    bool more = false;
    const auto take = [&](auto it, auto end) {
      for (; it != end; ++it) {
        if (out.jobs.size() == limit) {
          more = true;
          break;
        }
        last = by_sequence_.at(sequence_of(*it));
        out.jobs.push_back(view_of(*last));
      }
    };
    if (newest_first)
      take(after_sequence ? std::make_reverse_iterator(sequences.lower_bound(*after_sequence)) : sequences.rbegin(),
           sequences.rend());
    else
      take(after_sequence ? sequences.upper_bound(*after_sequence) : sequences.begin(), sequences.end());
    if (more && last) out.next = last->row.id;
    return out;
  };
  if (!state) return page(by_sequence_, by_sequence_.size());
  const auto& sequences = sequences_by_state_[static_cast<std::size_t>(*schedulers::job_state_from_string(*state))];
  return page(sequences, sequences.size());
}

std::vector<JobService::Feedback> JobService::finished_feedback() const {
  if (archive_) return archived_feedback();
  std::vector<const Job*> done;
  for (const auto& [sequence, job] : by_sequence_)
    if (job->state == JobState::succeeded && job->row.energy_joules && !job->estimates.empty() && job->row.finished_ms)
      done.push_back(job);
  std::stable_sort(done.begin(), done.end(),
                   [](const Job* a, const Job* b) { return *a->row.finished_ms < *b->row.finished_ms; });
  std::vector<Feedback> out;
  for (const Job* job : done) {
    auto estimate = estimate_as_run(job->estimates, job->row);
    if (estimate) estimate = estimate_at_setting_ran(std::move(*estimate), job->row);
    if (estimate) out.push_back(feedback_of(job->row, *estimate, run_seconds(*job)));
  }
  return out;
}

std::string JobService::summary() const {
  std::size_t running = 0;
  for (const auto& device : devices_)
    for (const DeviceHold& hold : device.holds)
      if (const auto it = jobs_.find(hold.job); it == jobs_.end() || it->second->row.device == device.name) ++running;
  std::string text = fmt::format("{} queued, {} running", core().queue().size(), running);
  for (const auto& device : devices_)
    text += fmt::format("; {} {:.1f} W ({})", device.name, device.power_watts, device.meter->source());
  return text;
}

std::string JobService::energy_scope(const std::string& device_name, const std::string& source) const {
  if (source == to_string(EnergySource::slurm))
    return "Slurm's energy accounting (sacct ConsumedEnergyRaw): its nodes' energy over its run, its own only where "
           "it had them to itself";
  for (const auto& device : devices_) {
    if (device.name != device_name || !device.node.empty()) continue;
    if (const auto* model = device.meter->cpu_time_model(); model && source == device.meter->source())
      return model->describe();
    if (const auto* shared = device.meter->shared_gpu_counter(); shared && source == device.meter->source())
      return shared->share_rule();
  }
  return "device energy over the job's run";
}

JobView JobService::view_of(const Job& job) const {
  JobView view;
  view.record = &job;
  const ShownRow& shown = job.shown;
  const auto shown_state = schedulers::job_state_from_string(shown.state).value_or(job.state);
  if (shown_state == JobState::queued && !(job.waiting && job.waiting->kind != schedulers::WaitReason::Kind::behind))
    view.jobs_ahead = core().queue().position(job.row.id).value_or(0);
  if (shown.started_ms) view.seconds = run_seconds(job);
  if (shown.energy_joules) {
    view.energy_scope = energy_scope(shown.device, shown.energy_source);
    if (job.row.energy_shared)
      view.energy_scope += "; its share by CPU time of the device's energy while other jobs ran beside it";
    if (!job.row.companions.empty())
      view.energy_scope +=
          fmt::format("; summed over its {} GPUs ({}, {}); the host's CPU energy is not in it",
                      job.row.companions.size() + 1, shown.device, fmt::join(job.row.companions, ", "));
  }
  if (const Device* device = devices_.find(job.row.device)) view.meter_source = std::string(device->meter->source());
  if (const Device* ran_on = devices_.find(shown.device)) view.node = ran_on->node;
  view.directory = local_->job_directory(job.row.id);
  if (const auto& builtin = job.spec.run.builtin)
    view.checkpoint_directory =
        view.node.empty() ? local_->checkpoint_directory(job) : std::filesystem::path(builtin->checkpoint_directory);
  return view;
}

JobView JobService::view_of(std::unique_ptr<Job> archived) const {
  JobView view = view_of(*archived);
  view.owned = std::move(archived);
  return view;
}

}  // namespace joule::daemon
