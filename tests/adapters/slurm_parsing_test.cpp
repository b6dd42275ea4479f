// The Slurm adapter's pure parts: reading squeue/scontrol/sacct output captured from a real
// Slurm 22.05 (slurm_fixtures.hpp), building sbatch's arguments and the batch script, states.
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "joule/adapters/command_runner.hpp"
#include "joule/adapters/slurm.hpp"
#include "slurm_fixtures.hpp"
#include "temp_dir.hpp"

using joule::ErrorCode;
using joule::adapters::SlurmJob;
using joule::adapters::SlurmSubmission;
namespace adapters = joule::adapters;
namespace fixtures = joule::testing::slurm_fixtures;

namespace {

std::map<std::string, SlurmJob> by_id(const std::vector<SlurmJob>& jobs) {
  std::map<std::string, SlurmJob> out;
  for (const auto& job : jobs) out.emplace(job.slurm_id, job);
  return out;
}

// Both listings of the same seven jobs must read the same.
void expect_fixture_jobs(const std::vector<SlurmJob>& listing) {
  ASSERT_EQ(listing.size(), 7U);
  const auto jobs = by_id(listing);

  const auto& ok = jobs.at("1");
  EXPECT_EQ(ok.joule_id, "job-ok");
  EXPECT_EQ(ok.user, "root");
  EXPECT_EQ(ok.state, "COMPLETED");
  EXPECT_EQ(ok.nodes, "localhost");
  EXPECT_EQ(ok.exit_code, 0);
  EXPECT_EQ(ok.exit_signal, std::nullopt);
  EXPECT_EQ(ok.start_ms, 1795682771000);
  EXPECT_EQ(ok.end_ms, 1795682772000);

  const auto& fail = jobs.at("2");
  EXPECT_EQ(fail.joule_id, "job-fail");
  EXPECT_EQ(fail.state, "FAILED");
  EXPECT_EQ(fail.reason, "NonZeroExitCode");
  EXPECT_EQ(fail.exit_code, 3);
  EXPECT_EQ(fail.exit_signal, std::nullopt);

  const auto& cancelled_running = jobs.at("3");
  EXPECT_EQ(cancelled_running.state, "CANCELLED");
  EXPECT_EQ(cancelled_running.exit_code, 0);
  EXPECT_EQ(cancelled_running.exit_signal, 15);
  EXPECT_EQ(cancelled_running.start_ms, 1795682773000);
  EXPECT_EQ(cancelled_running.end_ms, 1795682794000);

  const auto& suspended = jobs.at("4");
  EXPECT_EQ(suspended.joule_id, "job-sus");
  EXPECT_EQ(suspended.state, "SUSPENDED");
  EXPECT_EQ(suspended.start_ms, 1795682773000);
  EXPECT_EQ(suspended.end_ms, std::nullopt) << "squeue reports an expected end a year ahead; not an end";
  EXPECT_EQ(suspended.exit_code, std::nullopt);

  const auto& held = jobs.at("5");
  EXPECT_EQ(held.joule_id, "job-held");
  EXPECT_EQ(held.state, "PENDING");
  EXPECT_EQ(held.reason, "JobHeldUser");
  EXPECT_EQ(held.nodes, "");
  EXPECT_EQ(held.start_ms, std::nullopt);
  EXPECT_EQ(held.exit_code, std::nullopt);

  const auto& cancelled_pending = jobs.at("6");
  EXPECT_EQ(cancelled_pending.joule_id, "job-cancel");
  EXPECT_EQ(cancelled_pending.state, "CANCELLED");
  EXPECT_EQ(cancelled_pending.start_ms, std::nullopt) << "Slurm sets StartTime to the cancel time; it never ran";
  EXPECT_EQ(cancelled_pending.end_ms, 1795682790000);
  EXPECT_EQ(cancelled_pending.exit_code, 0);

  const auto& other = jobs.at("7");
  EXPECT_EQ(other.joule_id, "") << "a comment that is not joule:<id>";
  EXPECT_EQ(other.state, "RUNNING");
  EXPECT_EQ(other.start_ms, 1795682791000);
  EXPECT_EQ(other.end_ms, std::nullopt);
}

}  // namespace

