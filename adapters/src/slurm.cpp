#include "joule/adapters/slurm.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "joule/common/text.hpp"

#include "joule/adapters/command_runner.hpp"

namespace joule::adapters {
namespace {

constexpr std::string_view kCommentPrefix = "joule:";

// A command's output, line by line, each trimmed (blank ones kept, as empty views).
std::vector<std::string_view> trimmed_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    lines.push_back(trim(text.substr(start, end - start)));
    start = end + 1;
  }
  return lines;
}

std::string upper(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

// "CANCELLED by 0" (sacct), "cancelled" → "CANCELLED".
std::string base_state(std::string_view state) {
  state = trim(state);
  return upper(state.substr(0, state.find_first_of(" +")));
}

bool all_digits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A job id we pass to a command: 123, or 123_4 for an array task. Never something that
// starts with '-' and reads as an option.
bool valid_slurm_id(std::string_view id) {
  const auto underscore = id.find('_');
  if (underscore == std::string_view::npos) return all_digits(id);
  return all_digits(id.substr(0, underscore)) && all_digits(id.substr(underscore + 1));
}

bool valid_env_name(std::string_view name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return c == '_' || std::isalnum(static_cast<unsigned char>(c)); });
}

// Slurm expands %j, %u... in --output/--error; "%%" is a literal '%'.
std::string literal_file_pattern(std::string_view path) {
  std::string out;
  for (char c : path) {
    out += c;
    if (c == '%') out += '%';
  }
  return out;
}

// "1795681705" (SLURM_TIME_FORMAT=%s) or "2026-11-26T08:28:24" (local time); Unknown, None,
// N/A and 0 mean no time.
std::optional<std::int64_t> parse_time_ms(std::string_view text) {
  text = trim(text);
  if (all_digits(text)) {
    const auto seconds = std::stoll(std::string(text));
    if (seconds <= 0) return std::nullopt;
    return seconds * 1000;
  }
  std::tm tm{};
  int consumed = 0;
  const std::string copy(text);
  if (std::sscanf(copy.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                  &tm.tm_min, &tm.tm_sec, &consumed) != 6 ||
      consumed != static_cast<int>(copy.size())) {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  tm.tm_isdst = -1;
  const std::time_t seconds = std::mktime(&tm);
  if (seconds <= 0) return std::nullopt;
  return static_cast<std::int64_t>(seconds) * 1000;
}

// Slurm's "code:signal" (scontrol ExitCode, sacct ExitCode).
void set_exit(SlurmJob& job, std::string_view text) {
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) return;
  const auto code = text.substr(0, colon);
  const auto signal = text.substr(colon + 1);
  if (!all_digits(code) || !all_digits(signal)) return;
  job.exit_code = std::stoi(std::string(code));
  if (const int s = std::stoi(std::string(signal)); s != 0) job.exit_signal = s;
}

// A job that has not started yet (or was cancelled before it did) reports an expected or
// fake start time; only a job that got nodes and left the pending states really started.
void finish_times(SlurmJob& job, std::optional<std::int64_t> start, std::optional<std::int64_t> end) {
  const bool waiting = slurm_phase(job.state) == SlurmPhase::waiting;
  if (!waiting && !job.nodes.empty()) job.start_ms = start;
  if (is_final_slurm_state(job.state)) {
    job.end_ms = end;
  } else {
    job.exit_code.reset();
    job.exit_signal.reset();
  }
}

// Numbers in squeue --json: 22.05 writes plain integers, later data_parser versions write
// {"set": true, "infinite": false, "number": N}.
std::optional<std::int64_t> json_number(const nlohmann::json& value) {
  if (value.is_number_integer()) return value.get<std::int64_t>();
  if (value.is_number()) return static_cast<std::int64_t>(value.get<double>());
  if (value.is_object()) {
    if (value.value("set", true) == false || value.value("infinite", false) == true) return std::nullopt;
    if (auto it = value.find("number"); it != value.end()) return json_number(*it);
  }
  return std::nullopt;
}

