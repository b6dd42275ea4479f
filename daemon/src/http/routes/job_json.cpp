#include "http/routes/job_json.hpp"

#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "jobs/job_record.hpp"
#include "joule/common/energy_source.hpp"
#include "joule/common/text.hpp"

namespace joule::daemon::routes {

using nlohmann::json;
using schedulers::JobState;

namespace {

json optional_json(const std::optional<std::int64_t>& millis) {
  return millis ? json(schedulers::format_rfc3339(*millis)) : json(nullptr);
}

Error invalid(std::string message, std::string where) {
  return make_error(ErrorCode::invalid_argument, std::move(message), std::move(where));
}

}  // namespace

json projection_json(const schedulers::Projection& projection, const std::string& source) {
  return {{"joules", {{"mean", projection.total.mean_joules}, {"std", std::sqrt(projection.total.variance)}}},
          {"method", projection.method},
          {"stable_epochs", projection.stable_epochs},
          {"stable_from_epoch", projection.stable_from_epoch},
          {"seconds_remaining", projection.seconds_remaining},
          {"source", source.empty() ? json(nullptr) : json(source)}};
}

namespace {

// JSON as the API writes it: compact, any ill-formed UTF-8 replaced.
std::string written(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

// Whether a job's stored estimate is shown with something added to it: what it would emit or
// cost on each device if it started now, before it runs while a carbon or price signal is in force.
bool adds_to_estimate(const JobView& view, const SignalFeeds& signals) {
  auto in_force = [&](const GridSignalFeed* feed) { return feed && feed->in_force(view.at_ms).signal; };
  if (view.job().row.estimate_json.empty() || (!in_force(signals.carbon) && !in_force(signals.price))) return false;
  const auto state = schedulers::job_state_from_string(view.job().shown.state).value_or(view.job().state);
  return state == JobState::queued || state == JobState::placed;
}

// Every field of a job; its "estimate" only `with_estimate` (job_text splices the stored text in).
json job_fields(const JobView& view, bool with_events, const SignalFeeds& signals, bool with_estimate);

}  // namespace

json job_json(const JobView& view, bool with_events, const SignalFeeds& signals) {
  return job_fields(view, with_events, signals, true);
}

namespace {

// Appends a job's text to `out` (job_text).
void append_job_text(std::string& out, const JobView& view, bool with_events, const SignalFeeds& signals) {
  const std::string& stored = view.job().row.estimate_json;
  if (stored.empty() || adds_to_estimate(view, signals)) {
    out += written(job_json(view, with_events, signals));
    return;
  }
  // The stored estimate is JSON text already (stored_estimates): parsing it to write it out
  // again was most of a page's time (~35 ms of the loop for 1,000 estimated queued jobs).
  out += written(job_fields(view, with_events, signals, false));
  out.pop_back();  // the object's closing brace
  out.append(",\"estimate\":").append(stored).push_back('}');
}

}  // namespace

std::string job_text(const JobView& view, bool with_events, const SignalFeeds& signals) {
  std::string text;
  append_job_text(text, view, with_events, signals);
  return text;
}

std::string job_page_text(const JobPage& page, const SignalFeeds& signals) {
  std::string text = "{\"jobs\":[";
  // Grown once: appending a page of a thousand estimated jobs otherwise copied it a dozen times.
  text.reserve(page.jobs.size() * 2048);
  for (std::size_t i = 0; i < page.jobs.size(); ++i) {
    if (i > 0) text.push_back(',');
    append_job_text(text, page.jobs[i], false, signals);
  }
  text.append("],\"next\":").append(page.next ? json(*page.next).dump() : "null");
  text.append(",\"total\":").append(std::to_string(page.total)).push_back('}');
  return text;
}

namespace {

json job_fields(const JobView& view, bool with_events, const SignalFeeds& signals, bool with_estimate) {
  const JobRecord& job = view.job();
  // What changes as it runs is shown as committed: a state only once it would survive a crash.
  const auto& row = job.row;
  const ShownRow& shown = job.shown;
  const auto shown_state = schedulers::job_state_from_string(shown.state).value_or(job.state);
  json energy = nullptr;
  if (shown.energy_joules) {
    const bool measured = is_measurement(shown.energy_source);
    energy = {{"joules", *shown.energy_joules},
              {"source", shown.energy_source},
              {"measured", measured},
              {"scope", view.energy_scope},
              {"partial", shown.energy_partial}};
  }
  const std::optional<double>& seconds = view.seconds;
  json out = {{"id", row.id},
              {"name", row.name},
              {"owner", row.owner},
              {"project", job.spec.project.empty() ? json(nullptr) : json(job.spec.project)},
              {"state", shown.state},
              {"priority", row.priority},
              {"device", shown.device.empty() ? json(nullptr) : json(shown.device)},
              {"submitted_at", schedulers::format_rfc3339(row.submitted_ms)},
              {"started_at", optional_json(shown.started_ms)},
              {"finished_at", optional_json(shown.finished_ms)},
              {"seconds", seconds ? json(*seconds) : json(nullptr)},
              {"exit_code", shown.exit_code ? json(*shown.exit_code) : json(nullptr)},
              {"reason", shown.reason},
              {"energy", energy},
              {"cancel_requested", job.cancel_requested}};
  // A job on several GPUs: all of them, its device first; the cores a job runs on where it has
  // its own (placement's choice for a range).
  if (!row.companions.empty() && !shown.device.empty()) {
    out["devices"] = json::array({shown.device});
    for (const auto& other : row.companions) out["devices"].push_back(other);
  }
  if (!shown.device.empty() && job.run_cores() > 0) out["cores"] = job.run_cores();
  if (with_estimate) {
    out["estimate"] = row.estimate_json.empty() ? json(nullptr) : json::parse(row.estimate_json, nullptr, false);
    // Before it runs: what it would emit and cost on each device if it started now.
    if (adds_to_estimate(view, signals))
      for (const GridSignalFeed* feed : {signals.carbon, signals.price})
        if (feed) feed->add_estimates(out["estimate"], view.at_ms);
  }
  // Feedback: the metered energy beside the estimate for the device the job ran on (only when
  // both come from the same source: modelled joules are not compared with measured ones).
  if (shown.carbon_grams) {
    // Grams are as sure as the joules under them: modelled joules make modelled grams.
    out["carbon"] = {{"grams", *shown.carbon_grams},
                     {"intensity", shown.carbon_intensity ? json(*shown.carbon_intensity) : json(nullptr)},
                     {"unit", "gCO2e"},
                     {"signal", shown.carbon_signal},
                     {"joules_source", shown.energy_source},
                     {"measured", is_measurement(shown.energy_source)}};
  }
  if (shown.cost) {
    // A cost is as sure as the joules under it, as grams are.
    out["cost"] = {{"amount", *shown.cost},
                   {"currency", shown.cost_currency},
                   {"price_per_kwh", shown.cost_price ? json(*shown.cost_price) : json(nullptr)},
                   {"signal", shown.cost_signal},
                   {"joules_source", shown.energy_source},
                   {"measured", is_measurement(shown.energy_source)}};
  }
  if (shown.energy_joules) {
    const auto* estimate = find_estimate(job.estimates, shown.device);
    // A job that ran at a measured setting is compared with its estimate there.
    std::optional<DeviceEstimate> at_setting;
    if (const auto ran_at = job.setting_ran_at(); estimate && ran_at) at_setting = estimate->at(*ran_at);
    if (at_setting) estimate = &*at_setting;
    if (estimate && estimate->ok && estimate->joules_mean > 0.0 &&
        estimate->source == energy_source_from_string(shown.energy_source))
      out["estimate_error"] = {{"estimated_joules", estimate->joules_mean},
                               {"estimated_std", estimate->joules_std},
                               {"metered_joules", *shown.energy_joules},
                               {"relative", (*shown.energy_joules - estimate->joules_mean) / estimate->joules_mean},
                               {"source", shown.energy_source}};
  }
  if (shown_state == JobState::queued) {
    // Why it waits: the last placement pass's reason, or its place in the queue.
    json waiting;
    if (job.waiting && job.waiting->kind != schedulers::WaitReason::Kind::behind) {
      const auto& why = *job.waiting;
      waiting = {{"reason", schedulers::to_string(why.kind)}, {"message", why.message}};
      if (!why.device.empty()) waiting["device"] = why.device;
      if (!why.rule.empty()) waiting["rule"] = why.rule;
      if (why.limit) waiting["limit"] = *why.limit;
      // A budget's figures in its unit; joule budgets' also under their older names.
      if (why.unit) waiting["unit"] = schedulers::to_string(*why.unit);
      if (why.remaining) waiting["remaining"] = *why.remaining;
      if (why.needed) waiting["needed"] = *why.needed;
      if (why.unit == schedulers::BudgetUnit::joules) {
        if (why.remaining) waiting["remaining_joules"] = *why.remaining;
        if (why.needed) waiting["needed_joules"] = *why.needed;
      }
      if (why.retry_at) waiting["retry_at"] = schedulers::format_rfc3339(*why.retry_at);
    } else {
      const std::size_t ahead = view.jobs_ahead.value_or(0);
      waiting = {
          {"reason", "behind"},
          {"message", ahead == 0 ? std::string("next in line; waiting for a placement pass")
                                 : fmt::format("{} job{} ahead of it in the queue", ahead, ahead == 1 ? "" : "s")}};
    }
    out["waiting"] = waiting;
  }
  if (job.last_report) {
    const auto& last = *job.last_report;
    out["progress"] = {
        {"epoch", last.epoch}, {"epochs", last.epochs}, {"reported_at", schedulers::format_rfc3339(last.at)}};
    for (const auto& [key, value] : job.training_figures.items()) out["progress"][key] = value;
  }
  // While it runs the job has no energy source of its own yet: its device's meter is it, or what
  // its node metered it with (Slurm's accounting).
  const auto running_source = [&] {
    return !row.energy_source.empty() ? row.energy_source
           : !job.used_source.empty() ? job.used_source
                                      : view.meter_source;
  };
  if (job.projection && job.projection->step) out["projection"] = projection_json(*job.projection, running_source());
  if (shown_state == JobState::running || shown_state == JobState::throttled) {
    if (const std::string source = running_source(); job.used_joules && !source.empty())
      out["energy_so_far"] = {{"joules", *job.used_joules}, {"source", source}, {"measured", is_measurement(source)}};
  }
  if (const auto& builtin = job.spec.run.builtin) {
    // Where the trainer keeps its checkpoints, and so the trained weights (model.pt): in the work
    // directory of the node it ran on, unless the job named a directory.
    json where = {{"checkpoints", builtin->checkpoints}};
    if (!view.node.empty()) where["node"] = view.node;
    const std::filesystem::path& dir = view.checkpoint_directory;
    if (builtin->checkpoints && !dir.empty()) {
      where["checkpoint_directory"] = dir.string();
      where["weights"] = (dir / "model.pt").string();
      if (with_events && view.node.empty()) {
        std::error_code ec;
        where["weights_saved"] = std::filesystem::exists(dir / "model.pt", ec);
      }
    }
    out["builtin"] = where;
  }
  if (job.paused || job.cpu_quota || job.gpu_limit_watts) {
    out["throttle"] = {{"paused", job.paused},
                       {"cpu_quota", job.cpu_quota ? json(*job.cpu_quota) : json(nullptr)},
                       {"gpu_power_limit_watts", job.gpu_limit_watts ? json(*job.gpu_limit_watts) : json(nullptr)}};
  }
  if (!job.spec.knobs.empty() || job.chosen_setting) {
    // Asked for, or chosen by placement, and what is in force this run (null before it starts,
    // after it ends, or when refused: its events say which).
    out["knobs"] = {{"requested", schedulers::to_json(job.spec.knobs)},
                    {"in_force", job.knobs_in_force ? json(*job.knobs_in_force) : json(nullptr)}};
    if (const auto& chosen = job.chosen_setting) {
      const auto& at = chosen->at_setting;
      const auto& base = chosen->at_default;
      json shown = {{"knob", chosen->setting.knob},
                    {"value", chosen->setting.value},
                    {"label", chosen->setting.label},
                    {"goal", chosen->goal},
                    {"predicted",
                     {{"joules", at.joules_mean},
                      {"seconds", at.seconds_mean},
                      {"joules_at_defaults", base.joules_mean},
                      {"seconds_at_defaults", base.seconds_mean},
                      {"energy_saving", base.joules_mean > 0 ? 1.0 - at.joules_mean / base.joules_mean : 0.0},
                      {"slowdown", base.seconds_mean > 0 ? at.seconds_mean / base.seconds_mean - 1.0 : 0.0}}}};
      // What it used against what was predicted at the setting, once metered whole.
      if (row.energy_joules && !row.energy_partial && row.finished_ms && at.joules_mean > 0)
        shown["measured"] = {{"joules", *row.energy_joules},
                             {"source", row.energy_source},
                             {"ratio_to_predicted", *row.energy_joules / at.joules_mean}};
      if (const auto* found = job.check_result()) {
        const auto& check = *found;
        shown["check"] = {{"kept", check.kept}, {"why", check.why}};
        if (check.setting_epoch > 0) {
          shown["check"]["setting_epoch"] = check.setting_epoch;
          shown["check"]["default_epoch"] = check.default_epoch;
          shown["check"]["energy_ratio"] = check.energy_ratio;
          shown["check"]["time_ratio"] = check.time_ratio;
        }
      }
      out["knobs"]["chosen"] = std::move(shown);
    }
  }
  if (with_events) {
    out["spec"] = json::parse(row.spec_json, nullptr, false);
    json events = json::array();
    for (std::size_t i = 0; i < job.events_shown && i < job.events.size(); ++i) {
      const auto& event = job.events[i];
      events.push_back(
          {{"at", schedulers::format_rfc3339(event.at_ms)}, {"state", event.state}, {"message", event.message}});
    }
    out["events"] = events;
  }
  return out;
}

}  // namespace

Result<ProgressReport> parse_progress(const json& body) {
  if (!body.is_object()) return invalid("the body must be a JSON object {\"epoch\": k, \"epochs\": N}", "");
  const auto epoch_it = body.find("epoch");
  const auto epochs_it = body.find("epochs");
  if (epoch_it == body.end() || !epoch_it->is_number_integer() || epoch_it->get<std::int64_t>() < 1)
    return invalid("epoch must be an integer >= 1 (epochs finished so far)", "/epoch");
  if (epochs_it == body.end() || !epochs_it->is_number_integer() || epochs_it->get<std::int64_t>() < 1 ||
      epochs_it->get<std::int64_t>() > 1'000'000)
    return invalid("epochs must be an integer between 1 and 1000000 (the epochs the job will run)", "/epochs");
  ProgressReport report;
  report.epoch = epoch_it->get<std::int64_t>();
  report.epochs = epochs_it->get<std::int64_t>();
  if (report.epoch > report.epochs)
    return invalid(fmt::format("epoch {} is more than epochs {}", report.epoch, report.epochs), "/epoch");
  // What training says of itself (the built-in trainer sends these): shown with the progress.
  for (const char* key : {"loss", "accuracy"}) {
    if (const auto it = body.find(key); it != body.end() && !it->is_null()) {
      if (!it->is_number() || !std::isfinite(it->get<double>()))
        return invalid(fmt::format("{} must be a finite number", key), fmt::format("/{}", key));
      report.figures[key] = it->get<double>();
    }
  }
  if (const auto it = body.find("firing_rates"); it != body.end()) {
    if (!it->is_object() || it->size() > 1024)
      return invalid("firing_rates must be an object of at most 1024 layers, each a share in [0, 1]", "/firing_rates");
    for (const auto& [layer, rate] : it->items()) {
      if (!rate.is_number() || rate.get<double>() < 0.0 || rate.get<double>() > 1.0 || layer.size() > 256)
        return invalid("firing rates are shares in [0, 1], by layer names of at most 256 characters",
                       "/firing_rates/" + std::string(printable(layer, 100)));
    }
    report.figures["firing_rates"] = *it;
  }
  return report;
}

json progress_json(const std::string& id, const ProgressReport& report, const ProgressAnswer& answer) {
  json out = {{"id", id}, {"epoch", report.epoch}, {"epochs", report.epochs}};
  if (!answer.joules || !answer.projection) {
    out["energy"] = nullptr;
    out["note"] = answer.note;
    return out;
  }
  out["energy"] = {{"joules", *answer.joules}, {"source", answer.source}, {"partial", answer.partial}};
  out["projection"] = projection_json(*answer.projection, answer.source);
  return out;
}

}  // namespace joule::daemon::routes