TEST(SlurmParsingTest, squeue_json_of_slurm_22_05) {
  auto jobs = adapters::parse_squeue_json(fixtures::kSqueueJson);
  ASSERT_TRUE(jobs) << jobs.error().message;
  expect_fixture_jobs(*jobs);
}

TEST(SlurmParsingTest, scontrol_oneliner_reads_the_same_jobs) {
  auto jobs = adapters::parse_scontrol_jobs(fixtures::kScontrolJobs);
  ASSERT_TRUE(jobs) << jobs.error().message;
  expect_fixture_jobs(*jobs);
}

TEST(SlurmParsingTest, scontrol_values_with_spaces_and_iso_times) {
  const char* tz = std::getenv("TZ");
  const std::string saved = tz ? tz : "";
  ::setenv("TZ", "UTC", 1);
  ::tzset();
  auto jobs = adapters::parse_scontrol_jobs(fixtures::kScontrolIsoJob);
  if (tz) {
    ::setenv("TZ", saved.c_str(), 1);
  } else {
    ::unsetenv("TZ");
  }
  ::tzset();
  ASSERT_TRUE(jobs) << jobs.error().message;
  ASSERT_EQ(jobs->size(), 1U);
  EXPECT_EQ((*jobs)[0].joule_id, "job-ok");
  EXPECT_EQ((*jobs)[0].state, "COMPLETED");
  EXPECT_EQ((*jobs)[0].exit_code, 0);
  EXPECT_EQ((*jobs)[0].start_ms, 1795682771000);  // StartTime=2026-11-26T08:46:11 (UTC)
  EXPECT_EQ((*jobs)[0].end_ms, 1795682772000);

  // A comment of several words runs up to the next Key=, and is not taken for ours.
  auto spaced = adapters::parse_scontrol_jobs(
      "JobId=2 JobName=x JobState=RUNNING Reason=None ExitCode=0:0 StartTime=1795681705 EndTime=Unknown "
      "NodeList=localhost WorkDir=/tmp/my dir Comment=other comment with spaces  StdErr=/tmp/sj/o2\n"
      "JobId=3 JobState=PENDING Reason=JobHeldUser Comment=joule:held  NodeList=(null) StartTime=Unknown\n");
  ASSERT_TRUE(spaced) << spaced.error().message;
  ASSERT_EQ(spaced->size(), 2U);
  EXPECT_EQ((*spaced)[0].joule_id, "");
  EXPECT_EQ((*spaced)[0].nodes, "localhost");
  EXPECT_EQ((*spaced)[1].joule_id, "held");
  EXPECT_EQ((*spaced)[1].nodes, "");
}

TEST(SlurmParsingTest, empty_listings_and_garbage) {
  auto none = adapters::parse_scontrol_jobs("No jobs in the system\n");
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->empty());
  auto empty_json = adapters::parse_squeue_json(R"({"meta": {}, "errors": [], "jobs": []})");
  ASSERT_TRUE(empty_json);
  EXPECT_TRUE(empty_json->empty());

  auto not_json = adapters::parse_squeue_json("squeue: error: something");
  ASSERT_FALSE(not_json);
  EXPECT_EQ(not_json.error().code, ErrorCode::internal);
  // With slurmctld down, squeue --json exits 0 with no jobs: the errors array is all that tells.
  auto down = adapters::parse_squeue_json(fixtures::kSqueueJsonControllerDown);
  ASSERT_FALSE(down);
  EXPECT_EQ(down.error().code, ErrorCode::unavailable);
  EXPECT_NE(down.error().message.find("Failed while looking for jobs"), std::string::npos) << down.error().message;
  EXPECT_FALSE(adapters::parse_scontrol_jobs("JobName=x JobState=RUNNING\n"));
}