std::string json_string(const nlohmann::json& job, const char* key) {
  const auto it = job.find(key);
  if (it == job.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (auto n = json_number(*it)) return std::to_string(*n);
  // Later formats: a state is a list of flags, the base state first.
  if (it->is_array() && !it->empty() && it->front().is_string()) return it->front().get<std::string>();
  return {};
}

std::string one_line(std::string_view text) {
  std::string out;
  for (char c : trim(text)) {
    if (c == '\n') {
      out += "; ";
    } else if (c != '\r') {
      out += c;
    }
  }
  return out;
}

std::string describe_command(const std::string& tool, const std::vector<std::string>& args) {
  std::string line = tool;
  for (const auto& arg : args) {
    std::string shown = arg.size() > 100 ? arg.substr(0, 100) + "..." : arg;
    const bool plain = std::all_of(shown.begin(), shown.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) ||
             std::string_view("-_=.,:/%@+").find(c) != std::string_view::npos;
    });
    line += ' ';
    line += plain && !shown.empty() ? shown : shell_quote(shown);
  }
  return line;
}

bool contains(std::string_view text, std::string_view needle) { return text.find(needle) != std::string_view::npos; }

}  // namespace

// ---- states ----

std::optional<SlurmPhase> slurm_phase(std::string_view slurm_state) {
  using P = SlurmPhase;
  const std::string state = base_state(slurm_state);
  static const std::map<std::string, P, std::less<>> kPhases = {
      {"PENDING", P::waiting},      {"CONFIGURING", P::waiting}, {"REQUEUED", P::waiting},
      {"REQUEUE_HOLD", P::waiting}, {"REQUEUE_FED", P::waiting}, {"RESV_DEL_HOLD", P::waiting},
      {"RUNNING", P::running},      {"COMPLETING", P::running},  {"RESIZING", P::running},
      {"SIGNALING", P::running},    {"STAGE_OUT", P::running},   {"SUSPENDED", P::suspended},
      {"STOPPED", P::suspended},    {"COMPLETED", P::completed}, {"FAILED", P::failed},
      {"TIMEOUT", P::failed},       {"NODE_FAIL", P::failed},    {"OUT_OF_MEMORY", P::failed},
      {"BOOT_FAIL", P::failed},     {"DEADLINE", P::failed},     {"PREEMPTED", P::failed},
      {"SPECIAL_EXIT", P::failed},  {"CANCELLED", P::cancelled}, {"REVOKED", P::cancelled},
  };
  const auto it = kPhases.find(state);
  if (it == kPhases.end()) return std::nullopt;
  return it->second;
}

bool is_final_slurm_state(std::string_view slurm_state) {
  const auto phase = slurm_phase(slurm_state);
  return phase == SlurmPhase::completed || phase == SlurmPhase::failed || phase == SlurmPhase::cancelled;
}

// ---- identity and submission ----

std::string joule_comment(std::string_view joule_id) { return std::string(kCommentPrefix) + std::string(joule_id); }

std::string joule_id_from_comment(std::string_view comment) {
  comment = trim(comment);
  if (comment.substr(0, kCommentPrefix.size()) != kCommentPrefix) return {};
  const auto id = comment.substr(kCommentPrefix.size());
  return valid_joule_id(id) ? std::string(id) : std::string();
}

bool valid_joule_id(std::string_view joule_id) {
  if (joule_id.empty() || joule_id.size() > 128) return false;
  return std::all_of(joule_id.begin(), joule_id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == ':';
  });
}

std::string shell_quote(std::string_view word) {
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  out += '\'';
  return out;
}

