#pragma once
// The job book as an executor sees it (daemon::ExecutorHost), for the executors' unit tests:
// records what it is told and changes a job's state the way the book does, without storage,
// placement or budgets. Needs the daemon's private headers (daemon/src) on the include path.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "jobs/executors/executor.hpp"
#include "jobs/job_record.hpp"
#include "joule/common/clock.hpp"
#include "joule/daemon/device_table.hpp"

namespace joule::testing {

class FakeExecutorHost final : public daemon::ExecutorHost {
 public:
  using JobRecord = daemon::JobRecord;
  using JobState = schedulers::JobState;

  const Clock& clock() const override { return time; }
  void running(JobRecord& job, const std::string& note) override {
    job.state = JobState::running;
    notes.push_back("running: " + note);
  }
  void ended(JobRecord& job, JobState state, const std::string& reason,
             std::optional<adapters::ExitStatus> exit) override {
    job.state = state;
    job.row.reason = reason;
    if (exit) job.row.exit_code = exit->signaled ? 128 + exit->value : exit->value;
    notes.push_back("ended: " + reason);
  }
  void note(JobRecord&, const std::string& message) override { notes.push_back("note: " + message); }
  void count_knobs(const std::string&, const std::string& outcome) override { knobs.push_back(outcome); }
  void requeue(JobRecord& job, const std::string&) override { job.state = JobState::queued; }
  void run_lost(JobRecord& job, const std::string& why) override {
    job.state = JobState::queued;
    notes.push_back("lost: " + why);
  }
  void count_as_run(JobRecord& job) override { job.state = JobState::running; }
  void reserve_again(JobRecord& job) override { reserved.push_back(job.row.id); }
  std::optional<schedulers::Estimate> estimate_for(const JobRecord&, const std::string&) const override {
    return std::nullopt;
  }
  JobRecord* find_job(const std::string& id) override {
    const auto it = jobs.find(id);
    return it == jobs.end() ? nullptr : &it->second;
  }
  daemon::Device* find_device(const std::string& name) override { return devices.find(name); }
  std::vector<unsigned> gpus_not_of(const std::vector<std::string>& own) const override {
    return devices.gpus_not_of(own);
  }
  std::string device_node(const std::string& device) const override {
    const auto slash = device.find('/');
    return slash == std::string::npos ? "here" : device.substr(0, slash);
  }
  void device_added(daemon::Device& device) override { added.push_back(device.name); }
  void devices_changed(bool) override { ++passes; }
  void lost(JobRecord& job, daemon::Device& device, const std::string& why) override {
    device.release(job.row.id);
    job.state = JobState::queued;
    notes.push_back("lost: " + why);
  }
  void adopt(JobRecord& job, daemon::Device& device, const std::string& note, const std::string& report_state,
             std::optional<std::int64_t>) override {
    device.hold(job.row.id, 0);
    job.state = report_state == "placed" ? JobState::placed : JobState::running;
    notes.push_back("adopted: " + note);
  }

  ManualClock time{1'900'000'000'000};
  std::map<std::string, JobRecord> jobs;
  daemon::DeviceTable devices;
  std::vector<std::string> notes;
  std::vector<std::string> knobs;     // knob outcomes counted ("set", "refused")
  std::vector<std::string> reserved;  // jobs whose estimate was reserved again
  std::vector<std::string> changed;   // nodes whose desired state changed (a test's hook)
  std::vector<std::string> added;     // devices other nodes reported for the first time
  int passes = 0;                     // placement passes asked for
};

}  // namespace joule::testing
