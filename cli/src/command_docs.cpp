#include "joule/cli/command_docs.hpp"

#include <cctype>
#include <iostream>

#include <fmt/format.h>

namespace joule::cli {
namespace {

bool visible(const CLI::App* app) { return !app->get_name().empty() && !app->get_group().empty(); }

std::vector<const CLI::App*> subcommands_of(const CLI::App& app) {
  return app.get_subcommands([](const CLI::App* sub) { return visible(sub); });
}

// The visible options of `app`, its nameless option groups' included; `help`: keep -h/--help.
std::vector<const CLI::Option*> options_of(const CLI::App& app, bool help = true) {
  std::vector<const CLI::Option*> out;
  for (const auto* option : app.get_options([](const CLI::Option* o) { return !o->get_group().empty(); }))
    if (help || option != app.get_help_ptr()) out.push_back(option);
  for (const auto* group : app.get_subcommands([](const CLI::App* sub) { return sub->get_name().empty(); }))
    for (const auto* option : options_of(*group, false)) out.push_back(option);
  return out;
}

bool is_flag(const CLI::Option* option) { return option->get_items_expected_max() == 0; }

// How an option's or positional's value is completed, from its CLI11 type name ("TEXT:FILE",
// "DIR", "TEXT:{bash,zsh}"): "file", "dir", "choices a b", or "any".
std::string value_kind(const CLI::Option* option) {
  const std::string type = option->get_type_name();
  std::size_t start = 0;
  while (start <= type.size()) {
    std::size_t end = type.find(':', start);
    if (end == std::string::npos) end = type.size();
    const std::string part = type.substr(start, end - start);
    if (part == "FILE") return "file";
    if (part == "DIR") return "dir";
    if (part.size() > 2 && part.front() == '{' && part.back() == '}') {
      std::string choices = "choices ";
      for (const char c : part.substr(1, part.size() - 2)) choices += c == ',' ? ' ' : c;
      return choices;
    }
    start = end + 1;
  }
  return "any";
}

// The placeholder of a value in the man page: FILE, SECONDS, {bash}.
std::string placeholder(const CLI::Option* option) {
  const std::string kind = value_kind(option);
  if (kind.rfind("choices ", 0) == 0) {
    std::string out = "{";
    for (const char c : kind.substr(8)) out += c == ' ' ? '|' : c;
    return out + "}";
  }
  if (kind == "file") return "FILE";
  if (kind == "dir") return "DIR";
  const std::string type = option->get_type_name();
  return type.substr(0, type.find(':'));
}

// --- roff ---------------------------------------------------------------------------------

// Plain text as roff: backslashes and dashes escaped, a leading dot or quote defused, leading
// blanks dropped (they would break the line), and everything outside ASCII as \[uXXXX].
std::string roff(std::string_view text) {
  std::string out;
  bool line_start = true;
  for (std::size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x80) {
      ++i;
      if (line_start && (byte == ' ' || byte == '\t')) continue;
      if (line_start && (byte == '.' || byte == '\'')) out += "\\&";
      line_start = byte == '\n';
      if (byte == '\\')
        out += "\\e";
      else if (byte == '-')
        out += "\\-";
      else
        out += static_cast<char>(byte);
      continue;
    }
    // UTF-8: the code point of a 2-, 3- or 4-byte sequence; a stray byte is dropped.
    const std::size_t length = byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : byte >= 0xC0 ? 2 : 1;
    if (length == 1 || i + length > text.size()) {
      ++i;
      continue;
    }
    unsigned code = byte & (0x7F >> length);
    for (std::size_t k = 1; k < length; ++k) code = (code << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
    out += fmt::format("\\[u{:04X}]", code);
    line_start = false;
    i += length;
  }
  return out;
}

// A macro argument in double quotes.
std::string macro_argument(std::string_view text) {
  std::string escaped = roff(text);
  std::string out = "\"";
  for (const char c : escaped) out += c == '"' ? std::string("\\(dq") : std::string(1, c);
  return out + "\"";
}

// "\fB\-s\fR, \fB\-\-long\fR \fIVALUE\fR", or "\fIFILE\fR" for a positional.
std::string option_term(const CLI::Option* option) {
  if (!option->nonpositional()) return "\\fI" + roff(option->get_name(true)) + "\\fR";
  std::vector<std::string> names;
  for (const auto& name : option->get_snames()) names.push_back("\\fB" + roff("-" + name) + "\\fR");
  for (const auto& name : option->get_lnames()) names.push_back("\\fB" + roff("--" + name) + "\\fR");
  std::string term;
  for (const auto& name : names) term += (term.empty() ? "" : ", ") + name;
  if (!is_flag(option)) term += " \\fI" + roff(placeholder(option)) + "\\fR";
  return term;
}

std::string option_text(const CLI::Option* option) {
  std::string text = option->get_description();
  if (option->get_required() && option->nonpositional()) text += " (required)";
  if (!option->get_default_str().empty() && !is_flag(option))
    text += fmt::format(" (default: {})", option->get_default_str());
  return text;
}

// "joulectl submit [OPTIONS] FILE" for a .SS header or the SYNOPSIS.
std::string usage(const CLI::App& app, const std::string& words) {
  std::string line = words;
  const auto options = options_of(app, false);
  bool has_options = false;
  for (const auto* option : options) has_options = has_options || option->nonpositional();
  if (has_options) line += " [OPTIONS]";
  for (const auto* option : options) {
    if (option->nonpositional()) continue;
    const std::string name = option->get_name(true);
    line += option->get_required() ? " " + name : " [" + name + "]";
  }
  if (!subcommands_of(app).empty()) line += app.get_require_subcommand_min() > 0 ? " COMMAND" : " [COMMAND]";
  return line;
}

void write_options(std::string& out, const std::vector<const CLI::Option*>& options) {
  for (const auto* option : options) {
    out += ".TP\n" + option_term(option) + "\n";
    if (const std::string text = option_text(option); !text.empty()) out += roff(text) + "\n";
  }
}

void write_commands(std::string& out, const CLI::App& app, const std::string& words) {
  for (const auto* sub : subcommands_of(app)) {
    const std::string path = words + " " + sub->get_name();
    out += ".SS " + macro_argument(usage(*sub, path)) + "\n";
    out += roff(sub->get_description()) + "\n";
    // Positionals first, as they are written.
    std::vector<const CLI::Option*> ordered;
    for (const auto* option : options_of(*sub, false))
      if (!option->nonpositional()) ordered.push_back(option);
    for (const auto* option : options_of(*sub, false))
      if (option->nonpositional()) ordered.push_back(option);
    write_options(out, ordered);
    write_commands(out, *sub, path);
  }
}

// --- bash ---------------------------------------------------------------------------------

std::string identifier(std::string_view program) {
  std::string out;
  for (const char c : program) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

struct CompletionTables {
  std::string subcommands, options, values, positionals;  // bash case arms
};

void collect(const CLI::App& app, const std::string& path, CompletionTables& tables) {
  std::string subs, options;
  for (const auto* sub : subcommands_of(app)) subs += (subs.empty() ? "" : " ") + sub->get_name();
  std::string positional;
  for (const auto* option : options_of(app)) {
    if (!option->nonpositional()) {
      if (positional.empty()) positional = value_kind(option);
      continue;
    }
    std::vector<std::string> names;
    for (const auto& name : option->get_snames()) names.push_back("-" + name);
    for (const auto& name : option->get_lnames()) names.push_back("--" + name);
    for (const auto& name : names) {
      options += (options.empty() ? "" : " ") + name;
      if (!is_flag(option))
        tables.values += fmt::format("    \"{} {}\") echo \"{}\" ;;\n", path, name, value_kind(option));
    }
  }
  if (!subs.empty()) tables.subcommands += fmt::format("    \"{}\") echo \"{}\" ;;\n", path, subs);
  if (!options.empty()) tables.options += fmt::format("    \"{}\") echo \"{}\" ;;\n", path, options);
  if (!positional.empty()) tables.positionals += fmt::format("    \"{}\") echo \"{}\" ;;\n", path, positional);
  for (const auto* sub : subcommands_of(app))
    collect(*sub, path.empty() ? sub->get_name() : path + " " + sub->get_name(), tables);
}

}  // namespace

std::string man_page(const CLI::App& app, const ManPage& page) {
  std::string name = page.name.empty() ? app.get_name() : page.name;
  std::string summary = page.summary.empty() ? app.get_description() : page.summary;
  // CLI11 names the top-level app after argv[0] (a path) once it parses; the page takes the file name.
  if (const auto slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
  if (summary.rfind(name + ": ", 0) == 0) summary = summary.substr(name.size() + 2);
  std::string upper;
  for (const char c : name) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));