std::string batch_script(const SlurmSubmission& submission) {
  std::string command;
  for (const auto& word : submission.argv) command += (command.empty() ? "" : " ") + shell_quote(word);
  if (submission.run_claim_dir.empty()) return "exec " + command + "\n";
  // Not exec: the shell stays to store the exit status. A signal Slurm sends reaches every
  // process of the job, and a command ended by signal N exits the shell with 128 + N, which
  // is what Joule reports for a signalled job either way.
  const std::string dir = shell_quote(submission.run_claim_dir);
  const std::string id = submission.joule_id;  // [A-Za-z0-9._:-] only: safe in a message
  return fmt::format(
      "claim={dir}/{id_q}\n"
      "mkdir -p {dir} 2>/dev/null\n"
      "if mkdir \"$claim\" 2>/dev/null; then\n"
      "  {command}\n"
      "  status=$?\n"
      "  echo \"$status\" > \"$claim/exit.new\" && mv -f \"$claim/exit.new\" \"$claim/exit\"\n"
      "  exit \"$status\"\n"
      "fi\n"
      "if [ ! -d \"$claim\" ]; then\n"
      "  echo \"joule: cannot create $claim; {id} runs without its guard against a second copy\" >&2\n"
      "  exec {command}\n"
      "fi\n"
      "waited=0\n"
      "while [ ! -f \"$claim/exit\" ] && [ \"$waited\" -lt {wait} ]; do sleep 1; waited=$((waited + 1)); done\n"
      "if [ -f \"$claim/exit\" ]; then\n"
      "  status=$(cat \"$claim/exit\")\n"
      "  echo \"joule: {id} already ran in an earlier Slurm job (exit status $status); not run again\" >&2\n"
      "  exit \"$status\"\n"
      "fi\n"
      "echo \"joule: {id} was started by an earlier Slurm job that has not ended; not run twice\" >&2\n"
      "exit {second}\n",
      fmt::arg("dir", dir), fmt::arg("id_q", shell_quote(id)), fmt::arg("id", id), fmt::arg("command", command),
      fmt::arg("wait", std::max(0, submission.run_claim_wait_seconds)), fmt::arg("second", kSecondCopyExit));
}

Result<std::vector<std::string>> sbatch_arguments(const SlurmSubmission& s) {
  auto bad = [](std::string field, std::string why) {
    return make_error(ErrorCode::invalid_argument, std::move(why), std::move(field));
  };
  if (!valid_joule_id(s.joule_id)) {
    return bad("joule_id", fmt::format("joule id '{}' is not 1..128 of [A-Za-z0-9._:-]", s.joule_id));
  }
  if (s.argv.empty() || s.argv[0].empty()) return bad("argv", "empty command");
  for (const auto& [name, value] : s.env) {
    if (!valid_env_name(name)) return bad("env", fmt::format("environment name '{}' is not a shell identifier", name));
    if (name.rfind("SLURM_", 0) == 0 || name.rfind("SBATCH_", 0) == 0) {
      return bad("env", fmt::format("{}: SLURM_* and SBATCH_* are Slurm's own", name));
    }
    if (value.find('\0') != std::string::npos) return bad("env", fmt::format("{} contains a NUL byte", name));
  }
  for (const auto& word : s.argv) {
    if (word.find('\0') != std::string::npos) return bad("argv", "an argument contains a NUL byte");
  }
  auto one_line_field = [&](std::string_view field, const std::string& value) -> std::optional<Error> {
    if (value.find_first_of("\n\r") != std::string::npos) return bad(std::string(field), "contains a line break");
    return std::nullopt;
  };
  for (const auto& [field, value] : {std::pair<std::string_view, const std::string&>{"name", s.name},
                                     {"partition", s.partition},
                                     {"nodelist", s.nodelist},
                                     {"constraint", s.constraint},
                                     {"workdir", s.workdir},
                                     {"stdout_path", s.stdout_path},
                                     {"stderr_path", s.stderr_path},
                                     {"run_claim_dir", s.run_claim_dir}}) {
    if (auto error = one_line_field(field, value)) return *error;
  }

  std::vector<std::string> args = {"--parsable", "--comment=" + joule_comment(s.joule_id),
                                   "--job-name=" + (s.name.empty() ? s.joule_id : s.name)};
  if (!s.partition.empty()) args.push_back("--partition=" + s.partition);
  if (!s.nodelist.empty()) args.push_back("--nodelist=" + s.nodelist);
  if (!s.constraint.empty()) args.push_back("--constraint=" + s.constraint);
  if (s.hold) args.emplace_back("--hold");
  if (!s.stdout_path.empty()) args.push_back("--output=" + literal_file_pattern(s.stdout_path));
  if (!s.stderr_path.empty()) args.push_back("--error=" + literal_file_pattern(s.stderr_path));
  if (!s.workdir.empty()) args.push_back("--chdir=" + s.workdir);
  args.emplace_back("--export=ALL");
  args.push_back("--wrap=" + batch_script(s));
  return args;
}

std::vector<std::string> sbatch_environment(const SlurmSubmission& submission,
                                            const std::vector<std::string>& slurm_env) {
  std::vector<std::string> env;
  if (submission.env.count("PATH") == 0) env.emplace_back("PATH=/usr/local/bin:/usr/bin:/bin");
  for (const auto& [name, value] : submission.env) env.push_back(name + "=" + value);
  env.insert(env.end(), slurm_env.begin(), slurm_env.end());
  return env;
}

