#include "joule/adapters/board_power.hpp"

#include <vector>

#include <fmt/format.h>

#include "joule/adapters/sysfs.hpp"

namespace joule::adapters {

namespace {

// P = idle + per_core × busy cores, from a board's published idle and all-cores-busy figures.
constexpr ModelledCpuParams from_idle_and_busy(double idle_watts, double all_busy_watts, int cores) {
  return ModelledCpuParams{idle_watts, (all_busy_watts - idle_watts) / cores};
}

// Jetson modules are metered by their INA3221 rails; NVIDIA publishes power-mode budgets
// (nvpmodel), which are caps on clocks, not idle or per-core figures, so these rows carry none.
constexpr std::string_view kJetson =
    "no published idle or per-core figure (NVIDIA publishes nvpmodel power budgets, caps rather than "
    "draws); its INA3221 rails are its meter";

// A row from Jeff Geerling's SBC reviews: one method (at the wall, `stress-ng --matrix 0` on all
// cores) for every Raspberry Pi he measured, so the rows compare with each other.
BoardPower geerling_row(std::string_view board, std::string_view model_contains, std::string_view issue,
                        double idle_watts, double stress_watts, int cores) {
  return {board, model_contains, from_idle_and_busy(idle_watts, stress_watts, cores),
          fmt::format("Jeff Geerling's SBC review database (github.com/geerlingguy/sbc-reviews, "
                      "web/data/results.yml and issue {}): {} W idle and {} W under `stress-ng --matrix 0` on its "
                      "{} cores, measured at the wall",
                      issue, idle_watts, stress_watts, cores)};
}

const std::vector<BoardPower>& table() {
  static const std::vector<BoardPower> rows = {
      geerling_row("Raspberry Pi 5", "Raspberry Pi 5 Model B", "#21", 2.8, 9.7, 4),
      geerling_row("Raspberry Pi 500", "Raspberry Pi 500 Rev", "#60", 3.1, 9.0, 4),
      geerling_row("Raspberry Pi 4 Model B", "Raspberry Pi 4 Model B", "#4", 1.6, 5.0, 4),
      geerling_row("Raspberry Pi 400", "Raspberry Pi 400", "#59", 2.7, 5.2, 4),
      // The vendor's own table: currents at the 5.1 V every model is specified for.
      {"Raspberry Pi 3 Model B", "Raspberry Pi 3 Model B Rev", from_idle_and_busy(0.30 * 5.1, 0.85 * 5.1, 4),
       "Raspberry Pi's documentation, \"Power supply\" (raspberrypi/documentation, "
       "documentation/asciidoc/computers/raspberry-pi/power-supplies.adoc): 0.30 A idle and 0.85 A under stress "
       "(averages, with an HDMI monitor, keyboard and mouse), at the specified 5.1 V"},
      {"NVIDIA Jetson AGX Orin", "AGX Orin", std::nullopt, std::string(kJetson)},
      {"NVIDIA Jetson Orin NX", "Orin NX", std::nullopt, std::string(kJetson)},
      {"NVIDIA Jetson Orin Nano", "Orin Nano", std::nullopt, std::string(kJetson)},
      {"NVIDIA Jetson Nano", "Jetson Nano", std::nullopt, std::string(kJetson)},
  };
  return rows;
}

}  // namespace

std::span<const BoardPower> board_power_table() { return table(); }

const BoardPower* board_power_for(std::string_view model) {
  if (model.empty()) return nullptr;
  for (const auto& row : table())
    if (model.find(row.model_contains) != std::string_view::npos) return &row;
  return nullptr;
}

BoardDefaults board_defaults(std::string_view model) {
  const ModelledCpuParams generic;
  const std::string generic_figures = fmt::format("the generic desktop defaults ({} W idle + {} W per busy core)",
                                                  generic.idle_watts, generic.watts_per_busy_core);
  if (model.empty())
    return {generic, false, fmt::format("the board's model is not readable here: {}", generic_figures)};
  const BoardPower* row = board_power_for(model);
  if (row == nullptr)
    return {generic, false,
            fmt::format("board \"{}\" is not in the table of published figures: {}", model, generic_figures)};
  if (!row->params)
    return {generic, false, fmt::format("board \"{}\" ({}): {}; {}", model, row->board, row->source, generic_figures)};
  return {*row->params, true,
          fmt::format("board \"{}\" ({}): {} W idle + {:.3g} W per busy core from {}", model, row->board,
                      row->params->idle_watts, row->params->watts_per_busy_core, row->source)};
}

std::string read_board_model(const std::filesystem::path& sys) {
  // The device tree's strings end in a NUL; trim() leaves it, so cut at the first one.
  if (auto model = read_sysfs_file(sys / "firmware/devicetree/base/model")) {
    std::string text = std::move(model).value();
    text = std::string(trim(text.substr(0, text.find('\0'))));
    if (!text.empty()) return text;
  }
  auto vendor = read_trimmed(read_sysfs_file, sys / "class/dmi/id/board_vendor");
  auto name = read_trimmed(read_sysfs_file, sys / "class/dmi/id/board_name");
  if (name && !name->empty()) return vendor && !vendor->empty() ? *vendor + " " + *name : *name;
  return {};
}

}  // namespace joule::adapters
