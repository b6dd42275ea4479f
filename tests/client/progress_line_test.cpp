// joulectl's progress line: rewritten in place on a terminal, one line per state elsewhere, and
// the texts for jobs and probe runs from the API's JSON.

#include "joule/cli/progress_line.hpp"

#include <sstream>

#include <gtest/gtest.h>

using joule::cli::ProgressLine;
using nlohmann::json;

TEST(ProgressLineTest, a_terminal_line_is_rewritten_in_place_and_cleared_at_the_end) {
  std::ostringstream out;
  {
    ProgressLine line(out, true, 80);
    line.show("running", "epoch 1 of 3");
    line.show("running", "epoch 1 of 3");  // unchanged: nothing written
    line.show("running", "epoch 2 of 3, 4.0 J");
    line.show("running", "done");  // shorter: the rest of the longer text is blanked
    line.finish();
  }
  EXPECT_EQ(out.str(), "\repoch 1 of 3\repoch 2 of 3, 4.0 J\rdone               \rdone\r    \r");
}

TEST(ProgressLineTest, a_terminal_line_is_cut_to_the_width_by_code_points) {
  std::ostringstream out;
  ProgressLine line(out, true, 6);
  line.show("s", "±±±±±±±±");  // two bytes each: five code points fit one column short of six
  EXPECT_EQ(out.str(), "\r±±±±±");
}

TEST(ProgressLineTest, elsewhere_only_a_change_of_key_writes_a_line) {
  std::ostringstream out;
  {
    ProgressLine line(out, false);
    line.show("queued", "queued: next in line");
    line.show("queued", "queued: still next in line");
    line.show("running", "running, epoch 1 of 3");
    line.show("running", "running, epoch 2 of 3");
    line.show("succeeded", "succeeded after 3.0 s");
  }  // finish() writes nothing here
  EXPECT_EQ(out.str(), "queued: next in line\nrunning, epoch 1 of 3\nsucceeded after 3.0 s\n");
}

TEST(ProgressLineTest, a_running_job_shows_device_time_epoch_energy_so_far_and_projection) {
  const json job = {{"id", "1a2b3c4d-0000-0000-0000-000000000000"},
                    {"name", "lenet"},
                    {"state", "running"},
                    {"device", "cpu"},
                    {"seconds", 65.2},
                    {"energy", nullptr},
                    {"progress", {{"epoch", 3}, {"epochs", 10}, {"reported_at", "2026-01-01T00:00:00Z"}}},
                    {"energy_so_far", {{"joules", 451.24}, {"source", "rapl"}, {"measured", true}}},
                    {"projection", {{"joules", {{"mean", 1500.0}, {"std", 20.0}}}, {"method", "step"}}}};
  EXPECT_EQ(joule::cli::job_progress_text(job),
            "job 1a2b3c4d (lenet): running on cpu for 1 min 05 s, epoch 3 of 10, 451.2 J so far (rapl), "
            "projected 1.50 kJ");
  EXPECT_EQ(joule::cli::job_progress_key(job), "running");
}

TEST(ProgressLineTest, a_job_without_progress_or_reading_shows_what_there_is) {
  const json job = {{"id", "1a2b3c4d"}, {"name", "x"}, {"state", "running"}, {"device", "cpu"}, {"seconds", 1.0}};
  EXPECT_EQ(joule::cli::job_progress_text(job), "job 1a2b3c4d (x): running on cpu for 1.0 s");
}

TEST(ProgressLineTest, a_queued_job_says_why_it_waits_and_its_reason_is_part_of_the_key) {
  const json job = {
      {"id", "1a2b3c4d"},   {"name", "x"},
      {"state", "queued"},  {"device", nullptr},
      {"seconds", nullptr}, {"waiting", {{"reason", "budget"}, {"message", "budget lab-daily has 3 kJ left"}}}};
  EXPECT_EQ(joule::cli::job_progress_text(job), "job 1a2b3c4d (x): queued: budget lab-daily has 3 kJ left");
  EXPECT_EQ(joule::cli::job_progress_key(job), "queued/budget");
}

TEST(ProgressLineTest, a_throttled_job_says_how_and_an_ended_one_its_metered_energy) {
  const json throttled = {{"id", "1a2b3c4d"},
                          {"name", "x"},
                          {"state", "throttled"},
                          {"device", "cpu"},
                          {"throttle", {{"paused", true}, {"cpu_quota", nullptr}, {"gpu_power_limit_watts", 150.0}}}};
  EXPECT_EQ(joule::cli::job_progress_text(throttled), "job 1a2b3c4d (x): throttled (paused, GPU limit 150 W) on cpu");
  EXPECT_EQ(joule::cli::job_progress_key(throttled), "throttled/paused");
  const json ended = {
      {"id", "1a2b3c4d"},     {"name", "x"},
      {"state", "succeeded"}, {"device", "cpu"},
      {"seconds", 3.24},      {"energy", {{"joules", 2500.0}, {"source", "modelled"}, {"measured", false}}}};
  EXPECT_EQ(joule::cli::job_progress_text(ended), "job 1a2b3c4d (x): succeeded on cpu after 3.2 s, 2.50 kJ (modelled)");
}

TEST(ProgressLineTest, a_probe_run_shows_time_of_requested_probes_and_energy_once_metered) {
  json run = {{"id", "p17-2"},
              {"device", "cpu"},
              {"state", "running"},
              {"requested_seconds", 60.0},
              {"started_ms", 10'000},
              {"finished_ms", nullptr},
              {"probes", 14},
              {"preempted", 1},
              {"failed", 0},
              {"probe_seconds", 20.0},
              {"energy", {{"joules", 512.34}, {"source", "rapl"}, {"measured", true}}}};
  EXPECT_EQ(joule::cli::probe_progress_text(run, 33'000),
            "probe run p17-2 on cpu: running for 23.0 s of 60 s, 14 probes (1 pre-empted), 512.3 J so far (rapl)");
  run["energy"] = {{"joules", 0.0}, {"source", ""}, {"measured", false}};
  run["probes"] = 1;
  run["preempted"] = 0;
  EXPECT_EQ(joule::cli::probe_progress_text(run, 11'000), "probe run p17-2 on cpu: running for 1.0 s of 60 s, 1 probe");
  run = {{"id", "p17-2"},        {"device", "cpu"},
         {"state", "done"},      {"requested_seconds", 60.0},
         {"started_ms", 10'000}, {"finished_ms", 75'000},
         {"probes", 30},         {"preempted", 0},
         {"failed", 2},          {"energy", {{"joules", 1200.0}, {"source", "rapl"}, {"measured", true}}}};
  EXPECT_EQ(joule::cli::probe_progress_text(run, 99'000),
            "probe run p17-2 on cpu: done after 1 min 05 s, 30 probes (2 failed), 1.20 kJ (rapl)");
}

TEST(ProgressLineTest, durations_and_joules_read_at_a_glance) {
  EXPECT_EQ(joule::cli::duration_text(4.24), "4.2 s");
  EXPECT_EQ(joule::cli::duration_text(65.9), "1 min 05 s");
  EXPECT_EQ(joule::cli::duration_text(7385), "2 h 03 min");
  EXPECT_EQ(joule::cli::joules_text(812.44), "812.4 J");
  EXPECT_EQ(joule::cli::joules_text(3.2e6), "3.20 MJ");
}
