#pragma once
// A job's chosen knob setting as its row stores it (StoredJob::chosen_setting): what placement
// chose and predicted, what the check in its first epochs found, and whether it was in force.
// A restart, and a finished job read back from the database, keep them.

#include <optional>
#include <string>
#include <string_view>

#include "job_record.hpp"

namespace joule::daemon {

struct StoredSetting {
  JobRecord::ChosenSetting chosen;
  std::optional<schedulers::SettingCheckResult> check;  ///< once its check decided
  bool in_force = false;                                ///< set on its device when the row was last written
  std::string checked_key;  ///< where a decided check is remembered for the next job of its network
};

std::string write_stored_setting(const StoredSetting& setting);
/// nullopt for "" or for anything this code did not write.
std::optional<StoredSetting> read_stored_setting(std::string_view text);

/// The row's setting back on a job read from the database: its chosen setting, the check's
/// verdict and whether it ran at it. Nothing for a row without one.
void restore_chosen_setting(JobRecord& job);

/// A finished job's estimate at the setting it ran at, as its row tells: a chosen setting stored
/// with it (in force, and kept by its check: one given up ran at the defaults), else the
/// defaults. A row whose own knobs asked for a setting gives nullopt: whether they were in force
/// is in its events, not its row, so it teaches nothing rather than the wrong figure.
std::optional<DeviceEstimate> estimate_at_setting_ran(DeviceEstimate estimate, const adapters::StoredJob& row);

}  // namespace joule::daemon
