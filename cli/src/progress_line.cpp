#include "joule/cli/progress_line.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace joule::cli {
namespace {

using nlohmann::json;

bool is_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

std::size_t code_points(const std::string& text) {
  return static_cast<std::size_t>(std::count_if(text.begin(), text.end(), [](char c) { return !is_continuation(c); }));
}

// The first `count` code points of `text`.
std::string first_code_points(const std::string& text, std::size_t count) {
  std::size_t seen = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (is_continuation(text[i])) continue;
    if (seen == count) return text.substr(0, i);
    ++seen;
  }
  return text;
}

std::string string_or(const json& object, const char* key, const std::string& fallback = {}) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : fallback;
}

const json* object_at(const json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_object() ? &*it : nullptr;
}

// "451.2 J so far (rapl)" from {"joules", "source"}; empty without joules.
std::string energy_part(const json* energy, const char* suffix) {
  if (!energy || !energy->contains("joules") || !(*energy)["joules"].is_number()) return {};
  const std::string source = string_or(*energy, "source");
  return fmt::format("{}{}{}", joules_text((*energy)["joules"].get<double>()), suffix,
                     source.empty() ? "" : " (" + source + ")");
}

}  // namespace

ProgressLine::ProgressLine(std::ostream& out, bool terminal, std::size_t columns)
    : out_(out), terminal_(terminal), columns_(std::max<std::size_t>(columns, 2)) {}

ProgressLine::~ProgressLine() { finish(); }

ProgressLine ProgressLine::for_stderr(std::ostream& out) {
  const bool terminal = ::isatty(STDERR_FILENO) == 1;
  winsize size{};
  std::size_t columns = 80;
  if (terminal && ::ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) columns = size.ws_col;
  return ProgressLine(out, terminal, columns);
}

void ProgressLine::show(const std::string& key, const std::string& text) {
  if (!terminal_) {
    if (any_ && key == last_key_) return;
    out_ << text << '\n' << std::flush;
    last_key_ = key;
    any_ = true;
    return;
  }
  // One column short of the width: some terminals wrap as soon as the last column is written.
  const std::string fitted = first_code_points(text, columns_ - 1);
  if (any_ && fitted == last_text_) return;
  const std::size_t width = code_points(fitted);
  out_ << '\r' << fitted << std::string(shown_ > width ? shown_ - width : 0, ' ') << std::flush;
  if (shown_ > width) out_ << '\r' << fitted << std::flush;
  shown_ = width;
  last_text_ = fitted;
  last_key_ = key;
  any_ = true;
}

void ProgressLine::finish() {
  if (terminal_ && shown_ > 0) out_ << '\r' << std::string(shown_, ' ') << '\r' << std::flush;
  shown_ = 0;
  last_text_.clear();
  any_ = false;
}

std::string duration_text(double seconds) {
  if (!(seconds >= 0)) seconds = 0;
  if (seconds < 60) return fmt::format("{:.1f} s", seconds);
  const auto whole = static_cast<long long>(std::floor(seconds));
  if (whole < 3600) return fmt::format("{} min {:02} s", whole / 60, whole % 60);
  return fmt::format("{} h {:02} min", whole / 3600, (whole % 3600) / 60);
}

std::string joules_text(double joules) {
  const double magnitude = std::abs(joules);
  if (magnitude >= 1e6) return fmt::format("{:.2f} MJ", joules / 1e6);
  if (magnitude >= 1e3) return fmt::format("{:.2f} kJ", joules / 1e3);
  return fmt::format("{:.1f} J", joules);
}

std::string job_progress_key(const json& job) {
  std::string key = string_or(job, "state");
  if (const auto* waiting = object_at(job, "waiting")) key += "/" + string_or(*waiting, "reason");
  if (const auto* throttle = object_at(job, "throttle"); throttle && throttle->value("paused", false)) key += "/paused";
  return key;
}

std::string job_progress_text(const json& job) {
  const std::string state = string_or(job, "state", "?");
  std::string text = fmt::format("job {} ({}): {}", string_or(job, "id").substr(0, 8), string_or(job, "name"), state);
  if (const auto* waiting = object_at(job, "waiting")) return text + ": " + string_or(*waiting, "message");

  if (const auto* throttle = object_at(job, "throttle")) {
    std::vector<std::string> how;
    if (throttle->value("paused", false)) how.emplace_back("paused");
    if ((*throttle)["cpu_quota"].is_number())
      how.push_back(fmt::format("cpu quota {:.2f} CPUs", (*throttle)["cpu_quota"].get<double>()));
    if ((*throttle)["gpu_power_limit_watts"].is_number())
      how.push_back(fmt::format("GPU limit {:.0f} W", (*throttle)["gpu_power_limit_watts"].get<double>()));
    if (!how.empty()) text += fmt::format(" ({})", fmt::join(how, ", "));
  }
  const std::string device = string_or(job, "device");
  const bool ended = state == "succeeded" || state == "failed" || state == "cancelled";
  if (!device.empty()) text += " on " + device;
  if (job.contains("seconds") && job["seconds"].is_number())
    text += (ended ? " after " : " for ") + duration_text(job["seconds"].get<double>());
  if (ended) {
    if (const std::string energy = energy_part(object_at(job, "energy"), ""); !energy.empty()) text += ", " + energy;
    return text;
  }
  if (const auto* progress = object_at(job, "progress"))
    text += fmt::format(", epoch {} of {}", progress->value("epoch", 0), progress->value("epochs", 0));
  if (const std::string energy = energy_part(object_at(job, "energy_so_far"), " so far"); !energy.empty())
    text += ", " + energy;
  if (const auto* projection = object_at(job, "projection"); projection && projection->contains("joules"))
    text += ", projected " + joules_text((*projection)["joules"].value("mean", 0.0));
  return text;
}

std::string probe_progress_text(const json& run, long long now_ms) {
  const std::string state = string_or(run, "state", "?");
  std::string text = fmt::format("probe run {} on {}: {}", string_or(run, "id"), string_or(run, "device"), state);
  if (run.contains("started_ms") && run["started_ms"].is_number()) {
    const auto started = run["started_ms"].get<long long>();
    const auto until =
        run.contains("finished_ms") && run["finished_ms"].is_number() ? run["finished_ms"].get<long long>() : now_ms;
    const bool running = state == "running";
    text += (running ? " for " : " after ") + duration_text(static_cast<double>(std::max(0LL, until - started)) / 1e3);
    if (running && run.contains("requested_seconds") && run["requested_seconds"].is_number())
      text += fmt::format(" of {:.0f} s", run["requested_seconds"].get<double>());
  }
  const auto count = [&run](const char* key) { return run.contains(key) ? run[key].get<long long>() : 0LL; };
  text += fmt::format(", {} probe{}", count("probes"), count("probes") == 1 ? "" : "s");
  std::vector<std::string> lost;
  if (count("preempted") > 0) lost.push_back(fmt::format("{} pre-empted", count("preempted")));
  if (count("failed") > 0) lost.push_back(fmt::format("{} failed", count("failed")));
  if (!lost.empty()) text += fmt::format(" ({})", fmt::join(lost, ", "));
  // The source is empty until a probe was metered: no joules to speak of before that.
  if (const auto* energy = object_at(run, "energy"); energy && !string_or(*energy, "source").empty())
    text += ", " + energy_part(energy, state == "running" ? " so far" : "");
  return text;
}

}  // namespace joule::cli
