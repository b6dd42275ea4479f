#pragma once
// What joulectl shows while it waits for a job (`submit --wait`) or a probe run (`probe --wait`):
// one line, rewritten in place on a terminal, and one line per change of state elsewhere (a pipe,
// a log file), so that logs read as a history instead of a flood.

#include <cstddef>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

namespace joule::cli {

/// A progress line on `out`. On a terminal each show() returns to the start of the line ("\r"),
/// writes its text cut to the terminal's width (a wrapped line could not be rewritten) and blanks
/// what is left of a longer earlier text: no escape sequences, so a dumb terminal shows it too.
/// Elsewhere show() writes a whole line only when its `key` differs from the last one shown.
/// Not thread-safe.
class ProgressLine {
 public:
  /// `terminal`: rewrite in place; `columns`: the terminal's width (ignored otherwise).
  ProgressLine(std::ostream& out, bool terminal, std::size_t columns = 80);
  /// finish(): an error message that follows (an exception unwinding) starts on a clean line.
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  /// For standard error: a terminal if isatty(2), as wide as TIOCGWINSZ says (80 if it cannot).
  static ProgressLine for_stderr(std::ostream& out);

  /// Shows `text`; `key` stands for its state (e.g. "running") where lines are not rewritten.
  void show(const std::string& key, const std::string& text);
  /// On a terminal, blanks the line and returns to its start, so that what follows starts clean;
  /// elsewhere nothing. show() may be called again afterwards.
  void finish();

 private:
  std::ostream& out_;
  bool terminal_;
  std::size_t columns_;
  std::size_t shown_ = 0;  // code points on the terminal's line now
  std::string last_text_;
  std::string last_key_;
  bool any_ = false;
};

/// The line for a job, from GET /v1/jobs/{id}: "job 1a2b3c4d (lenet): running on cpu for 1 min
/// 05 s, epoch 3 of 10, 451.2 J so far (rapl), projected 1.50 kJ"; for a queued job why it waits,
/// for an ended one how it ended. Fields the answer lacks (no progress reported, no meter reading
/// yet) are left out.
std::string job_progress_text(const nlohmann::json& job);
/// What counts as a change for a job's line: its state, and why it waits while queued.
std::string job_progress_key(const nlohmann::json& job);

/// The line for a probe run, from GET /v1/probes/{id}: "probe run p17-2 on cpu: running for 23 s
/// of 60 s, 14 probes (1 pre-empted), 512.3 J so far (rapl)". `now_ms`: Unix milliseconds now,
/// for the time it has run (started_ms is the server's clock).
std::string probe_progress_text(const nlohmann::json& run, long long now_ms);

/// "4.2 s", "1 min 05 s", "2 h 03 min".
std::string duration_text(double seconds);
/// "812.4 J", "1.50 kJ", "3.20 MJ".
std::string joules_text(double joules);

}  // namespace joule::cli
