// Man pages and bash completion generated from a CLI11 command tree (joule/cli/command_docs.hpp).
// joulectl's own, rendered by man and driven by bash, are checked in tests/cli/joulectl_docs_test.py.

#include "joule/cli/command_docs.hpp"

#include <gtest/gtest.h>

namespace {

joule::cli::ManPage page_of(const std::string& name) {
  joule::cli::ManPage page;
  page.name = name;
  page.source = "joule 1.0";
  return page;
}

struct Tree {
  CLI::App app{"tool: does things"};
  std::string file, shell, hidden_value;
  bool flag = false;
  double seconds = 0;
  CLI::App* run = nullptr;
  Tree() {
    app.add_option("--server", file, "where")->type_name("URL");
    app.add_option("--hidden", hidden_value, "not shown")->group("");
    run = app.add_subcommand("run", "run a file – now");
    run->add_option("FILE", file, "the file")->required()->type_name("FILE");
    run->add_flag("--wait", flag, "wait for it");
    run->add_option("--timeout", seconds, "give up after")->type_name("SECONDS");
    auto* group = app.add_subcommand("group", "a group");
    group->require_subcommand(1);
    group->add_subcommand("inner", "the inner one")
        ->add_option("SHELL", shell, "a shell")
        ->check(CLI::IsMember({"bash", "zsh"}));
    app.add_subcommand("secret", "hidden")->group("");
  }
};

}  // namespace

TEST(CommandDocsTest, the_man_page_lists_every_visible_command_and_option_in_roff) {
  Tree tree;
  const std::string page = joule::cli::man_page(tree.app, page_of("tool"));
  EXPECT_NE(page.find(".TH \"TOOL\" 1 \"\" \"joule 1.0\" \"User Commands\"\n"), std::string::npos) << page;
  EXPECT_NE(page.find(".SH NAME\ntool \\- does things\n"), std::string::npos) << page;
  EXPECT_NE(page.find("\\fB\\-\\-server\\fR \\fIURL\\fR\nwhere\n"), std::string::npos) << page;
  EXPECT_NE(page.find(".SS \"tool run [OPTIONS] FILE\"\nrun a file \\[u2013] now\n"), std::string::npos) << page;
  EXPECT_NE(page.find("\\fB\\-\\-timeout\\fR \\fISECONDS\\fR\ngive up after\n"), std::string::npos) << page;
  EXPECT_NE(page.find("\\fB\\-\\-wait\\fR\nwait for it\n"), std::string::npos) << page;
  EXPECT_NE(page.find(".SS \"tool group COMMAND\"\n"), std::string::npos) << page;
  EXPECT_NE(page.find(".SS \"tool group inner [SHELL]\"\n"), std::string::npos) << page;
  EXPECT_EQ(page.find("secret"), std::string::npos) << page;
  EXPECT_EQ(page.find("hidden"), std::string::npos) << page;
  // Nothing outside ASCII, no line a roff request could be mistaken for.
  for (const char c : page) EXPECT_LT(static_cast<unsigned char>(c), 0x80);
}

TEST(CommandDocsTest, plain_text_is_escaped_for_roff) {
  CLI::App app{"x"};
  auto with_notes = page_of("x");
  with_notes.sections = {{"NOTES", {{"", ".starts with a dot\n'and a quote\nback\\slash"}}}};
  const std::string page = joule::cli::man_page(app, with_notes);
  EXPECT_NE(page.find("\\&.starts with a dot\n\\&'and a quote\nback\\eslash\n"), std::string::npos) << page;
}

TEST(CommandDocsTest, the_man_page_flag_prints_the_page_before_required_options_are_missed) {
  Tree tree;
  tree.app.require_subcommand(1);
  joule::cli::add_man_page_flag(tree.app, page_of("tool"));
  testing::internal::CaptureStdout();
  EXPECT_THROW(tree.app.parse(std::vector<std::string>{"--man-page"}), CLI::Success);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(out.rfind(".\\\" Generated from tool's command tree", 0), 0u) << out;
  EXPECT_EQ(out.find("man\\-page"), std::string::npos) << "the flag itself is hidden";
}

TEST(CommandDocsTest, the_bash_completion_holds_the_tree_and_value_kinds) {
  Tree tree;
  const std::string script = joule::cli::bash_completion(tree.app, "my-tool");
  EXPECT_NE(script.find("    \"\") echo \"run group\" ;;\n"), std::string::npos) << script;
  EXPECT_NE(script.find("    \"group\") echo \"inner\" ;;\n"), std::string::npos) << script;
  EXPECT_NE(script.find("    \"run\") echo \"-h --help --wait --timeout\" ;;\n"), std::string::npos) << script;
  EXPECT_NE(script.find("    \" --server\") echo \"any\" ;;\n"), std::string::npos) << script;
  EXPECT_NE(script.find("    \"run --timeout\") echo \"any\" ;;\n"), std::string::npos) << script;
  EXPECT_NE(script.find("    \"run\") echo \"file\" ;;\n"), std::string::npos) << script;
  EXPECT_NE(script.find("    \"group inner\") echo \"choices bash zsh\" ;;\n"), std::string::npos) << script;
  EXPECT_NE(script.find("complete -F _my_tool my-tool\n"), std::string::npos) << script;
  EXPECT_EQ(script.find("secret"), std::string::npos) << script;
  EXPECT_EQ(script.find("--hidden"), std::string::npos) << script;
}