Result<std::string> parse_sbatch_id(std::string_view output) {
  const auto line = trim(output);
  const auto id = line.substr(0, line.find(';'));
  if (!valid_slurm_id(id)) {
    return make_error(ErrorCode::internal,
                      fmt::format("sbatch --parsable answered '{}', not a job id", one_line(line)));
  }
  return std::string(id);
}

// ---- listings ----

Result<std::vector<SlurmJob>> parse_squeue_json(std::string_view text) {
  const auto doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return make_error(ErrorCode::internal, "squeue --json: output is not a JSON object");
  }
  if (auto errors = doc.find("errors"); errors != doc.end() && errors->is_array() && !errors->empty()) {
    return make_error(ErrorCode::unavailable, "squeue --json: " + errors->dump());
  }
  const auto jobs = doc.find("jobs");
  if (jobs == doc.end() || !jobs->is_array()) {
    return make_error(ErrorCode::internal, "squeue --json: no \"jobs\" array");
  }
  std::vector<SlurmJob> out;
  out.reserve(jobs->size());
  for (const auto& entry : *jobs) {
    if (!entry.is_object()) continue;
    SlurmJob job;
    job.slurm_id = json_string(entry, "job_id");
    if (job.slurm_id.empty()) return make_error(ErrorCode::internal, "squeue --json: a job without job_id");
    job.joule_id = joule_id_from_comment(json_string(entry, "comment"));
    job.user = json_string(entry, "user_name");
    job.state = base_state(json_string(entry, "job_state"));
    job.reason = json_string(entry, "state_reason");
    job.nodes = json_string(entry, "nodes");
    if (auto exit = entry.find("exit_code"); exit != entry.end()) {
      if (auto raw = json_number(*exit)) {  // 22.05: the wait(2) status
        job.exit_code = static_cast<int>((*raw >> 8) & 0xff);
        if (const int signal = static_cast<int>(*raw & 0x7f); signal != 0) job.exit_signal = signal;
      } else if (exit->is_object()) {  // later: {"return_code": N, "signal": {"id": N}}
        if (auto code = exit->find("return_code"); code != exit->end()) {
          if (auto n = json_number(*code)) job.exit_code = static_cast<int>(*n);
        }
        if (auto signal = exit->find("signal"); signal != exit->end() && signal->is_object()) {
          for (const char* key : {"id", "signal_id"}) {
            if (auto id = signal->find(key); id != signal->end()) {
              if (auto n = json_number(*id); n && *n != 0) job.exit_signal = static_cast<int>(*n);
            }
          }
        }
      }
    }
    std::optional<std::int64_t> start, end;
    if (auto it = entry.find("start_time"); it != entry.end()) start = json_number(*it);
    if (auto it = entry.find("end_time"); it != entry.end()) end = json_number(*it);
    finish_times(job, start && *start > 0 ? std::optional(*start * 1000) : std::nullopt,
                 end && *end > 0 ? std::optional(*end * 1000) : std::nullopt);
    out.push_back(std::move(job));
  }
  return out;
}

