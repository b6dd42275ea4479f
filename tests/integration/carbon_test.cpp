// A carbon signal end to end: a real jouled with a simulated device reads a forecast file
// ([carbon]), min-carbon holds a job with a deadline for the cleaner window ahead and runs it once
// the forecast changes, a job without a deadline runs at once and is accounted in grams, a bad
// edit of the file is reported while the last good forecast stays in force, and a job held by
// its owner (constraints.not_before) waits for its own time.

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "daemon_process.hpp"
#include "temp_dir.hpp"

using joule::testing::DaemonProcess;
using joule::testing::wait_until;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// RFC 3339 in UTC, `from_now` from now.
std::string at(std::chrono::minutes from_now) {
  const auto time = std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now() + from_now);
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}Z", fmt::gmtime(std::chrono::system_clock::to_time_t(time)));
}

// Writes the file whole and gives it a new modification time (jouled re-reads it on change).
void write_signal(const std::filesystem::path& file, const std::string& text) {
  const auto before =
      std::filesystem::exists(file) ? std::filesystem::last_write_time(file) : std::filesystem::file_time_type::min();
  std::ofstream(file) << text;
  if (std::filesystem::last_write_time(file) <= before) std::filesystem::last_write_time(file, before + 1s);
}

json mlp_job(const std::string& name, const std::optional<std::string>& deadline) {
  json job = joule::testing::mlp_training_job(name, {"sleep", "0.5"});
  if (deadline) job["constraints"] = {{"deadline", *deadline}};
  return job;
}

}  // namespace

