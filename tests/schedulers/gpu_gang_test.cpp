// Jobs on several GPUs at once (issue 36): the placer starts a job asking for N GPUs when N
// devices of one group are free, holds them all, makes it wait (holding them from their expected
// end) otherwise, and refuses what can never fit; the scheduling core tracks all of them.
#include <gtest/gtest.h>

#include <map>

#include "joule/schedulers/placement.hpp"
#include "joule/schedulers/scheduling_core.hpp"

namespace joule::schedulers {
namespace {

const UnixMillis kNow = parse_rfc3339("2026-11-30T10:00:00Z").value();

DeviceStatus gpu(std::string name, std::string group = "n1: Fake GPU") {
  DeviceStatus status;
  status.ref = DeviceRef{"n1", std::move(name), {}};
  status.group = std::move(group);
  return status;
}

DeviceStatus cpu() {
  DeviceStatus status;
  status.ref = DeviceRef{"n1", "cpu", {}};
  return status;
}

// A job on every device given, `gpus` of them at once (0: any one), each estimate alike.
PendingJob job(std::string id, int gpus, std::size_t devices, double joules = 100.0, double seconds = 60.0) {
  PendingJob pending;
  pending.id = std::move(id);
  pending.gpus = gpus;
  for (std::size_t d = 0; d < devices; ++d)
    pending.candidates.push_back(Candidate{d, Estimate{joules, 0.1 * joules, seconds}, std::nullopt, {}});
  return pending;
}

std::map<std::string, WaitReason> reasons(const PassResult& pass) {
  std::map<std::string, WaitReason> out;
  for (const auto& [id, reason] : pass.waiting) out[id] = reason;
  return out;
}

TEST(GpuGangTest, a_job_asking_for_two_gpus_holds_two_of_one_group_and_the_next_waits_for_its_own) {
  SchedulingCore core;
  core.enqueue(job("ddp", 2, 4), 1);
  core.enqueue(job("wide", 3, 4), 2);
  core.enqueue(job("one", 1, 4), 3);
  const PassResult pass = core.place(kNow, {gpu("cuda:0"), gpu("cuda:1"), gpu("cuda:2"), gpu("cuda:3")});
  ASSERT_EQ(pass.placements.size(), 2u);
  EXPECT_EQ(pass.placements[0].job, "ddp");
  ASSERT_EQ(pass.placements[0].companions.size(), 1u);
  EXPECT_NE(pass.placements[0].companions[0], pass.placements[0].device);
  EXPECT_NE(pass.placements[0].note.find("(2 GPUs)"), std::string::npos) << pass.placements[0].note;
  const auto why = reasons(pass);
  ASSERT_TRUE(why.contains("wide"));
  EXPECT_EQ(why.at("wide").kind, WaitReason::Kind::device_busy);
  EXPECT_NE(why.at("wide").message.find("3 GPUs of n1: Fake GPU"), std::string::npos) << why.at("wide").message;
  // "wide" holds the two left until "ddp" ends; "one" takes one of them since it ends by then
  // (a minute, as long as "ddp").
  EXPECT_EQ(pass.placements[1].job, "one");
  ASSERT_NE(core.running("ddp"), nullptr);
  EXPECT_EQ(core.running("ddp")->companions, pass.placements[0].companions);
}

TEST(GpuGangTest, the_others_are_expected_free_when_the_job_ends) {
  SchedulingCore core;
  core.enqueue(job("ddp", 2, 2, 100.0, 600.0), 1);
  std::vector<DeviceStatus> devices{gpu("cuda:0"), gpu("cuda:1")};
  const PassResult pass = core.place(kNow, devices);
  ASSERT_EQ(pass.placements.size(), 1u);
  for (std::size_t d = 0; d < devices.size(); ++d) devices[d].busy = true;  // as jouled reports them
  const auto expected = core.with_expectations(kNow, devices);
  EXPECT_EQ(expected[0].busy_until, kNow + 600'000);
  EXPECT_EQ(expected[1].busy_until, kNow + 600'000);
}

TEST(GpuGangTest, a_job_waits_for_enough_gpus_and_starts_once_they_are_free) {
  Placer placer(Policy{});
  BudgetLedger ledger;
  std::vector<DeviceStatus> devices{gpu("cuda:0"), gpu("cuda:1"), gpu("cuda:2")};
  devices[1].busy = true;
  devices[1].busy_until = kNow + 5 * 60'000;
  devices[2].busy = true;
  devices[2].busy_until = kNow + 10 * 60'000;
  const PendingJob ddp = job("ddp", 2, 3);
  std::vector<const PendingJob*> queue{&ddp};
  PassResult pass = placer.decide(kNow, devices, queue, ledger);
  EXPECT_TRUE(pass.placements.empty()) << "one GPU is free, it asks for two";
  const auto why = reasons(pass).at("ddp");
  EXPECT_EQ(why.kind, WaitReason::Kind::device_busy);
  EXPECT_EQ(why.retry_at, kNow + 5 * 60'000) << "when the second of them is expected free: " << why.message;

  devices[1].busy = false;
  pass = placer.decide(kNow, devices, queue, ledger);
  ASSERT_EQ(pass.placements.size(), 1u);
  const Placement& placed = pass.placements[0];
  std::vector<std::size_t> held = placed.companions;
  held.push_back(placed.device);
  std::sort(held.begin(), held.end());
  EXPECT_EQ(held, (std::vector<std::size_t>{0, 1}));
}

TEST(GpuGangTest, a_smaller_job_does_not_take_a_gpu_the_waiting_job_is_expected_to_start_on) {
  Placer placer(Policy{});
  BudgetLedger ledger;
  std::vector<DeviceStatus> devices{gpu("cuda:0"), gpu("cuda:1")};
  devices[1].busy = true;
  devices[1].busy_until = kNow + 5 * 60'000;
  const PendingJob ddp = job("ddp", 2, 2, 100.0, 600.0);
  const PendingJob hour = job("hour", 0, 2, 100.0, 3600.0);
  std::vector<const PendingJob*> queue{&ddp, &hour};
  const PassResult pass = placer.decide(kNow, devices, queue, ledger);
  for (const auto& placement : pass.placements)
    EXPECT_NE(placement.job, "hour") << "cuda:0 is held for ddp from when cuda:1 frees, in 5 minutes";
}

TEST(GpuGangTest, more_gpus_than_a_group_has_or_a_cpu_never_fit_and_say_what_there_is) {
  SchedulingCore core;
  const std::vector<DeviceStatus> devices{cpu(), gpu("cuda:0"), gpu("cuda:1"), gpu("cuda:2", "n1: Other GPU")};
  auto never = core.never_fits(kNow, devices, job("four", 4, 4));
  ASSERT_TRUE(never);
  EXPECT_EQ(never->kind, WaitReason::Kind::unavailable);
  EXPECT_NE(never->message.find("asks for 4 GPUs of one kind on one node; n1: Fake GPU has 2"), std::string::npos)
      << never->message;
  PendingJob on_cpu = job("on-cpu", 1, 1);
  never = core.never_fits(kNow, devices, on_cpu);
  ASSERT_TRUE(never);
  EXPECT_NE(never->message.find("n1/cpu is not a GPU"), std::string::npos) << never->message;
  EXPECT_FALSE(core.never_fits(kNow, devices, job("two", 2, 4)));
  EXPECT_FALSE(core.never_fits(kNow, devices, job("any", 0, 1))) << "a job asking for no GPUs runs on the CPU";

  // Mixed kinds do not make a group: two of one kind and one of another is not three.
  core.enqueue(job("three", 3, 4), 1);
  const PassResult pass = core.place(kNow, devices);
  EXPECT_TRUE(pass.placements.empty());
  EXPECT_EQ(reasons(pass).at("three").kind, WaitReason::Kind::unavailable);
}

TEST(GpuGangTest, a_job_asking_for_one_gpu_runs_on_a_gpu_only) {
  SchedulingCore core;
  core.enqueue(job("one", 1, 2), 1);
  const PassResult pass = core.place(kNow, {cpu(), gpu("cuda:0")});
  ASSERT_EQ(pass.placements.size(), 1u);
  EXPECT_EQ(pass.placements[0].device, 1u);
  EXPECT_TRUE(pass.placements[0].companions.empty());
}

TEST(GpuGangTest, a_submission_continues_the_pass_with_every_gpu_it_placed_held) {
  SchedulingCore core;
  const std::vector<DeviceStatus> devices{gpu("cuda:0"), gpu("cuda:1"), gpu("cuda:2")};
  core.enqueue(job("ddp", 2, 3), 1);
  ASSERT_EQ(core.place(kNow, devices).placements.size(), 1u);
  // The driver reports the two it holds as busy; a submission right after continues the pass.
  std::vector<DeviceStatus> told = devices;
  for (const std::size_t d : {core.running("ddp")->device, core.running("ddp")->companions[0]}) told[d].hold(0);
  core.enqueue(job("second", 2, 3), 2);
  const PassResult pass = core.place(kNow + 10, told);
  EXPECT_TRUE(pass.continued);
  EXPECT_TRUE(pass.placements.empty()) << "one GPU is left";
  EXPECT_EQ(reasons(pass).at("second").kind, WaitReason::Kind::device_busy);
}

TEST(GpuGangTest, under_fifo_a_waiting_job_on_two_gpus_is_not_passed_for_ever_by_one_gpu_jobs) {
  Policy policy;
  policy.objective = Objective::fifo;
  policy.admission = false;
  Placer placer(policy);
  BudgetLedger ledger;
  std::vector<DeviceStatus> devices{gpu("cuda:0"), gpu("cuda:1")};
  devices[1].busy = true;
  devices[1].busy_until = kNow + 5 * 60'000;
  PendingJob ddp = job("ddp", 2, 2);
  PendingJob one = job("one", 0, 2);
  for (auto* pending : {&ddp, &one})
    for (auto& candidate : pending->candidates) candidate.estimate.reset();  // fifo knows no run times
  std::vector<const PendingJob*> queue{&ddp, &one};
  const PassResult pass = placer.decide(kNow, devices, queue, ledger);
  EXPECT_TRUE(pass.placements.empty()) << "cuda:0 is held for ddp: the one-GPU job cannot say it ends in time";
  EXPECT_EQ(reasons(pass).at("ddp").kind, WaitReason::Kind::no_free_device);
}

}  // namespace
}  // namespace joule::schedulers
