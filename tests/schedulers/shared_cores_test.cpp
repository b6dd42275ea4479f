// Several jobs on one device, each on cores of its own (issue 36): the placer packs jobs that ask
// for cores onto a device that shares them, a job that wants the whole device waits for all of
// them, and the scheduling core continues a pass with what it placed held.
#include <gtest/gtest.h>

#include <map>

#include "joule/schedulers/placement.hpp"
#include "joule/schedulers/scheduling_core.hpp"

namespace joule::schedulers {
namespace {

const UnixMillis kNow = parse_rfc3339("2026-11-29T10:00:00Z").value();

DeviceStatus shared_device(std::string name, int cores) {
  DeviceStatus status;
  status.ref = DeviceRef{"n1", std::move(name), {}};
  status.cores = cores;
  return status;
}

PendingJob job(std::string id, int cores, double joules = 100.0, double seconds = 60.0, std::size_t devices = 1) {
  PendingJob pending;
  pending.id = std::move(id);
  pending.cores = cores;
  for (std::size_t d = 0; d < devices; ++d)
    pending.candidates.push_back(Candidate{d, Estimate{joules, 0.1 * joules, seconds}, std::nullopt, {}});
  return pending;
}

std::map<std::string, WaitReason> reasons(const PassResult& pass) {
  std::map<std::string, WaitReason> out;
  for (const auto& [id, reason] : pass.waiting) out[id] = reason;
  return out;
}

TEST(SharedCoresTest, jobs_asking_for_cores_share_a_device_until_its_cores_are_held) {
  SchedulingCore core;
  core.enqueue(job("a", 1), 1);
  core.enqueue(job("b", 1), 2);
  core.enqueue(job("c", 1), 3);
  const PassResult pass = core.place(kNow, {shared_device("cpu", 2)});
  ASSERT_EQ(pass.placements.size(), 2u);
  EXPECT_EQ(pass.placements[0].job, "a");
  EXPECT_EQ(pass.placements[0].cores, 1);
  EXPECT_EQ(pass.placements[1].job, "b");
  EXPECT_EQ(pass.placements[1].device, 0u);
  const auto why = reasons(pass);
  ASSERT_TRUE(why.contains("c"));
  EXPECT_EQ(why.at("c").kind, WaitReason::Kind::device_busy);
  EXPECT_NE(why.at("c").message.find("1 of n1/cpu's cores (2 of 2 held)"), std::string::npos) << why.at("c").message;
}

TEST(SharedCoresTest, a_smaller_job_takes_the_cores_left_only_if_it_ends_before_the_larger_one_waiting_can_start) {
  DeviceStatus cpu = shared_device("cpu", 8);
  cpu.cores_held = 5;                   // jobs of the driver's, running...
  cpu.busy_until = kNow + 10 * 60'000;  // ...expected to end in ten minutes
  {
    SchedulingCore core;
    core.enqueue(job("four", 4), 1);
    core.enqueue(job("three", 3, 100.0, 60.0), 2);  // a minute: done before "four" can start
    const PassResult pass = core.place(kNow, {cpu});
    ASSERT_EQ(pass.placements.size(), 1u);
    EXPECT_EQ(pass.placements[0].job, "three");
    EXPECT_EQ(reasons(pass).at("four").kind, WaitReason::Kind::device_busy);
  }
  {
    // An hour: it would hold a core "four" waits for, and small jobs could pass it forever.
    SchedulingCore core;
    core.enqueue(job("four", 4), 1);
    core.enqueue(job("three", 3, 100.0, 3600.0), 2);
    const PassResult pass = core.place(kNow, {cpu});
    EXPECT_TRUE(pass.placements.empty());
    EXPECT_EQ(reasons(pass).at("three").kind, WaitReason::Kind::device_busy);
  }
}

TEST(SharedCoresTest, a_job_waiting_for_the_whole_device_is_not_passed_by_jobs_without_an_estimate) {
  Placer placer(Policy{});
  BudgetLedger ledger;
  DeviceStatus cpu = shared_device("cpu", 4);
  cpu.cores_held = 1;
  const PendingJob whole = job("whole", 0);
  PendingJob unknown = job("unknown", 1);
  unknown.candidates[0].estimate.reset();  // nothing says when it would end
  std::vector<const PendingJob*> queue{&whole, &unknown};
  const PassResult pass = placer.decide(kNow, std::vector<DeviceStatus>{cpu}, queue, ledger);
  EXPECT_TRUE(pass.placements.empty());
}

TEST(SharedCoresTest, a_job_that_wants_the_whole_device_waits_for_every_core_and_then_holds_it_all) {
  Placer placer(Policy{});
  BudgetLedger ledger;
  DeviceStatus cpu = shared_device("cpu", 4);
  cpu.cores_held = 1;
  cpu.busy_until = kNow + 10 * 60'000;
  const PendingJob whole = job("whole", 0);
  const PendingJob small = job("small", 1);
  std::vector<const PendingJob*> queue{&whole, &small};
  PassResult pass = placer.decide(kNow, std::vector<DeviceStatus>{cpu}, queue, ledger);
  ASSERT_EQ(pass.placements.size(), 1u)
      << "the whole-device job waits; the small one fits beside the held core, done before it can start";
  EXPECT_EQ(pass.placements[0].job, "small");
  EXPECT_EQ(reasons(pass).at("whole").kind, WaitReason::Kind::device_busy);

  cpu.cores_held = 0;
  pass = placer.decide(kNow, std::vector<DeviceStatus>{cpu}, queue, ledger);
  ASSERT_EQ(pass.placements.size(), 1u);
  EXPECT_EQ(pass.placements[0].job, "whole");
  EXPECT_EQ(pass.placements[0].cores, 0) << "it holds the whole device";
  EXPECT_EQ(reasons(pass).at("small").kind, WaitReason::Kind::device_busy);

  cpu.hold(0);  // as the driver reports a whole-device job
  EXPECT_TRUE(cpu.busy);
  EXPECT_FALSE(cpu.fits_now(1));
}

TEST(SharedCoresTest, fifo_keeps_queue_order_on_a_shared_device_a_small_job_does_not_pass_a_waiting_large_one) {
  Policy policy;
  policy.objective = Objective::fifo;
  policy.admission = false;
  Placer placer(policy);
  BudgetLedger ledger;
  DeviceStatus cpu = shared_device("cpu", 4);
  cpu.cores_held = 2;
  PendingJob large = job("large", 4), small = job("small", 1);
  for (PendingJob* pending : {&large, &small}) pending->candidates[0].estimate.reset();  // fifo knows nothing
  std::vector<const PendingJob*> queue{&large, &small};
  const PassResult pass = placer.decide(kNow, std::vector<DeviceStatus>{cpu}, queue, ledger);
  EXPECT_TRUE(pass.placements.empty());
  EXPECT_EQ(reasons(pass).at("large").kind, WaitReason::Kind::no_free_device);
}

TEST(SharedCoresTest, a_device_that_does_not_share_its_cores_runs_one_job_whatever_it_asks) {
  SchedulingCore core;
  DeviceStatus gpu = shared_device("gpu", 0);
  core.enqueue(job("a", 1), 1);
  core.enqueue(job("b", 1), 2);
  const PassResult pass = core.place(kNow, {gpu});
  ASSERT_EQ(pass.placements.size(), 1u);
  EXPECT_EQ(pass.placements[0].cores, 0);
  gpu.hold(pass.placements[0].cores);
  EXPECT_TRUE(gpu.busy);
}

TEST(SharedCoresTest, more_cores_than_any_device_shares_never_fits_and_says_what_the_device_has) {
  SchedulingCore core;
  const std::vector<DeviceStatus> devices{shared_device("cpu", 2)};
  const auto reason = core.never_fits(kNow, devices, job("big", 8));
  ASSERT_TRUE(reason);
  EXPECT_EQ(reason->kind, WaitReason::Kind::unavailable);
  EXPECT_EQ(reason->message, "it asks for 8 cores; n1/cpu shares 2");
  EXPECT_FALSE(core.never_fits(kNow, devices, job("fits", 2)));
}

TEST(SharedCoresTest, a_submission_continues_the_pass_with_the_cores_it_placed_held) {
  SchedulingCore core;
  std::vector<DeviceStatus> devices{shared_device("cpu", 3)};
  core.enqueue(job("a", 2), 1);
  PassResult pass = core.place(kNow, devices);
  ASSERT_EQ(pass.placements.size(), 1u);
  devices[0].hold(pass.placements[0].cores);  // as the driver reports it from now on
  EXPECT_EQ(devices[0].cores_held, 2);

  core.enqueue(job("b", 1), 2);
  pass = core.place(kNow + 10, devices);
  EXPECT_TRUE(pass.continued);
  ASSERT_EQ(pass.placements.size(), 1u);
  devices[0].hold(pass.placements[0].cores);

  core.enqueue(job("c", 1), 3);
  pass = core.place(kNow + 20, devices);
  EXPECT_TRUE(pass.continued);
  EXPECT_TRUE(pass.placements.empty()) << "every core is held";
  EXPECT_EQ(reasons(pass).at("c").kind, WaitReason::Kind::device_busy);
}

TEST(SharedCoresTest, a_shared_device_is_expected_wholly_free_when_its_last_job_ends) {
  SchedulingCore core;
  core.enqueue(job("short", 1, 100.0, 60.0), 1);
  core.enqueue(job("long", 1, 100.0, 600.0), 2);
  const PassResult pass = core.place(kNow, {shared_device("cpu", 2)});
  ASSERT_EQ(pass.placements.size(), 2u);
  DeviceStatus cpu = shared_device("cpu", 2);
  cpu.cores_held = 2;
  const auto expected = core.with_expectations(kNow, {cpu});
  ASSERT_TRUE(expected[0].busy_until);
  EXPECT_EQ(*expected[0].busy_until, kNow + 600'000);
}

TEST(SharedCoresTest, min_energy_packs_a_cheaper_shared_device_before_a_dearer_free_one) {
  // A job asking for cores goes where its joules are fewest even while others hold some cores
  // there: holding cores is not being busy.
  SchedulingCore core;
  std::vector<DeviceStatus> devices{shared_device("big", 4), shared_device("small", 0)};
  devices[0].cores_held = 2;
  PendingJob pending = job("j", 1, 100.0, 60.0, 2);
  pending.candidates[1].estimate->joules_mean = 300.0;
  pending.candidates[1].estimate->joules_std = 30.0;
  core.enqueue(pending, 1);
  const PassResult pass = core.place(kNow, devices);
  ASSERT_EQ(pass.placements.size(), 1u);
  EXPECT_EQ(pass.placements[0].device, 0u);
  EXPECT_EQ(pass.placements[0].cores, 1);
}

TEST(SharedCoresTest, a_job_that_lets_placement_choose_its_cores_runs_at_the_cheapest_count_that_fits) {
  // 2 cores: 100 J in 60 s; 4 cores: 80 J in 25 s; 8 cores: 120 J in 15 s.
  PendingJob ranged = job("ranged", 2, 100.0, 60.0, 1);
  ranged.candidates.front().cores = 2;
  for (const auto& [cores, joules, seconds] : {std::tuple{4, 80.0, 25.0}, {8, 120.0, 15.0}}) {
    Candidate at{0, Estimate{joules, 0.1 * joules, seconds}, std::nullopt, {}};
    at.cores = cores;
    ranged.candidates.push_back(at);
  }
  {
    SchedulingCore core;
    core.enqueue(ranged, 1);
    const PassResult pass = core.place(kNow, {shared_device("cpu", 8)});
    ASSERT_EQ(pass.placements.size(), 1u);
    EXPECT_EQ(pass.placements[0].cores, 4);
    EXPECT_NE(pass.placements[0].note.find("on 4 cores"), std::string::npos) << pass.placements[0].note;
  }
  {
    // Only 3 cores free: 2 fits now, but 4 is cheaper beyond the estimates' spread (80 J against
    // 100 J, σ of the difference 12.8 J): min-energy waits for 4 of them.
    DeviceStatus cpu = shared_device("cpu", 8);
    cpu.cores_held = 5;
    cpu.busy_until = kNow + 600'000;
    SchedulingCore core;
    core.enqueue(ranged, 1);
    const PassResult pass = core.place(kNow, {cpu});
    EXPECT_TRUE(pass.placements.empty());
    const auto why = reasons(pass);
    ASSERT_TRUE(why.contains("ranged"));
    EXPECT_NE(why.at("ranged").message.find("4 of n1/cpu's cores"), std::string::npos) << why.at("ranged").message;
    // Were 2 cores as cheap (within the spread), it would run on them now.
    PendingJob close = ranged;
    close.candidates[0].estimate->joules_mean = 85.0;
    SchedulingCore other;
    other.enqueue(close, 1);
    const PassResult now = other.place(kNow, {cpu});
    ASSERT_EQ(now.placements.size(), 1u);
    EXPECT_EQ(now.placements[0].cores, 2);
  }
}

}  // namespace
}  // namespace joule::schedulers