TEST(CarbonTest, min_carbon_waits_for_a_cleaner_window_and_jobs_are_accounted_in_grams) {
  joule::testing::TempDir dir;
  const auto signal = dir / "carbon.csv";
  // Dirty now, clean from 20 minutes on, dirty again after two hours.
  write_signal(signal, fmt::format("time,value\n{},500\n{},50\n{},500\n{},500\n", at(-30min), at(20min), at(120min),
                                   at(240min)));
  dir.write("policies/00-placement.toml", "[placement]\nobjective = \"min-carbon\"\n");
  const std::string config = fmt::format(
      "[node]\nname = \"lab\"\n[policy]\ndirectory = \"{}\"\n[carbon]\nfile = \"{}\"\nrefresh_seconds = 0.2\n"
      "[[devices]]\nname = \"sim:laptop-cpu\"\nprobes = 40\nruns_jobs = true\n[probing]\nenabled = false\n",
      (dir / "policies").string(), signal.string());
  DaemonProcess daemon({.config_toml = config});
  ASSERT_TRUE(daemon.start()) << daemon.log();

  auto signals = daemon.call("GET", "/v1/signals").second;
  EXPECT_EQ(signals["carbon"]["state"], "fresh") << signals.dump(2);
  EXPECT_EQ(signals["carbon"]["value_now"], 500.0);
  EXPECT_EQ(signals["carbon"]["lowest_ahead"]["value"], 50.0);
  EXPECT_EQ(signals["carbon"]["source"], "file " + signal.string());
  // Deferral needs an estimate: wait for the simulated device's model.
  const auto model_ready = wait_until([&] { return daemon.call("GET", "/v1/devices").second; },
                                      [](const json& d) { return d["devices"][0]["model"]["state"] == "ready"; });
  ASSERT_EQ(model_ready["devices"][0]["model"]["state"], "ready") << model_ready.dump(2);

  // With three hours of slack: it waits for the window at +20 min and says so.
  const auto deferred = daemon.submit(mlp_job("deferrable", at(180min)));
  ASSERT_FALSE(deferred.empty());
  auto shown =
      wait_until([&] { return daemon.call("GET", "/v1/jobs/" + deferred).second; },
                 [](const json& j) { return j.contains("waiting") && j["waiting"]["reason"] == "cleaner-window"; });
  ASSERT_EQ(shown["waiting"]["reason"], "cleaner-window") << shown.dump(2);
  EXPECT_NE(shown["waiting"]["message"].get<std::string>().find("less carbon than now"), std::string::npos);
  EXPECT_TRUE(shown["waiting"].contains("retry_at"));
  // Before it runs, each estimate says what it would emit if it started now (at 500 g/kWh).
  const auto& row = shown["estimate"][0];
  ASSERT_TRUE(row.contains("carbon")) << row.dump(2);
  EXPECT_NEAR(row["carbon"]["grams"].get<double>(), row["joules"]["mean"].get<double>() / 3.6e6 * 500.0, 1e-9);
  EXPECT_EQ(row["carbon"]["signal"], "file " + signal.string());
  const std::string server = "http://127.0.0.1:" + std::to_string(daemon.port());
  auto [queued_code, queued_text] = joule::testing::run_program({JOULECTL_BINARY, "--server", server, "job", deferred});
  EXPECT_NE(queued_text.find("g CO2e if it started now (500 g/kWh)"), std::string::npos) << queued_text;

  // Without a deadline it is never deferred: it runs now, at 500 g/kWh, and is accounted so.
  const auto now_job = daemon.submit(mlp_job("now", std::nullopt));
  auto done = daemon.wait_state(now_job, {"succeeded", "failed"});
  ASSERT_EQ(done["state"], "succeeded") << done.dump(2);
  ASSERT_TRUE(done.contains("carbon")) << done.dump(2);
  const double joules = done["energy"]["joules"];
  EXPECT_NEAR(done["carbon"]["grams"].get<double>(), joules / 3.6e6 * 500.0, 1e-9 + joules / 3.6e6 * 1e-6);
  EXPECT_EQ(done["carbon"]["intensity"], 500.0);
  EXPECT_EQ(done["carbon"]["signal"], "file " + signal.string());
  EXPECT_EQ(done["carbon"]["joules_source"], "simulated");
  EXPECT_EQ(done["carbon"]["measured"], false);
  const auto metrics = daemon.client().request("GET", "/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(
      metrics->body.find("joule_job_carbon_grams_total{device=\"sim:laptop-cpu\",node=\"lab\",source=\"simulated\"}"),
      std::string::npos);
  EXPECT_NE(metrics->body.find("joule_grid_carbon_intensity_grams_per_kwh{node=\"lab\"} 500"), std::string::npos);
  auto [job_code, job_text] = joule::testing::run_program({JOULECTL_BINARY, "--server", server, "job", now_job});
  EXPECT_EQ(job_code, 0);
  EXPECT_NE(job_text.find("g/kWh over its run (file " + signal.string() + "; simulated joules)"), std::string::npos)
      << job_text;
  auto [signals_code, signals_text] = joule::testing::run_program({JOULECTL_BINARY, "--server", server, "signals"});
  EXPECT_EQ(signals_code, 0);
  EXPECT_NE(signals_text.find("500 g/kWh now (fresh: file "), std::string::npos) << signals_text;
  EXPECT_NE(signals_text.find("cleanest:  50 g/kWh from "), std::string::npos) << signals_text;

  // A bad edit: named with its line, counted, and the forecast in force does not change.
  write_signal(signal, fmt::format("time,value\n{},500\n{},lots\n", at(-30min), at(20min)));
  signals = wait_until([&] { return daemon.call("GET", "/v1/signals").second; },
                       [](const json& s) { return !s["carbon"]["last_error"].is_null(); });
  EXPECT_NE(signals["carbon"]["last_error"].get<std::string>().find("carbon.csv:3"), std::string::npos)
      << signals.dump(2);
  EXPECT_EQ(signals["carbon"]["lowest_ahead"]["value"], 50.0);
  EXPECT_EQ(daemon.call("GET", "/v1/jobs/" + deferred).second["state"], "queued");

  // The forecast changes to a flat grid: no window is cleaner than now, so the job runs.
  write_signal(signal, fmt::format("time,value\n{},120\n{},120\n", at(-30min), at(240min)));
  done = daemon.wait_state(deferred, {"succeeded", "failed"});
  EXPECT_EQ(done["state"], "succeeded") << done.dump(2);
  EXPECT_EQ(done["carbon"]["intensity"], 120.0) << done.dump(2);

  // A job its owner holds back waits for its own time, whatever the grid.
  json later = mlp_job("later", at(180min));
  later["constraints"]["not_before"] = at(60min);
  const auto held = daemon.submit(later);
  ASSERT_FALSE(held.empty());
  shown = wait_until([&] { return daemon.call("GET", "/v1/jobs/" + held).second; },
                     [](const json& j) { return j.contains("waiting") && j["waiting"]["reason"] == "not-before"; });
  EXPECT_EQ(shown["waiting"]["reason"], "not-before") << shown.dump(2);
  EXPECT_EQ(shown["spec"]["constraints"]["not_before"].get<std::string>().substr(0, 16), at(60min).substr(0, 16));
}

