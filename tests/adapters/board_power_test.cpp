#include "joule/adapters/board_power.hpp"

#include <gtest/gtest.h>

#include "temp_dir.hpp"

using joule::adapters::board_defaults;
using joule::adapters::board_power_for;
using joule::adapters::board_power_table;
using joule::adapters::read_board_model;
using joule::testing::TempDir;

namespace {

TEST(BoardPowerTest, raspberry_pi_models_as_their_firmware_names_them_find_their_rows) {
  // /proc/device-tree/model of each board, as Raspberry Pi OS shows it.
  EXPECT_EQ(board_power_for("Raspberry Pi 4 Model B Rev 1.4")->board, "Raspberry Pi 4 Model B");
  EXPECT_EQ(board_power_for("Raspberry Pi 5 Model B Rev 1.0")->board, "Raspberry Pi 5");
  EXPECT_EQ(board_power_for("Raspberry Pi 400 Rev 1.0")->board, "Raspberry Pi 400");
  EXPECT_EQ(board_power_for("Raspberry Pi 500 Rev 1.0")->board, "Raspberry Pi 500");
  EXPECT_EQ(board_power_for("Raspberry Pi 3 Model B Rev 1.2")->board, "Raspberry Pi 3 Model B");
  // A 3 B+ is another board (another SoC clock and PMIC): not the 3 B's row.
  EXPECT_EQ(board_power_for("Raspberry Pi 3 Model B Plus Rev 1.3"), nullptr);
  EXPECT_EQ(board_power_for("NVIDIA Jetson Orin Nano Developer Kit")->board, "NVIDIA Jetson Orin Nano");
  EXPECT_EQ(board_power_for("NVIDIA Jetson Nano Developer Kit")->board, "NVIDIA Jetson Nano");
  EXPECT_EQ(board_power_for("Jetson AGX Orin")->board, "NVIDIA Jetson AGX Orin");
  EXPECT_EQ(board_power_for(""), nullptr);
}

TEST(BoardPowerTest, every_row_cites_its_source_and_figures_follow_from_it) {
  for (const auto& row : board_power_table()) {
    SCOPED_TRACE(std::string(row.board));
    EXPECT_FALSE(row.source.empty());
    if (!row.params) continue;
    // Idle and per-core power of a board are a few watts: a unit slip (mA for W) shows here.
    EXPECT_GT(row.params->idle_watts, 0.5);
    EXPECT_LT(row.params->idle_watts, 10.0);
    EXPECT_GT(row.params->watts_per_busy_core, 0.1);
    EXPECT_LT(row.params->watts_per_busy_core, 5.0);
  }
  // The Pi 4's row: 1.6 W idle, 5.0 W with its 4 cores busy.
  const auto* pi4 = board_power_for("Raspberry Pi 4 Model B Rev 1.1");
  EXPECT_DOUBLE_EQ(pi4->params->idle_watts, 1.6);
  EXPECT_DOUBLE_EQ(pi4->params->idle_watts + 4 * pi4->params->watts_per_busy_core, 5.0);
  EXPECT_NE(pi4->source.find("1.6 W idle and 5 W"), std::string::npos) << pi4->source;
}

TEST(BoardPowerTest, a_known_board_gets_its_figures_and_any_other_keeps_the_generic_ones_saying_why) {
  const auto pi5 = board_defaults("Raspberry Pi 5 Model B Rev 1.0");
  EXPECT_TRUE(pi5.from_table);
  EXPECT_DOUBLE_EQ(pi5.params.idle_watts, 2.8);
  EXPECT_NE(pi5.note.find("sbc-reviews"), std::string::npos) << pi5.note;

  const auto unknown = board_defaults("ASUSTeK COMPUTER INC. PRIME B450M-A");
  EXPECT_FALSE(unknown.from_table);
  EXPECT_DOUBLE_EQ(unknown.params.idle_watts, joule::adapters::ModelledCpuParams{}.idle_watts);
  EXPECT_NE(unknown.note.find("not in the table"), std::string::npos) << unknown.note;

  // A Jetson has rails, not published idle figures: generic, and the note says its rails meter it.
  const auto jetson = board_defaults("NVIDIA Jetson Orin Nano Developer Kit");
  EXPECT_FALSE(jetson.from_table);
  EXPECT_NE(jetson.note.find("INA3221"), std::string::npos) << jetson.note;

  const auto unreadable = board_defaults("");
  EXPECT_FALSE(unreadable.from_table);
  EXPECT_NE(unreadable.note.find("not readable"), std::string::npos) << unreadable.note;
}

TEST(BoardPowerTest, the_model_is_read_from_the_device_tree_else_from_dmi) {
  TempDir root;
  EXPECT_EQ(read_board_model(root.path() / "sys"), "");
  // DMI (x86): vendor and board name.
  root.write("sys/class/dmi/id/board_vendor", "Dell Inc.\n");
  root.write("sys/class/dmi/id/board_name", "0X8DXD\n");
  EXPECT_EQ(read_board_model(root.path() / "sys"), "Dell Inc. 0X8DXD");
  // The device tree wins, and its string ends in a NUL.
  root.write("sys/firmware/devicetree/base/model", std::string("Raspberry Pi 4 Model B Rev 1.4") + '\0');
  EXPECT_EQ(read_board_model(root.path() / "sys"), "Raspberry Pi 4 Model B Rev 1.4");
}

}  // namespace