TEST(SlurmParsingTest, squeue_json_of_later_data_parsers) {
  // Slurm 23.02+ writes numbers as {"set", "infinite", "number"}, states as lists and the
  // exit code as an object (written by hand after those formats; not captured here).
  auto jobs = adapters::parse_squeue_json(R"({"jobs": [
    {"job_id": 41, "comment": "joule:j41", "job_state": ["FAILED"], "state_reason": "NonZeroExitCode",
     "nodes": "n1", "start_time": {"set": true, "infinite": false, "number": 1700000000},
     "end_time": {"set": true, "infinite": false, "number": 1700000060},
     "exit_code": {"status": ["NON_ZERO_EXIT"], "return_code": {"set": true, "infinite": false, "number": 3},
                   "signal": {"id": {"set": false, "infinite": false, "number": 0}, "name": ""}}},
    {"job_id": 42, "comment": "joule:j42", "job_state": ["RUNNING", "COMPLETING"], "nodes": "n1",
     "start_time": {"set": true, "infinite": false, "number": 1700000100},
     "end_time": {"set": true, "infinite": true, "number": 0}}]})");
  ASSERT_TRUE(jobs) << jobs.error().message;
  ASSERT_EQ(jobs->size(), 2U);
  EXPECT_EQ((*jobs)[0].state, "FAILED");
  EXPECT_EQ((*jobs)[0].exit_code, 3);
  EXPECT_EQ((*jobs)[0].exit_signal, std::nullopt);
  EXPECT_EQ((*jobs)[0].end_ms, 1700000060000);
  EXPECT_EQ((*jobs)[1].state, "RUNNING");
  EXPECT_EQ((*jobs)[1].start_ms, 1700000100000);
  EXPECT_EQ((*jobs)[1].end_ms, std::nullopt);
}

TEST(SlurmParsingTest, sacct_parsable_rows) {
  // sacct -X -n -P --format=JobIDRaw,User,State,Reason,NodeList,ExitCode,Start,End,Comment with
  // SLURM_TIME_FORMAT=%s, in sacct's documented format (no slurmdbd on the test machine).
  auto jobs = adapters::parse_sacct(
      "11|root|COMPLETED|None|localhost|0:0|1700000000|1700000010|joule:a\n"
      "12|root|CANCELLED by 0|None|localhost|0:15|1700000000|1700000020|joule:b\n"
      "13|alice|PENDING|JobHeldUser|None assigned|0:0|Unknown|Unknown|joule:c\n"
      "14|root|FAILED|NonZeroExitCode|localhost|3:0|2023-11-14T22:13:20|1700000030|a|b|c\n"
      "15|root|COMPLETED|None|localhost|0:0|1700000000|1700000010|\n");
  ASSERT_TRUE(jobs) << jobs.error().message;
  ASSERT_EQ(jobs->size(), 5U);
  EXPECT_EQ((*jobs)[0].joule_id, "a");
  EXPECT_EQ((*jobs)[0].user, "root");
  EXPECT_EQ((*jobs)[0].end_ms, 1700000010000);
  EXPECT_EQ((*jobs)[1].state, "CANCELLED");
  EXPECT_EQ((*jobs)[1].exit_signal, 15);
  EXPECT_EQ((*jobs)[2].user, "alice");
  EXPECT_EQ((*jobs)[2].nodes, "");
  EXPECT_EQ((*jobs)[2].start_ms, std::nullopt);
  EXPECT_EQ((*jobs)[3].joule_id, "") << "comment 'a|b|c' is one field";
  EXPECT_EQ((*jobs)[3].state, "FAILED");
  EXPECT_EQ((*jobs)[3].exit_code, 3);
  EXPECT_EQ((*jobs)[4].joule_id, "");
  EXPECT_FALSE(adapters::parse_sacct("11|root|COMPLETED\n"));
}

TEST(SlurmParsingTest, the_energy_plugin_comes_from_scontrol_show_config) {
  // Lines as `scontrol show config` prints them (Slurm 22.05).
  EXPECT_EQ(adapters::parse_energy_plugin("Configuration data as of 2026-11-29T10:00:00\n"
                                          "AccountingStorageType   = accounting_storage/slurmdbd\n"
                                          "AcctGatherEnergyType    = acct_gather_energy/rapl\n"
                                          "AcctGatherNodeFreq      = 30 sec\n"),
            "rapl");
  EXPECT_EQ(adapters::parse_energy_plugin("AcctGatherEnergyType    = acct_gather_energy/none\n"), "");
  EXPECT_EQ(adapters::parse_energy_plugin("AcctGatherEnergyType    = (null)\n"), "");
  EXPECT_EQ(adapters::parse_energy_plugin("AccountingStorageType = accounting_storage/none\n"), "");
}

