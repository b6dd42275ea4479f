#include "joule/adapters/jetson_power_mode.hpp"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "joule/adapters/sysfs.hpp"

namespace joule::adapters {
namespace {

Result<int> parse_int(std::string_view text) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size())
    return make_error(ErrorCode::invalid_argument, fmt::format("\"{}\" is not a number", text));
  return value;
}

// What a tool said, for an error message: its stderr, else its stdout, on one line.
std::string said(const CommandOutput& output) {
  std::string text(trim(output.err.empty() ? output.out : output.err));
  std::replace(text.begin(), text.end(), '\n', ' ');
  if (text.size() > 300) text = text.substr(0, 300) + "...";
  return text.empty() ? "nothing" : "\"" + text + "\"";
}

}  // namespace

Result<NvpmodelConf> parse_nvpmodel_conf(std::string_view text, const std::string& where) {
  // "< POWER_MODEL ID=2 NAME=15W >", "< PM_CONFIG DEFAULT=2 >", "< PARAM TYPE=FILE NAME=X >".
  static const std::regex section(R"(^\s*<\s*([A-Z_]+)((?:\s+[A-Z_]+=[^\s>]+)*)\s*>\s*$)");
  static const std::regex attribute(R"(([A-Z_]+)=([^\s>]+))");
  NvpmodelConf conf;
  std::optional<int> default_id;
  std::set<int> ids;
  std::istringstream lines{std::string(text)};
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#' || line[first] != '<') continue;
    std::smatch match;
    if (!std::regex_match(line, match, section))
      return make_error(ErrorCode::invalid_argument,
                        fmt::format("{}:{}: not a section header: {}", where, number, line));
    std::map<std::string, std::string> attributes;
    const std::string rest = match[2];
    for (auto it = std::sregex_iterator(rest.begin(), rest.end(), attribute); it != std::sregex_iterator(); ++it)
      attributes[(*it)[1]] = (*it)[2];
    if (match[1] == "POWER_MODEL") {
      auto id = attributes.contains("ID") ? parse_int(attributes["ID"])
                                          : Result<int>(make_error(ErrorCode::invalid_argument, "no ID"));
      if (!id || !attributes.contains("NAME"))
        return make_error(ErrorCode::invalid_argument,
                          fmt::format("{}:{}: a POWER_MODEL needs ID=<number> and NAME=<name>", where, number));
      if (!ids.insert(*id).second)
        return make_error(ErrorCode::invalid_argument,
                          fmt::format("{}:{}: mode ID={} is defined twice", where, number, *id));
      conf.modes.push_back({*id, attributes["NAME"]});
    } else if (match[1] == "PM_CONFIG" && attributes.contains("DEFAULT")) {
      auto id = parse_int(attributes["DEFAULT"]);
      if (!id)
        return make_error(ErrorCode::invalid_argument,
                          fmt::format("{}:{}: DEFAULT must be a mode's ID", where, number));
      default_id = *id;
    }
  }
  if (conf.modes.empty())
    return make_error(ErrorCode::invalid_argument, fmt::format("{}: no POWER_MODEL section", where));
  conf.default_id = default_id.value_or(conf.modes.front().id);
  return conf;
}

Result<int> parse_nvpmodel_query(std::string_view out) {
  std::optional<int> id;
  std::istringstream lines{std::string(out)};
  for (std::string line; std::getline(lines, line);)
    if (auto value = parse_int(trim(line))) id = *value;
  if (!id)
    return make_error(ErrorCode::io, fmt::format("nvpmodel -q printed no mode number: \"{}\"", std::string(trim(out))));
  return *id;
}

CommandRunner system_command_runner() {
  return [](const std::vector<std::string>& argv) { return run_command(argv); };
}

std::optional<PowerMode> JetsonPowerModes::find(std::string_view id_or_name) const {
  const auto id = parse_int(id_or_name);
  for (const auto& mode : table.modes)
    if (mode.name == id_or_name || (id && mode.id == *id)) return mode;
  return std::nullopt;
}

