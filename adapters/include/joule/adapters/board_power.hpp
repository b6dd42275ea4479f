#pragma once
// Published idle and per-busy-core power of the boards Joule names, for the modelled CPU meter.
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "joule/adapters/modelled_cpu_meter.hpp"

namespace joule::adapters {

/// One row of the table: a board, what its firmware calls it, and its figures with their source.
struct BoardPower {
  std::string_view board;  ///< the row's own name ("Raspberry Pi 4 Model B")
  /// The firmware's model string contains this (/proc/device-tree/model: "Raspberry Pi 4 Model B
  /// Rev 1.4", "NVIDIA Jetson Orin Nano Developer Kit"). Rows are tried in order, so a row whose
  /// key another row's contains comes after it.
  std::string_view model_contains;
  /// The modelled meter's coefficients from the source; absent where none publishes them (the
  /// board's own rails are its meter then).
  std::optional<ModelledCpuParams> params;
  std::string source;  ///< where the figures come from, and how they were measured
};

/// The whole table, in the order rows are matched.
std::span<const BoardPower> board_power_table();

/// The row whose key `model` contains; nullptr for a board the table does not know.
const BoardPower* board_power_for(std::string_view model);

/// The modelled meter's coefficients for a board and a sentence saying where they come from:
/// the table's figures, or the generic desktop defaults (ModelledCpuParams{}) for a board it
/// does not know or has no figures for, saying so. `model` empty: the board was not found.
struct BoardDefaults {
  ModelledCpuParams params;
  bool from_table = false;  ///< the figures are the board's own published ones
  std::string note;
};
BoardDefaults board_defaults(std::string_view model);

/// What the firmware calls this board: `<sys>/firmware/devicetree/base/model` (ARM boards: the
/// file /proc/device-tree/model points at, NUL-terminated), else the DMI board's vendor and name
/// (`<sys>/class/dmi/id/board_vendor`, `board_name`: x86 machines); empty when neither is there.
std::string read_board_model(const std::filesystem::path& sys = "/sys");

}  // namespace joule::adapters