Result<std::vector<SlurmJob>> parse_scontrol_jobs(std::string_view text) {
  std::vector<SlurmJob> out;
  for (const std::string_view line : trimmed_lines(text)) {
    if (line.empty() || line == "No jobs in the system") continue;

    // Key=Value pairs separated by spaces; a word that does not look like "Key=" continues
    // the previous value (a comment or a path with spaces).
    std::map<std::string, std::string, std::less<>> fields;
    std::string* value = nullptr;
    std::size_t pos = 0;
    while (pos <= line.size()) {
      auto space = line.find(' ', pos);
      if (space == std::string_view::npos) space = line.size();
      const auto word = line.substr(pos, space - pos);
      pos = space + 1;
      const auto equals = word.find('=');
      const bool is_key = equals != std::string_view::npos && equals > 0 &&
                          std::isalpha(static_cast<unsigned char>(word[0])) &&
                          std::all_of(word.begin(), word.begin() + static_cast<std::ptrdiff_t>(equals), [](char c) {
                            return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':' || c == '/';
                          });
      if (is_key) {
        value = &fields[std::string(word.substr(0, equals))];
        *value = std::string(word.substr(equals + 1));
      } else if (value != nullptr) {
        *value += ' ';
        *value += word;
      }
    }
    auto field = [&](std::string_view key) -> std::string {
      const auto it = fields.find(key);
      if (it == fields.end()) return {};
      const auto v = trim(it->second);
      return v == "(null)" ? std::string() : std::string(v);
    };
    SlurmJob job;
    job.slurm_id = field("JobId");
    if (!valid_slurm_id(job.slurm_id)) {
      return make_error(ErrorCode::internal, fmt::format("scontrol show job: no JobId in '{}'", line.substr(0, 80)));
    }
    job.joule_id = joule_id_from_comment(field("Comment"));
    const auto user = field("UserId");  // "root(0)"
    job.user = user.substr(0, user.find('('));
    job.state = base_state(field("JobState"));
    job.reason = field("Reason");
    job.nodes = field("NodeList");
    set_exit(job, field("ExitCode"));
    finish_times(job, parse_time_ms(field("StartTime")), parse_time_ms(field("EndTime")));
    out.push_back(std::move(job));
  }
  return out;
}

std::string parse_energy_plugin(std::string_view show_config) {
  for (const std::string_view line : trimmed_lines(show_config)) {
    if (line.rfind("AcctGatherEnergyType", 0) != 0) continue;
    const auto equals = line.find('=');
    if (equals == std::string_view::npos) return {};
    auto value = trim(line.substr(equals + 1));
    if (const auto slash = value.rfind('/'); slash != std::string_view::npos) value = value.substr(slash + 1);
    if (value.empty() || value == "none" || value == "(null)") return {};
    return std::string(value);
  }
  return {};
}

std::optional<double> parse_sacct_energy(std::string_view text, std::string_view slurm_id) {
  std::optional<double> own, batch;
  for (const std::string_view line : trimmed_lines(text)) {
    const auto bar = line.find('|');
    if (bar == std::string_view::npos) continue;
    const auto id = trim(line.substr(0, bar));
    const auto value = trim(line.substr(bar + 1));
    double joules = 0.0;
    const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), joules);
    if (ec != std::errc() || ptr != value.data() + value.size() || !(joules > 0.0) || !std::isfinite(joules)) continue;
    if (id == slurm_id)
      own = joules;
    else if (id.size() == slurm_id.size() + 6 && id.substr(0, slurm_id.size()) == slurm_id &&
             id.substr(slurm_id.size()) == ".batch")
      batch = joules;
  }
  return own ? own : batch;
}

std::map<std::string, double> parse_sstat_energy(std::string_view text) {
  std::map<std::string, double> batch, largest;
  for (const std::string_view line : trimmed_lines(text)) {
    const auto bar = line.find('|');
    if (bar == std::string_view::npos) continue;
    const auto step = trim(line.substr(0, bar));
    const auto value = trim(line.substr(bar + 1));
    const auto dot = step.find('.');
    if (dot == std::string_view::npos || dot == 0) continue;
    double joules = 0.0;
    const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), joules);
    if (ec != std::errc() || ptr != value.data() + value.size() || !(joules > 0.0) || !std::isfinite(joules)) continue;
    const std::string job(step.substr(0, dot));
    if (step.substr(dot + 1) == "batch") batch[job] = joules;
    largest[job] = std::max(largest[job], joules);
  }
  for (const auto& [job, joules] : largest) batch.emplace(job, joules);  // where it had no batch line
  return batch;
}