TEST(SlurmParsingTest, a_jobs_energy_is_its_own_lines_else_its_batch_steps_from_sacct) {
  // sacct -n -P -j ID --format=JobIDRaw,ConsumedEnergyRaw: the job, then its steps.
  EXPECT_EQ(adapters::parse_sacct_energy("42|15234\n42.batch|15230\n42.extern|15234\n", "42"), 15234.0);
  // Older Slurm leaves the job's own line empty: the batch step ran the command Joule handed it.
  EXPECT_EQ(adapters::parse_sacct_energy("42|\n42.batch|9120\n42.extern|9400\n", "42"), 9120.0);
  // No plugin (0 everywhere), not stored yet (empty), another job's lines, garbage: no figure.
  EXPECT_EQ(adapters::parse_sacct_energy("42|0\n42.batch|0\n", "42"), std::nullopt);
  EXPECT_EQ(adapters::parse_sacct_energy("42|\n42.batch|\n", "42"), std::nullopt);
  EXPECT_EQ(adapters::parse_sacct_energy("421|500\n421.batch|500\n", "42"), std::nullopt);
  EXPECT_EQ(adapters::parse_sacct_energy("42|12 J\n42.batch|nan\n", "42"), std::nullopt);
  EXPECT_EQ(adapters::parse_sacct_energy("", "42"), std::nullopt);
}

TEST(SlurmParsingTest, running_jobs_energy_is_their_batch_steps_from_sstat_never_a_sum_of_steps) {
  // sstat -n -P -a -j 42,43,44 --format=JobID,ConsumedEnergyRaw: each running job's steps.
  const auto energy = adapters::parse_sstat_energy(
      "42.extern|5100\n42.batch|5000\n42.0|2000\n43.0|700\n43.1|900\n44.batch|0\n45|12\nbad line\n46.batch|nan\n");
  EXPECT_EQ(energy.at("42"), 5000.0);  // the batch step's: the extern step spans the node too
  EXPECT_EQ(energy.at("43"), 900.0);   // no batch line: its largest step's, not 1600
  EXPECT_FALSE(energy.contains("44")) << "0: no figure yet";
  EXPECT_FALSE(energy.contains("45")) << "not a step's line";
  EXPECT_FALSE(energy.contains("46"));
  EXPECT_TRUE(adapters::parse_sstat_energy("").empty());
}

TEST(SlurmParsingTest, sbatch_parsable_answers) {
  EXPECT_EQ(*adapters::parse_sbatch_id("123\n"), "123");
  EXPECT_EQ(*adapters::parse_sbatch_id("123;joule\n"), "123");
  EXPECT_EQ(*adapters::parse_sbatch_id("77_3\n"), "77_3");
  auto junk = adapters::parse_sbatch_id("Submitted batch job 5\n");
  ASSERT_FALSE(junk);
  EXPECT_EQ(junk.error().code, ErrorCode::internal);
  EXPECT_FALSE(adapters::parse_sbatch_id(""));
}