// Budgets in grams and money and a price signal, through a real jouled: a job is accounted in
// grams and money at constant signals, the budgets count both, a grams budget too small for a
// second job holds it and says so in grams, and a budget in another currency than [price]'s is
// refused at reload.
TEST(CarbonTest, budgets_in_grams_and_money_count_jobs_at_the_signals_and_hold_what_would_overrun) {
  joule::testing::TempDir dir;
  auto budgets = [&](const std::string& grams, const std::string& currency) {
    dir.write("policies/10-budgets.toml",
              fmt::format("[[budgets]]\nname = \"grams-day\"\nscope = \"node\"\ntarget = \"lab\"\ngrams = {}\n"
                          "calendar = \"day\"\n[[budgets]]\nname = \"money-day\"\nscope = \"node\"\ntarget = \"lab\"\n"
                          "cost = 100\ncurrency = \"{}\"\ncalendar = \"day\"\n",
                          grams, currency));
  };
  budgets("1_000_000", "EUR");
  const std::string config = fmt::format(
      "[node]\nname = \"lab\"\n[policy]\ndirectory = \"{}\"\n[carbon]\nintensity = 500\n"
      "[price]\ncurrency = \"EUR\"\nper_kwh = 0.3\n"
      "[[devices]]\nname = \"sim:laptop-cpu\"\nprobes = 40\nruns_jobs = true\n[probing]\nenabled = false\n",
      (dir / "policies").string());
  DaemonProcess daemon({.config_toml = config});
  ASSERT_TRUE(daemon.start()) << daemon.log();
  const auto signals = daemon.call("GET", "/v1/signals").second;
  EXPECT_EQ(signals["price"]["state"], "constant") << signals.dump(2);
  EXPECT_EQ(signals["price"]["value_now"], 0.3);
  EXPECT_EQ(signals["price"]["unit"], "EUR/kWh");
  // Budgets in grams or money need an estimate to admit a job: wait for the model.
  const auto model_ready = wait_until([&] { return daemon.call("GET", "/v1/devices").second; },
                                      [](const json& d) { return d["devices"][0]["model"]["state"] == "ready"; });
  ASSERT_EQ(model_ready["devices"][0]["model"]["state"], "ready") << model_ready.dump(2);

  const auto first = daemon.submit(mlp_job("first", std::nullopt));
  auto done = daemon.wait_state(first, {"succeeded", "failed"});
  ASSERT_EQ(done["state"], "succeeded") << done.dump(2);
  const double joules = done["energy"]["joules"];
  const double grams = done["carbon"]["grams"];
  EXPECT_NEAR(grams, joules / 3.6e6 * 500.0, 1e-9 + grams * 1e-9);
  ASSERT_TRUE(done.contains("cost")) << done.dump(2);
  EXPECT_NEAR(done["cost"]["amount"].get<double>(), joules / 3.6e6 * 0.3, 1e-12 + joules * 1e-15);
  EXPECT_EQ(done["cost"]["currency"], "EUR");
  EXPECT_EQ(done["cost"]["signal"], "constant 0.3 EUR/kWh");
  EXPECT_EQ(done["cost"]["joules_source"], "simulated");
  EXPECT_EQ(done["cost"]["measured"], false);

  // The budgets counted it in their units.
  const auto shown = wait_until([&] { return daemon.call("GET", "/v1/budgets").second; },
                                [](const json& b) { return b["budgets"][0]["spent"].get<double>() > 0.0; });
  const json& in_grams = shown["budgets"][0];
  const json& in_money = shown["budgets"][1];
  EXPECT_EQ(in_grams["unit"], "grams") << shown.dump(2);
  EXPECT_NEAR(in_grams["spent"].get<double>(), grams, 1e-6 + grams * 1e-9);
  EXPECT_TRUE(in_grams["spent_joules"].is_null());
  EXPECT_EQ(in_money["unit"], "money");
  EXPECT_EQ(in_money["currency"], "EUR");
  EXPECT_NEAR(in_money["spent"].get<double>(), done["cost"]["amount"].get<double>(), 1e-9);
  const auto metrics = daemon.client().request("GET", "/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("joule_budget_spent_grams{budget=\"grams-day\"}"), std::string::npos);
  EXPECT_NE(metrics->body.find("joule_budget_limit_cost{budget=\"money-day\",currency=\"EUR\"} 100"),
            std::string::npos);
  EXPECT_NE(metrics->body.find("joule_grid_price_per_kwh{currency=\"EUR\",node=\"lab\"} 0.3"), std::string::npos);
  EXPECT_NE(metrics->body.find("joule_job_cost_total{currency=\"EUR\",device=\"sim:laptop-cpu\",node=\"lab\","
                               "source=\"simulated\"}"),
            std::string::npos);
  const std::string server = "http://127.0.0.1:" + std::to_string(daemon.port());
  auto [code, text] = joule::testing::run_program({JOULECTL_BINARY, "--server", server, "budgets"});
  EXPECT_EQ(code, 0);
  EXPECT_NE(text.find("100.00 EUR"), std::string::npos) << text;
  auto [job_code, job_text] = joule::testing::run_program({JOULECTL_BINARY, "--server", server, "job", first});
  EXPECT_NE(job_text.find("EUR at 0.3 per kWh over its run (constant 0.3 EUR/kWh; simulated joules)"),
            std::string::npos)
      << job_text;

  // A grams budget with room for half of another such job (by its estimate): the next one waits,
  // in grams.
  const double estimated_grams = done["estimate"][0]["joules"]["mean"].get<double>() / 3.6e6 * 500.0;
  budgets(fmt::format("{:.6f}", grams + 0.5 * estimated_grams), "EUR");
  daemon.signal(SIGHUP);
  ASSERT_TRUE(daemon.wait_notification("config reloaded", 10s)) << daemon.log();
  const auto second = daemon.submit(mlp_job("second", std::nullopt));
  const auto held =
      wait_until([&] { return daemon.call("GET", "/v1/jobs/" + second).second; },
                 [](const json& j) { return j.contains("waiting") && j["waiting"]["reason"] == "budget"; });
  ASSERT_TRUE(held.contains("waiting") && held["waiting"]["reason"] == "budget") << held.dump(2);
  EXPECT_EQ(held["waiting"]["unit"], "grams");
  EXPECT_EQ(held["waiting"]["rule"], "grams-day");
  EXPECT_NE(held["waiting"]["message"].get<std::string>().find("g CO2e left of"), std::string::npos)
      << held["waiting"].dump(2);
  EXPECT_FALSE(held["waiting"].contains("remaining_joules"));
  ASSERT_TRUE(held["estimate"][0].contains("cost")) << held["estimate"][0].dump(2);

  // A money budget in dollars cannot be counted at a price in euros: the reload is refused.
  budgets("1_000_000", "USD");
  daemon.signal(SIGHUP);
  ASSERT_TRUE(daemon.wait_notification("last reload refused", 10s)) << daemon.log();
  EXPECT_NE(daemon.log().find("budget money-day is in USD but jouled.toml's [price] is in EUR"), std::string::npos);
  EXPECT_EQ(daemon.call("GET", "/v1/jobs/" + second).second["state"], "queued");
}
