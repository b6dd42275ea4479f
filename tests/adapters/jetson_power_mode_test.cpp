#include "joule/adapters/jetson_power_mode.hpp"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "temp_dir.hpp"
#include "text_file.hpp"

using joule::ErrorCode;
using joule::testing::contains;
using joule::testing::read_text;
using joule::testing::TempDir;
using namespace joule::adapters;  // NOLINT: the module under test
using std::filesystem::path;

namespace {

const path kConf = path(JOULE_SOURCE_DIR) / "tests/fakes/nvpmodel.conf";
const std::string kTool = (path(JOULE_SOURCE_DIR) / "tests/fakes/fake_nvpmodel.sh").string();

// The fake nvpmodel as a real process, its mode in force in a file of the test's.
struct FakeNvpmodel {
  TempDir dir;
  path state = dir.write("mode", "0\n");
  CommandRunner runner() const {
    const std::vector<std::string> env = {"JOULE_FAKE_NVPMODEL_STATE=" + state.string(),
                                          "JOULE_FAKE_NVPMODEL_CONF=" + kConf.string()};
    return [env](const std::vector<std::string>& argv) { return run_command(argv, {.env = env}); };
  }
  std::string calls() const { return read_text(state.string() + ".log"); }
};

}  // namespace

TEST(NvpmodelConfTest, reads_the_modes_and_the_default_and_names_the_line_of_a_bad_section) {
  auto conf = parse_nvpmodel_conf(read_text(kConf), "nvpmodel.conf");
  ASSERT_TRUE(conf) << conf.error().message;
  ASSERT_EQ(conf->modes.size(), 3u);
  EXPECT_EQ(conf->modes[1].id, 1);
  EXPECT_EQ(conf->modes[1].name, "7W");
  EXPECT_EQ(conf->default_id, 0);

  auto twice = parse_nvpmodel_conf("< POWER_MODEL ID=0 NAME=A >\n\n< POWER_MODEL ID=0 NAME=B >\n", "x.conf");
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.error().message, "x.conf:3: mode ID=0 is defined twice");
  auto nameless = parse_nvpmodel_conf("# c\n< POWER_MODEL ID=1 >\n", "x.conf");
  ASSERT_FALSE(nameless);
  EXPECT_EQ(nameless.error().message, "x.conf:2: a POWER_MODEL needs ID=<number> and NAME=<name>");
  EXPECT_FALSE(parse_nvpmodel_conf("< POWER_MODEL ID=1 NAME=X\n", "x.conf"));
  EXPECT_EQ(parse_nvpmodel_conf("# nothing\n", "x.conf").error().message, "x.conf: no POWER_MODEL section");
  EXPECT_EQ(parse_nvpmodel_conf("< POWER_MODEL ID=4 NAME=X >\n", "x.conf")->default_id, 4);
  EXPECT_EQ(*parse_nvpmodel_query("NV Power Mode: MAXN\n0\n"), 0);
  EXPECT_FALSE(parse_nvpmodel_query("NVPM ERROR: cannot open\n"));
}

TEST(JetsonPowerModeTest, discovers_the_modes_switches_for_a_job_and_back) {
  FakeNvpmodel tool;
  auto modes = JetsonPowerModes::discover(kTool, kConf, tool.runner());
  ASSERT_TRUE(modes) << modes.error().message;
  EXPECT_EQ(modes->describe(), "nvpmodel: 0 15W, 1 7W, 2 7W_2CORE (default 0, now 0)");
  EXPECT_EQ(modes->find("7W")->id, 1);
  EXPECT_EQ(modes->find("1")->name, "7W");
  EXPECT_FALSE(modes->find("MAXN"));

  TempDir state;
  auto journal = ControlJournal::open(state / "controls.json");
  ASSERT_TRUE(journal);
  {
    JetsonPowerMode mode(*modes, &*journal, tool.runner());
    auto set = mode.set(*modes->find("7W"));
    ASSERT_TRUE(set) << set.error().message;
    EXPECT_EQ(*set, "1 7W");
    EXPECT_EQ(read_text(tool.state), "1\n");
    ASSERT_EQ(journal->entries().size(), 1u);
    EXPECT_EQ(journal->entries()[0].kind, "nvpmodel");
    EXPECT_EQ(journal->entries()[0].original, "0");
  }  // the destructor switches back
  EXPECT_EQ(read_text(tool.state), "0\n");
  EXPECT_TRUE(journal->entries().empty());
  EXPECT_EQ(tool.calls(), "-q\n-q\n-m 1\n-q\n-m 0\n-q\n");
}

TEST(JetsonPowerModeTest, a_mode_that_needs_a_reboot_is_refused_and_nothing_changes) {
  FakeNvpmodel tool;
  auto modes = JetsonPowerModes::discover(kTool, kConf, tool.runner());
  ASSERT_TRUE(modes);
  JetsonPowerMode mode(*modes, nullptr, tool.runner());
  auto refused = mode.set(*modes->find("7W_2CORE"));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::conflict);
  EXPECT_TRUE(contains(refused.error().message, "-m 2 left mode 0 in force (it said \"NVPM WARN: Reboot required"))
      << refused.error().message;
  EXPECT_TRUE(mode.restore());
  EXPECT_EQ(read_text(tool.state), "0\n");
}

TEST(JetsonPowerModeTest, no_conf_or_no_tool_is_unavailable_with_the_reason) {
  FakeNvpmodel tool;
  auto none = JetsonPowerModes::discover(kTool, "/nonexistent/nvpmodel.conf", tool.runner());
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, ErrorCode::unavailable);
  EXPECT_EQ(none.error().message,
            "no /nonexistent/nvpmodel.conf (not a Jetson, or JetPack's nvpmodel is not installed)");
  auto no_tool = JetsonPowerModes::discover("/nonexistent/nvpmodel", kConf, tool.runner());
  ASSERT_FALSE(no_tool);
  EXPECT_TRUE(contains(no_tool.error().message, "/nonexistent/nvpmodel -q")) << no_tool.error().message;
}