TEST(SlurmParsingTest, states_fall_into_the_phases_joule_tells_apart) {
  EXPECT_EQ(adapters::slurm_phase("PENDING"), adapters::SlurmPhase::waiting);
  EXPECT_EQ(adapters::slurm_phase("CONFIGURING"), adapters::SlurmPhase::waiting);
  EXPECT_EQ(adapters::slurm_phase("REQUEUED"), adapters::SlurmPhase::waiting);
  EXPECT_EQ(adapters::slurm_phase("RUNNING"), adapters::SlurmPhase::running);
  EXPECT_EQ(adapters::slurm_phase("COMPLETING"), adapters::SlurmPhase::running);
  EXPECT_EQ(adapters::slurm_phase("SUSPENDED"), adapters::SlurmPhase::suspended);
  EXPECT_EQ(adapters::slurm_phase("COMPLETED"), adapters::SlurmPhase::completed);
  for (const char* failed : {"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}) {
    EXPECT_EQ(adapters::slurm_phase(failed), adapters::SlurmPhase::failed) << failed;
  }
  EXPECT_EQ(adapters::slurm_phase("CANCELLED"), adapters::SlurmPhase::cancelled);
  EXPECT_EQ(adapters::slurm_phase("CANCELLED by 0"), adapters::SlurmPhase::cancelled);
  EXPECT_EQ(adapters::slurm_phase("cancelled"), adapters::SlurmPhase::cancelled);
  EXPECT_EQ(adapters::slurm_phase("RUNNING+"), adapters::SlurmPhase::running);
  EXPECT_EQ(adapters::slurm_phase("WEIRD"), std::nullopt);
  EXPECT_EQ(adapters::slurm_phase(""), std::nullopt);
  EXPECT_TRUE(adapters::is_final_slurm_state("COMPLETED"));
  EXPECT_TRUE(adapters::is_final_slurm_state("NODE_FAIL"));
  EXPECT_FALSE(adapters::is_final_slurm_state("SUSPENDED"));
  EXPECT_FALSE(adapters::is_final_slurm_state("PENDING"));
}

TEST(SlurmParsingTest, comments_carry_the_joule_id) {
  EXPECT_EQ(adapters::joule_comment("a1"), "joule:a1");
  EXPECT_EQ(adapters::joule_id_from_comment("joule:a1"), "a1");
  EXPECT_EQ(adapters::joule_id_from_comment(" joule:a1 "), "a1");
  EXPECT_EQ(adapters::joule_id_from_comment("joule:"), "");
  EXPECT_EQ(adapters::joule_id_from_comment("joule:a b"), "");
  EXPECT_EQ(adapters::joule_id_from_comment("Joule:a1"), "");
  EXPECT_EQ(adapters::joule_id_from_comment("(null)"), "");
  EXPECT_TRUE(adapters::valid_joule_id("0b9e4c1a-7f3e-4a61-9f3d-1d2f0c6a9b11"));
  EXPECT_FALSE(adapters::valid_joule_id(""));
  EXPECT_FALSE(adapters::valid_joule_id("a,b"));
  EXPECT_FALSE(adapters::valid_joule_id(std::string(129, 'a')));
}

TEST(SlurmParsingTest, sbatch_arguments_of_a_full_submission) {
  SlurmSubmission s;
  s.joule_id = "j-1";
  s.name = "resnet";
  s.partition = "joule";
  s.nodelist = "localhost";
  s.constraint = "gpu";
  s.argv = {"python3", "train.py"};
  s.workdir = "/srv/jobs/j-1";
  s.env = {{"EPOCHS", "5"}};
  s.stdout_path = "/srv/jobs/j-1/out%1.log";
  s.stderr_path = "/srv/jobs/j-1/err.log";
  s.hold = true;
  auto args = adapters::sbatch_arguments(s);
  ASSERT_TRUE(args) << args.error().message;
  const std::vector<std::string> expected = {"--parsable",
                                             "--comment=joule:j-1",
                                             "--job-name=resnet",
                                             "--partition=joule",
                                             "--nodelist=localhost",
                                             "--constraint=gpu",
                                             "--hold",
                                             "--output=/srv/jobs/j-1/out%%1.log",
                                             "--error=/srv/jobs/j-1/err.log",
                                             "--chdir=/srv/jobs/j-1",
                                             "--export=ALL",
                                             "--wrap=exec 'python3' 'train.py'\n"};
  EXPECT_EQ(*args, expected);

  SlurmSubmission minimal;
  minimal.joule_id = "j-2";
  minimal.argv = {"true"};
  auto few = adapters::sbatch_arguments(minimal);
  ASSERT_TRUE(few);
  const std::vector<std::string> few_expected = {"--parsable", "--comment=joule:j-2", "--job-name=j-2", "--export=ALL",
                                                 "--wrap=exec 'true'\n"};
  EXPECT_EQ(*few, few_expected);
}

TEST(SlurmParsingTest, sbatch_arguments_reject_what_cannot_be_expressed) {
  SlurmSubmission s;
  s.joule_id = "j";
  s.argv = {"true"};
  auto expect_invalid = [](const SlurmSubmission& bad, const std::string& field) {
    auto args = adapters::sbatch_arguments(bad);
    ASSERT_FALSE(args) << field;
    EXPECT_EQ(args.error().code, ErrorCode::invalid_argument);
    EXPECT_EQ(args.error().where, field);
  };
  auto bad = s;
  bad.joule_id = "has space";
  expect_invalid(bad, "joule_id");
  bad = s;
  bad.argv.clear();
  expect_invalid(bad, "argv");
  bad = s;
  bad.env = {{"1BAD", "x"}};
  expect_invalid(bad, "env");
  bad = s;
  bad.env = {{"A-B", "x"}};
  expect_invalid(bad, "env");
  bad = s;
  bad.env = {{"SBATCH_PARTITION", "other"}};
  expect_invalid(bad, "env");
  bad = s;
  bad.env = {{"SLURM_CONF", "/elsewhere"}};
  expect_invalid(bad, "env");
  bad = s;
  bad.name = "two\nlines";
  expect_invalid(bad, "name");
  bad = s;
  bad.partition = "p\r";
  expect_invalid(bad, "partition");
}

TEST(SlurmParsingTest, batch_script_keeps_every_word_as_it_was) {
  SlurmSubmission s;
  s.joule_id = "j";
  s.argv = {"printf", "[%s]\\n", "two words", "it's", "$HOME", "`id`", "", "a\nb", "\"q\"", "*", "--x=';rm -rf /'"};
  const auto script = adapters::batch_script(s);
  auto run = adapters::run_command({"/bin/sh", "-c", script});
  ASSERT_TRUE(run) << run.error().message;
  EXPECT_TRUE(run->success()) << run->err;
  EXPECT_EQ(run->out, "[two words]\n[it's]\n[$HOME]\n[`id`]\n[]\n[a\nb]\n[\"q\"]\n[*]\n[--x=';rm -rf /']\n");
  EXPECT_EQ(adapters::shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(adapters::shell_quote(""), "''");
}

TEST(SlurmParsingTest, a_claimed_batch_script_runs_its_command_once_and_a_second_copy_reports_the_first_end) {
  joule::testing::TempDir dir;
  SlurmSubmission s;
  s.joule_id = "job-1.1";
  s.run_claim_dir = (dir.path() / "claims").string();
  const auto ran = dir.path() / "ran";
  s.argv = {"/bin/sh", "-c", fmt::format("echo once >> '{}'; exit 3", ran.string())};
  const auto script = adapters::batch_script(s);

  auto first = adapters::run_command({"/bin/sh", "-c", script});
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_EQ(first->exit_code, 3) << first->err;
  auto second = adapters::run_command({"/bin/sh", "-c", script});
  ASSERT_TRUE(second) << second.error().message;
  EXPECT_EQ(second->exit_code, 3) << "the copy exits with the first one's status";
  EXPECT_NE(second->err.find("already ran in an earlier Slurm job (exit status 3)"), std::string::npos) << second->err;
  std::ifstream runs(ran);
  std::string all((std::istreambuf_iterator<char>(runs)), std::istreambuf_iterator<char>());
  EXPECT_EQ(all, "once\n") << "the command ran once";

  // Another joule id (the next epoch of the same job) is another claim: it runs.
  auto next = s;
  next.joule_id = "job-1.2";
  auto third = adapters::run_command({"/bin/sh", "-c", adapters::batch_script(next)});
  ASSERT_TRUE(third);
  EXPECT_EQ(third->exit_code, 3);
}

TEST(SlurmParsingTest, a_second_copy_of_a_command_that_never_ended_does_not_run_it) {
  joule::testing::TempDir dir;
  SlurmSubmission s;
  s.joule_id = "job-2.1";
  s.run_claim_dir = dir.path().string();
  s.run_claim_wait_seconds = 1;
  const auto ran = dir.path() / "ran";
  s.argv = {"/bin/sh", "-c", fmt::format("echo once >> '{}'", ran.string())};
  // The first copy was killed with its node, or still runs on a node slurmctld forgot.
  std::filesystem::create_directory(dir.path() / "job-2.1");
  auto copy = adapters::run_command({"/bin/sh", "-c", adapters::batch_script(s)});
  ASSERT_TRUE(copy);
  EXPECT_EQ(copy->exit_code, adapters::kSecondCopyExit) << copy->err;
  EXPECT_NE(copy->err.find("not run twice"), std::string::npos) << copy->err;
  EXPECT_FALSE(std::filesystem::exists(ran));
}

TEST(SlurmParsingTest, a_claim_that_cannot_be_made_runs_the_command_with_a_warning) {
  SlurmSubmission s;
  s.joule_id = "job-3.1";
  s.run_claim_dir = "/proc/no-such-place";
  s.argv = {"/bin/echo", "ran"};
  auto run = adapters::run_command({"/bin/sh", "-c", adapters::batch_script(s)});
  ASSERT_TRUE(run);
  EXPECT_TRUE(run->success()) << run->err;
  EXPECT_EQ(run->out, "ran\n");
  EXPECT_NE(run->err.find("runs without its guard"), std::string::npos) << run->err;
  auto bad = s;
  bad.run_claim_dir = "two\nlines";
  auto args = adapters::sbatch_arguments(bad);
  ASSERT_FALSE(args);
  EXPECT_EQ(args.error().where, "run_claim_dir");
}

TEST(SlurmParsingTest, sbatch_environment_is_the_jobs_and_slurms_only) {
  SlurmSubmission s;
  s.joule_id = "j";
  s.argv = {"true"};
  s.env = {{"GREETING", "it's $HOME"}, {"EMPTY", ""}};
  const std::vector<std::string> expected = {"PATH=/usr/local/bin:/usr/bin:/bin", "EMPTY=", "GREETING=it's $HOME",
                                             "SLURM_CONF=/run/slurm.conf"};
  EXPECT_EQ(adapters::sbatch_environment(s, {"SLURM_CONF=/run/slurm.conf"}), expected);
  s.env["PATH"] = "/opt/conda/bin:/usr/bin";
  const std::vector<std::string> own_path = {"EMPTY=", "GREETING=it's $HOME", "PATH=/opt/conda/bin:/usr/bin"};
  EXPECT_EQ(adapters::sbatch_environment(s, {}), own_path);
}

TEST(SlurmParsingTest, errors_are_classified_from_slurms_own_words) {
  using adapters::classify_slurm_error;
  EXPECT_EQ(classify_slurm_error("sbatch",
                                 "sbatch: error: Batch job submission failed: Unable to contact slurm "
                                 "controller (connect failure)"),
            ErrorCode::unavailable);
  EXPECT_EQ(classify_slurm_error("squeue",
                                 "slurm_load_jobs error: Unable to contact slurm controller (connect "
                                 "failure)"),
            ErrorCode::unavailable);
  // Seen in CI: scontrol connected just before slurmctld was killed.
  EXPECT_EQ(classify_slurm_error("scontrol", "slurm_load_jobs error: Connection reset by peer"),
            ErrorCode::unavailable);
  EXPECT_EQ(classify_slurm_error("sbatch",
                                 "sbatch: error: invalid partition specified: nope; sbatch: error: Batch "
                                 "job submission failed: Invalid partition name specified"),
            ErrorCode::invalid_argument);
  EXPECT_EQ(classify_slurm_error("scontrol",
                                 "Invalid job id specified for job 999; slurm_suspend error: Invalid job "
                                 "id specified"),
            ErrorCode::not_found);
  EXPECT_EQ(classify_slurm_error("scontrol", "Job is pending execution for job 5"), ErrorCode::conflict);
  EXPECT_EQ(classify_slurm_error("scontrol", "Job/step already completing or completed for job 1"),
            ErrorCode::conflict);
  EXPECT_EQ(classify_slurm_error("scontrol", "Job has already finished for job 1"), ErrorCode::conflict);
  EXPECT_EQ(classify_slurm_error("scontrol", "Unexpected message received for job 999"), ErrorCode::internal);
}