std::string JetsonPowerModes::describe() const {
  std::vector<std::string> names;
  for (const auto& mode : table.modes) names.push_back(fmt::format("{} {}", mode.id, mode.name));
  return fmt::format("nvpmodel: {} (default {}, now {})", fmt::join(names, ", "), table.default_id, current_id);
}

Result<JetsonPowerModes> JetsonPowerModes::discover(const std::string& nvpmodel, const std::filesystem::path& conf,
                                                    const CommandRunner& run) {
  std::ifstream in(conf);
  if (!in)
    return make_error(ErrorCode::unavailable,
                      fmt::format("no {} (not a Jetson, or JetPack's nvpmodel is not installed)", conf.string()));
  std::stringstream text;
  text << in.rdbuf();
  auto table = parse_nvpmodel_conf(text.str(), conf.string());
  if (!table) return make_error(ErrorCode::unavailable, table.error().message);
  JetsonPowerModes modes{nvpmodel, conf, std::move(table).value(), 0};
  auto answer = run({nvpmodel, "-q"});
  if (!answer) return make_error(ErrorCode::unavailable, fmt::format("{} -q: {}", nvpmodel, answer.error().message));
  if (!answer->success())
    return make_error(ErrorCode::unavailable, fmt::format("{} -q failed: {}", nvpmodel, said(*answer)));
  auto current = parse_nvpmodel_query(answer->out);
  if (!current) return make_error(ErrorCode::unavailable, current.error().message);
  modes.current_id = *current;
  return modes;
}

JetsonPowerMode::JetsonPowerMode(JetsonPowerModes modes, ControlJournal* journal, CommandRunner run)
    : modes_(std::move(modes)), journal_(journal), run_(std::move(run)) {}

JetsonPowerMode::~JetsonPowerMode() { (void)restore(); }

std::string JetsonPowerMode::describe() const { return "the power mode (" + modes_.nvpmodel + ")"; }

Result<int> JetsonPowerMode::query() const {
  auto answer = run_({modes_.nvpmodel, "-q"});
  if (!answer) return answer.error();
  if (!answer->success())
    return make_error(ErrorCode::io, fmt::format("{} -q failed: {}", modes_.nvpmodel, said(*answer)));
  return parse_nvpmodel_query(answer->out);
}

Status JetsonPowerMode::switch_to(int id) const { return restore_power_mode(modes_.nvpmodel, id, run_); }

Result<std::string> JetsonPowerMode::set(const PowerMode& mode) {
  if (!original_) {
    auto current = query();
    if (!current) return current.error();
    if (journal_) {
      if (auto noted = journal_->remember({std::string(kJournalKey), "nvpmodel", std::to_string(*current), 0}); !noted)
        return make_error(noted.error().code, "power mode left unchanged: " + noted.error().message);
    }
    original_ = *current;
  }
  dirty_ = true;  // from here a failed switch may have changed something: restore() tries
  if (auto switched = switch_to(mode.id); !switched) return switched.error();
  return fmt::format("{} {}", mode.id, mode.name);
}

Status JetsonPowerMode::restore() {
  if (!dirty_ || !original_) return {};
  if (auto switched = switch_to(*original_); !switched) return switched;
  dirty_ = false;
  if (journal_) (void)journal_->forget(std::string(kJournalKey));
  return {};
}

Status restore_power_mode(const std::string& nvpmodel, int id, const CommandRunner& run) {
  auto answer = run({nvpmodel, "-m", std::to_string(id)});
  if (!answer)
    return make_error(answer.error().code, fmt::format("{} -m {}: {}", nvpmodel, id, answer.error().message));
  auto query = run({nvpmodel, "-q"});
  if (!query) return make_error(query.error().code, fmt::format("{} -q: {}", nvpmodel, query.error().message));
  auto now = parse_nvpmodel_query(query->out);
  if (!now) return now.error();
  if (*now != id)
    return make_error(ErrorCode::conflict,
                      fmt::format("{} -m {} left mode {} in force (it said {}; a mode that needs a reboot cannot be "
                                  "set by jouled)",
                                  nvpmodel, id, *now, said(*answer)));
  return {};
}

}  // namespace joule::adapters
