#pragma once
// A program's documentation generated from its CLI11 command tree, so that the man page and the
// shell completion name exactly the subcommands and options the program parses, and stay so as
// they change: `joulectl --man-page`, `jouled --man-page`, `joule-sim --man-page` and
// `joulectl completion bash` print them, and the build installs their output
// (packaging/CMakeLists.txt).
//
// Hidden options and subcommands (CLI11 group "") are left out of both. Subcommands without a
// name (CLI11 option groups) count as part of their parent.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

namespace joule::cli {

/// A section of a man page after the generated ones (ENVIRONMENT, EXIT STATUS, FILES, EXAMPLES,
/// SEE ALSO...). Each item is a term and its text; an empty term makes a plain paragraph. Both
/// are plain text: they are escaped for roff here. A term is set in bold.
struct ManSection {
  std::string title;
  std::vector<std::pair<std::string, std::string>> items;
};

/// What the command tree does not say about a program.
struct ManPage {
  std::string name;  ///< the program; default: the app's name (argv[0]'s file name once it parsed)
  std::string section = "1";
  std::string source;                    ///< the .TH footer, e.g. "joule 0.1.0"
  std::string manual = "User Commands";  ///< the .TH header
  std::string summary;                   ///< NAME: "<program> \- <summary>"; default: the app's description
  std::vector<std::string> description;  ///< DESCRIPTION paragraphs
  std::vector<ManSection> sections;      ///< after OPTIONS and COMMANDS
};

/// The man page (roff, man macros) of `app`: NAME, SYNOPSIS, DESCRIPTION, OPTIONS (the top
/// level's), COMMANDS (every visible subcommand at any depth, with its positionals and options),
/// then `page.sections`. Pure ASCII: other characters become groff's \[uXXXX], so the page
/// renders alike whatever the reader's locale. No date, so that builds are reproducible.
std::string man_page(const CLI::App& app, const ManPage& page);

/// A bash completion script for `program` (the name it is completed under: `complete -F`) that
/// completes, at any depth of `app`'s tree, its subcommands and options; the value of an option
/// or positional whose type name is FILE (or has CLI11's ExistingFile check) as a file name, DIR
/// as a directory, and one with an IsMember check (`TEXT:{a,b}`) from its set. Works with or
/// without the bash-completion package (which it uses where present, for `_filedir`).
std::string bash_completion(const CLI::App& app, std::string_view program);

/// Adds the hidden flag `--man-page` to `app`: it prints man_page(app, page) on stdout and ends
/// the parse as --help does (CLI::Success), before any required option or subcommand is missed.
/// `page` is copied.
void add_man_page_flag(CLI::App& app, ManPage page);

}  // namespace joule::cli