Result<std::vector<SlurmJob>> parse_sacct(std::string_view text) {
  constexpr std::size_t kFields = 9;  // JobIDRaw|User|State|Reason|NodeList|ExitCode|Start|End|Comment
  std::vector<SlurmJob> out;
  std::size_t line_start = 0;
  while (line_start < text.size()) {
    auto line_end = text.find('\n', line_start);
    if (line_end == std::string_view::npos) line_end = text.size();
    const auto line = text.substr(line_start, line_end - line_start);
    line_start = line_end + 1;
    if (trim(line).empty()) continue;
    std::vector<std::string_view> parts;
    std::size_t pos = 0;
    // The comment is last, so a '|' inside it stays in it.
    while (parts.size() + 1 < kFields) {
      const auto bar = line.find('|', pos);
      if (bar == std::string_view::npos) break;
      parts.push_back(line.substr(pos, bar - pos));
      pos = bar + 1;
    }
    parts.push_back(line.substr(pos));
    if (parts.size() != kFields) {
      return make_error(ErrorCode::internal, fmt::format("sacct: {} fields in '{}'", parts.size(), trim(line)));
    }
    SlurmJob job;
    job.slurm_id = std::string(trim(parts[0]));
    if (!valid_slurm_id(job.slurm_id)) {
      return make_error(ErrorCode::internal, fmt::format("sacct: '{}' is not a job id", job.slurm_id));
    }
    job.user = std::string(trim(parts[1]));
    job.state = base_state(parts[2]);
    job.reason = std::string(trim(parts[3]));
    const auto nodes = trim(parts[4]);
    job.nodes = nodes == "None assigned" ? std::string() : std::string(nodes);
    set_exit(job, trim(parts[5]));
    finish_times(job, parse_time_ms(parts[6]), parse_time_ms(parts[7]));
    job.joule_id = joule_id_from_comment(parts[8]);
    out.push_back(std::move(job));
  }
  return out;
}

ErrorCode classify_slurm_error(std::string_view tool, std::string_view stderr_text) {
  for (std::string_view retryable :
       {"Unable to contact slurm controller", "Socket timed out", "Zero Bytes were transmitted",
        "Communication connection failure", "Connection refused", "temporarily unable to accept job",
        "Resource temporarily unavailable", "Slurm backup controller in standby mode", "Munge encode failed",
        "Transport endpoint is not connected",
        // A controller killed while it answers resets the connection instead of refusing it.
        "Connection reset by peer"}) {
    if (contains(stderr_text, retryable)) return ErrorCode::unavailable;
  }
  if (contains(stderr_text, "Invalid job id")) return ErrorCode::not_found;
  for (std::string_view state :
       {"already completing or completed", "already finished", "is pending execution", "not suspended",
        "Requested operation is presently disabled", "Job is not held", "is currently being requeued",
        "Job is no longer pending execution", "Job is suspended"}) {
    if (contains(stderr_text, state)) return ErrorCode::conflict;
  }
  return tool == "sbatch" ? ErrorCode::invalid_argument : ErrorCode::internal;
}

// ---- SlurmCli ----

SlurmCli::SlurmCli(SlurmOptions options) : options_(std::move(options)) {}

Result<std::string> SlurmCli::run(const std::string& tool, const std::vector<std::string>& args,
                                  std::optional<std::vector<std::string>> environment) const {
  std::vector<std::string> argv;
  argv.reserve(args.size() + 1);
  argv.push_back(options_.bin_dir.empty() ? tool : (options_.bin_dir / tool).string());
  argv.insert(argv.end(), args.begin(), args.end());
  CommandOptions command;
  if (environment) {
    command.env = std::move(*environment);
    command.inherit_environment = false;
  } else {
    // scontrol and sacct print epoch seconds then, which need no time zone to read.
    command.env = {"SLURM_TIME_FORMAT=%s"};
    command.env.insert(command.env.end(), options_.env.begin(), options_.env.end());
  }
  command.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(options_.timeout_seconds * 1000));
  auto output = run_command(argv, command);
  const auto described = [&] { return describe_command(tool, args); };
  if (!output) return make_error(output.error().code, fmt::format("`{}`: {}", described(), output.error().message));
  if (!output->success()) {
    const std::string said = one_line(output->err.empty() ? output->out : output->err);
    const std::string how =
        output->signal != 0 ? fmt::format("signal {}", output->signal) : fmt::format("exit {}", output->exit_code);
    return make_error(classify_slurm_error(tool, said), fmt::format("`{}` failed ({}): {}", described(), how, said));
  }
  return std::move(output->out);
}

Result<std::string> SlurmCli::submit(const SlurmSubmission& submission) const {
  auto args = sbatch_arguments(submission);
  if (!args) return args.error();
  // sbatch gets no environment of ours but where the cluster is (see SlurmOptions::env).
  auto slurm_env = options_.env;
  const bool has_conf = std::any_of(slurm_env.begin(), slurm_env.end(),
                                    [](const std::string& e) { return e.rfind("SLURM_CONF=", 0) == 0; });
  if (const char* conf = std::getenv("SLURM_CONF"); conf != nullptr && !has_conf) {
    slurm_env.push_back(std::string("SLURM_CONF=") + conf);
  }
  auto out = run("sbatch", *args, sbatch_environment(submission, slurm_env));
  if (!out) return out.error();
  return parse_sbatch_id(*out);
}