  std::string out = fmt::format(".\\\" Generated from {}'s command tree ({} --man-page); do not edit.\n", name, name);
  out += fmt::format(".TH {} {} \"\" {} {}\n", macro_argument(upper), page.section, macro_argument(page.source),
                     macro_argument(page.manual));
  out += ".SH NAME\n" + roff(name) + " \\- " + roff(summary) + "\n";
  out += ".SH SYNOPSIS\n.B " + roff(name) + "\n";
  if (const std::string rest = usage(app, ""); !rest.empty()) out += roff(rest.substr(1)) + "\n";
  if (!page.description.empty()) {
    out += ".SH DESCRIPTION\n";
    for (std::size_t i = 0; i < page.description.size(); ++i)
      out += (i == 0 ? "" : ".PP\n") + roff(page.description[i]) + "\n";
  }
  const auto options = options_of(app);
  if (!options.empty()) {
    out += ".SH OPTIONS\n";
    write_options(out, options);
  }
  if (!subcommands_of(app).empty()) {
    out += ".SH COMMANDS\n";
    write_commands(out, app, name);
  }
  for (const auto& section : page.sections) {
    out += ".SH " + macro_argument(section.title) + "\n";
    bool first = true;
    for (const auto& [term, text] : section.items) {
      if (term.empty())
        out += std::string(first ? "" : ".PP\n") + roff(text) + "\n";
      else
        out += ".TP\n\\fB" + roff(term) + "\\fR\n" + roff(text) + "\n";
      first = false;
    }
  }
  return out;
}

std::string bash_completion(const CLI::App& app, std::string_view program) {
  CompletionTables tables;
  collect(app, "", tables);
  const std::string f = "_" + identifier(program);
  std::string out = fmt::format(
      "# bash completion for {program}, generated from its command tree by `{program} completion bash`.\n"
      "# Installed as /usr/share/bash-completion/completions/{program}; or: source <({program} completion bash)\n"
      "\n"
      "# The subcommands of a command (its words after {program}, \"\" for the top).\n"
      "{f}_subcommands() {{\n  case $1 in\n{subcommands}  esac\n}}\n"
      "# The options of a command.\n"
      "{f}_options() {{\n  case $1 in\n{options}  esac\n}}\n"
      "# What an option takes (\"COMMAND OPTION\"): file, dir, choices A B, any; nothing for a flag.\n"
      "{f}_value() {{\n  case $1 in\n{values}  esac\n}}\n"
      "# What a command's positional arguments are: file, dir, choices A B, any; nothing if none.\n"
      "{f}_positional() {{\n  case $1 in\n{positionals}  esac\n}}\n"
      "\n"
      "{f}_complete_value() {{\n"
      "  case $1 in\n"
      "    file)\n"
      "      if declare -F _filedir >/dev/null; then _filedir; else\n"
      "        compopt -o filenames 2>/dev/null\n"
      "        COMPREPLY+=($(compgen -f -- \"$2\"))\n"
      "      fi ;;\n"
      "    dir)\n"
      "      if declare -F _filedir >/dev/null; then _filedir -d; else\n"
      "        compopt -o filenames 2>/dev/null\n"
      "        COMPREPLY+=($(compgen -d -- \"$2\"))\n"
      "      fi ;;\n"
      "    choices\\ *) COMPREPLY+=($(compgen -W \"${{1#choices }}\" -- \"$2\")) ;;\n"
      "  esac\n"
      "}}\n"
      "\n"
      "{f}() {{\n"
      "  local cur prev words cword\n"
      "  if declare -F _init_completion >/dev/null; then\n"
      "    _init_completion || return\n"
      "  else\n"
      "    words=(\"${{COMP_WORDS[@]}}\")\n"
      "    cword=$COMP_CWORD\n"
      "    cur=${{COMP_WORDS[COMP_CWORD]}}\n"
      "    prev=${{COMP_WORDS[COMP_CWORD-1]}}\n"
      "  fi\n"
      "  COMPREPLY=()\n"
      "  # Which command the words so far name: options and their values are stepped over, and a\n"
      "  # word counts as a subcommand only where the command reached so far has one by that name.\n"
      "  local command=\"\" word sub i\n"
      "  for ((i = 1; i < cword; i++)); do\n"
      "    word=${{words[i]}}\n"
      "    case $word in\n"
      "      --*=*) ;;\n"
      "      -*) [[ -n $({f}_value \"$command $word\") ]] && ((i++)) ;;\n"
      "      *)\n"
      "        for sub in $({f}_subcommands \"$command\"); do\n"
      "          if [[ $word == \"$sub\" ]]; then\n"
      "            command=${{command:+$command }}$word\n"
      "            break\n"
      "          fi\n"
      "        done ;;\n"
      "    esac\n"
      "  done\n"
      "  local value\n"
      "  if [[ $cword -gt 1 && $prev == -* ]]; then\n"
      "    value=$({f}_value \"$command $prev\")\n"
      "    if [[ -n $value ]]; then\n"
      "      {f}_complete_value \"$value\" \"$cur\"\n"
      "      return 0\n"
      "    fi\n"
      "  fi\n"
      "  if [[ $cur == -* ]]; then\n"
      "    COMPREPLY=($(compgen -W \"$({f}_options \"$command\")\" -- \"$cur\"))\n"
      "    return 0\n"
      "  fi\n"
      "  value=$({f}_positional \"$command\")\n"
      "  [[ -n $value ]] && {f}_complete_value \"$value\" \"$cur\"\n"
      "  COMPREPLY+=($(compgen -W \"$({f}_subcommands \"$command\")\" -- \"$cur\"))\n"
      "  return 0\n"
      "}}\n"
      "complete -F {f} {program}\n",
      fmt::arg("program", program), fmt::arg("f", f), fmt::arg("subcommands", tables.subcommands),
      fmt::arg("options", tables.options), fmt::arg("values", tables.values),
      fmt::arg("positionals", tables.positionals));
  return out;
}

void add_man_page_flag(CLI::App& app, ManPage page) {
  app.add_flag_callback(
         "--man-page",
         [&app, page = std::move(page)] {
           std::cout << man_page(app, page);
           throw CLI::Success();
         },
         "print the man page (roff) and exit")
      ->group("");
}

}  // namespace joule::cli
