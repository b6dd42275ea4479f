// joulectl against a real daemon: tables for people, JSON for scripts, one-line errors.

#include <unistd.h>

#include <fstream>

#include <gtest/gtest.h>

#include "daemon_process.hpp"

using joule::testing::DaemonProcess;
using joule::testing::run_program;
using nlohmann::json;

namespace {

std::string server_of(const DaemonProcess& daemon) { return "http://127.0.0.1:" + std::to_string(daemon.port()); }

}  // namespace

TEST(CliTest, submit_wait_prints_state_seconds_joules_and_source) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const auto job_file = daemon.state_dir().parent_path() / "job.json";
  std::ofstream(job_file) << R"({"name": "cli", "run": {"command": ["sh", "-c", "sleep 0.2"]}})";
  auto [code, out] =
      run_program({JOULECTL_BINARY, "--server", server_of(daemon), "submit", "--wait", job_file.string()});
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("state:     succeeded"), std::string::npos) << out;
  EXPECT_NE(out.find("(modelled, not measured)"), std::string::npos) << out;
  EXPECT_NE(out.find("seconds:"), std::string::npos) << out;

  auto [list_code, table] = run_program({JOULECTL_BINARY, "jobs"}, {{"JOULE_SERVER", server_of(daemon)}});
  EXPECT_EQ(list_code, 0);
  EXPECT_NE(table.find("STATE"), std::string::npos);
  EXPECT_NE(table.find("succeeded"), std::string::npos);

  auto [json_code, listed] = run_program({JOULECTL_BINARY, "--server", server_of(daemon), "--json", "jobs"});
  EXPECT_EQ(json_code, 0);
  const auto id = json::parse(listed)["jobs"][0]["id"].get<std::string>();
  auto [job_code, shown] = run_program({JOULECTL_BINARY, "--server", server_of(daemon), "job", id});
  EXPECT_EQ(job_code, 0);
  EXPECT_NE(shown.find("events:"), std::string::npos);
  auto [dev_code, devices] = run_program({JOULECTL_BINARY, "--server", server_of(daemon), "devices"});
  EXPECT_EQ(dev_code, 0);
  EXPECT_NE(devices.find("modelled*"), std::string::npos) << devices;

  // --cores gives the job CPUs of its own (resources.cores).
  auto [cores_code, submitted] = run_program(
      {JOULECTL_BINARY, "--server", server_of(daemon), "--json", "submit", "--cores", "1", job_file.string()});
  ASSERT_EQ(cores_code, 0) << submitted;
  EXPECT_EQ(json::parse(submitted)["spec"]["resources"]["cores"], 1) << submitted;
}

TEST(CliTest, usage_prints_this_months_use_per_group_as_a_table_or_csv) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const auto job_file = daemon.state_dir().parent_path() / "job.json";
  std::ofstream(job_file) << R"({"name": "used", "run": {"command": ["sh", "-c", "sleep 0.2"]}})";
  const std::string server = server_of(daemon);
  ASSERT_EQ(run_program({JOULECTL_BINARY, "--server", server, "submit", "--wait", job_file.string()}).first, 0);
  const std::string owner = "uid:" + std::to_string(::geteuid());

  auto [code, table] = run_program({JOULECTL_BINARY, "--server", server, "usage"});
  EXPECT_EQ(code, 0) << table;
  EXPECT_NE(table.find("GROUP (owner)"), std::string::npos) << table;
  EXPECT_NE(table.find(owner), std::string::npos) << table;
  EXPECT_NE(table.find("modelled"), std::string::npos) << table;  // by source: not measured

  auto [csv_code, csv] = run_program({JOULECTL_BINARY, "--server", server, "usage", "--group-by", "day", "--csv"});
  EXPECT_EQ(csv_code, 0) << csv;
  EXPECT_EQ(csv.rfind("day,jobs,device_hours,measured_joules,joules_by_source,", 0), 0u) << csv;
  EXPECT_NE(csv.find("\n20"), std::string::npos) << csv;  // a row for today's date
  EXPECT_NE(csv.find(",1,"), std::string::npos) << csv;   // one job

  auto [bad_code, bad] = run_program({JOULECTL_BINARY, "--server", server, "usage", "--from", "last week"});
  EXPECT_EQ(bad_code, 1);
  EXPECT_NE(bad.find("from \"last week\" is not an RFC 3339 time"), std::string::npos) << bad;
}

TEST(CliTest, errors_are_one_line_and_non_zero) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << daemon.log();
  auto [code, out] = run_program({JOULECTL_BINARY, "--server", server_of(daemon), "job", "no-such-id"});
  EXPECT_EQ(code, 1);
  EXPECT_EQ(out, "joulectl: no job no-such-id\n");
  const auto bad = daemon.state_dir().parent_path() / "bad.json";
  std::ofstream(bad) << R"({"run": {"command": []}})";
  std::tie(code, out) = run_program({JOULECTL_BINARY, "--server", server_of(daemon), "submit", bad.string()});
  EXPECT_EQ(code, 1);
  EXPECT_EQ(out, "joulectl: run.command is empty; give at least the program (at /run/command)\n");
  std::tie(code, out) = run_program({JOULECTL_BINARY, "--server", "http://127.0.0.1:1", "jobs"});
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("cannot connect to jouled"), std::string::npos) << out;
}

TEST(CliTest, token_new_prints_a_token_and_its_hash) {
  auto [code, out] = run_program({JOULECTL_BINARY, "token", "new"});
  EXPECT_EQ(code, 0);
  EXPECT_NE(out.find("token_sha256"), std::string::npos);
}

TEST(CliTest, estimate_prints_the_layer_table_and_why_there_are_no_joules_yet) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << daemon.log();
  auto [code, out] = run_program({JOULECTL_BINARY, "--server", server_of(daemon), "estimate",
                                  std::string(JOULE_SOURCE_DIR) + "/examples/models/lenet5.json", "--batch-size", "64",
                                  "--samples-per-epoch", "60000"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("total: 61706 parameters"), std::string::npos) << out;
  EXPECT_NE(out.find("938 steps"), std::string::npos) << out;
  EXPECT_NE(out.find("cpu: no estimate"), std::string::npos) << out;
}