Result<std::vector<SlurmJob>> SlurmCli::list() const {
  // Not squeue --json: with slurmctld down it exits 0 after 9 s with an empty job list and only
  // "Unspecified error" in its JSON, where scontrol exits 1 with "Unable to contact slurm
  // controller". An empty listing read as success would make every job look lost.
  auto text = run("scontrol", {"show", "job", "--oneliner"});
  if (!text) return text.error();
  auto jobs = parse_scontrol_jobs(*text);
  if (!jobs) return jobs;
  // Jobs slurmctld has forgotten (older than MinJobAge) that accounting still has. A job id is
  // only the same job if its joule id is the same too: ids are handed out again after a crash.
  std::set<std::pair<std::string, std::string>> known;
  for (const auto& job : *jobs) known.emplace(job.slurm_id, job.joule_id);
  for (auto& job : accounting_jobs()) {
    if (known.emplace(job.slurm_id, job.joule_id).second) jobs->push_back(std::move(job));
  }
  return jobs;
}

std::vector<SlurmJob> SlurmCli::accounting_jobs() const {
  if (accounting_disabled_.load()) return {};
  auto text = run("sacct", {"-X", "-n", "-P", "--allusers",
                            "--format=JobIDRaw,User,State,Reason,NodeList,ExitCode,Start,End,Comment",
                            fmt::format("--starttime=now-{}days", options_.accounting_days)});
  if (!text) {
    if (contains(text.error().message, "accounting storage is disabled")) accounting_disabled_.store(true);
    // Other failures (slurmdbd down): slurmctld's own listing still stands.
    return {};
  }
  auto jobs = parse_sacct(*text);
  return jobs ? std::move(*jobs) : std::vector<SlurmJob>{};
}

Result<std::string> SlurmCli::energy_plugin() const {
  auto text = run("scontrol", {"show", "config"});
  if (!text) return text.error();
  return parse_energy_plugin(*text);
}

Result<std::optional<double>> SlurmCli::consumed_energy(std::string_view slurm_id) const {
  if (!valid_slurm_id(slurm_id))
    return make_error(ErrorCode::invalid_argument, fmt::format("'{}' is not a Slurm job id", slurm_id));
  auto text = run("sacct", {"-n", "-P", "-j", std::string(slurm_id), "--format=JobIDRaw,ConsumedEnergyRaw"});
  if (!text) return text.error();
  return parse_sacct_energy(*text, slurm_id);
}

Result<std::map<std::string, double>> SlurmCli::running_energy(const std::vector<std::string>& slurm_ids) const {
  std::string ids;
  for (const auto& id : slurm_ids) {
    if (!valid_slurm_id(id))
      return make_error(ErrorCode::invalid_argument, fmt::format("'{}' is not a Slurm job id", id));
    ids += (ids.empty() ? "" : ",") + id;
  }
  if (ids.empty()) return std::map<std::string, double>{};
  auto text = run("sstat", {"-n", "-P", "-a", "-j", ids, "--format=JobID,ConsumedEnergyRaw"});
  if (!text) return text.error();
  return parse_sstat_energy(*text);
}

Status SlurmCli::control(const std::string& tool, std::vector<std::string> args, std::string_view slurm_id) const {
  if (!valid_slurm_id(slurm_id)) {
    return make_error(ErrorCode::invalid_argument, fmt::format("'{}' is not a Slurm job id", slurm_id));
  }
  args.emplace_back(slurm_id);
  auto out = run(tool, args);
  if (!out) return out.error();
  return {};
}

Status SlurmCli::suspend(std::string_view slurm_id) const { return control("scontrol", {"suspend"}, slurm_id); }
Status SlurmCli::resume(std::string_view slurm_id) const { return control("scontrol", {"resume"}, slurm_id); }
Status SlurmCli::cancel(std::string_view slurm_id) const { return control("scancel", {}, slurm_id); }
Status SlurmCli::release(std::string_view slurm_id) const { return control("scontrol", {"release"}, slurm_id); }

}  // namespace joule::adapters
