#pragma once
// A Jetson's power mode as a knob: the modes /etc/nvpmodel.conf defines (JetsonPowerModes, read
// at start) and a job's setting of one through NVIDIA's `nvpmodel` tool (JetsonPowerMode), put
// back when the job lets go, after a jouled killed with -9 too (ControlJournal, kind "nvpmodel").
//
// nvpmodel.conf: "< PARAM TYPE=... NAME=... >" sections name the files a mode writes, each
// "< POWER_MODEL ID=<n> NAME=<name> >" section is one mode, and "< PM_CONFIG DEFAULT=<n> >" names
// the default; '#' starts a comment. `nvpmodel -q` prints "NV Power Mode: <name>" and the id on
// the next line; `nvpmodel -m <id>` switches. A mode that needs a reboot (some change the CPUs
// online) asks on stdin, which is /dev/null here: the mode stays, and the read-back says so.
// The mode is the whole module's (CPU, GPU and memory clocks), so every local device offers it.

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "joule/adapters/command_runner.hpp"
#include "joule/adapters/control_journal.hpp"
#include "joule/adapters/job_controls.hpp"
#include "joule/common/result.hpp"

namespace joule::adapters {

/// How a knob runs a tool; run_command in the daemon, the same with a fake tool in tests.
using CommandRunner = std::function<Result<CommandOutput>(const std::vector<std::string>& argv)>;
/// run_command with its default options.
CommandRunner system_command_runner();

struct PowerMode {
  int id = 0;
  std::string name;  ///< "MAXN", "15W", "MODE_30W_ALL"
};

/// The modes of nvpmodel.conf's text, in file order, and its default (the first mode where no
/// PM_CONFIG names one). invalid_argument naming `where`:line for a section it cannot read, a
/// repeated id, or no mode at all.
struct NvpmodelConf {
  std::vector<PowerMode> modes;
  int default_id = 0;
};
Result<NvpmodelConf> parse_nvpmodel_conf(std::string_view text, const std::string& where);
/// The id in `nvpmodel -q`'s output (the last line that is a number).
Result<int> parse_nvpmodel_query(std::string_view out);

/// What the node's nvpmodel offers.
struct JetsonPowerModes {
  std::string nvpmodel;  ///< the tool
  std::filesystem::path conf;
  NvpmodelConf table;
  int current_id = 0;  ///< at discovery

  /// The mode a job names, by id ("2") or by name ("15W").
  std::optional<PowerMode> find(std::string_view id_or_name) const;
  /// "nvpmodel: 0 MAXN, 1 10W, 2 15W (default 0, now 0)".
  std::string describe() const;

  /// Reads `conf` and asks `nvpmodel -q` for the mode in force. unavailable, with the reason,
  /// where there is no conf (not a Jetson) or the tool does not answer.
  static Result<JetsonPowerModes> discover(const std::string& nvpmodel, const std::filesystem::path& conf,
                                           const CommandRunner& run);
};

/// Switches the module's power mode for a job and back. The original (the mode in force before
/// the first switch) is noted in the journal first; restore() switches back to it.
class JetsonPowerMode final : public RestorableControl {
 public:
  JetsonPowerMode(JetsonPowerModes modes, ControlJournal* journal, CommandRunner run);
  ~JetsonPowerMode() override;
  JetsonPowerMode(const JetsonPowerMode&) = delete;
  JetsonPowerMode& operator=(const JetsonPowerMode&) = delete;

  /// `nvpmodel -m <id>`, then `nvpmodel -q` must show it: conflict otherwise, with what nvpmodel
  /// said (a mode that needs a reboot ends here). Returns "2 15W".
  Result<std::string> set(const PowerMode& mode);

  std::string describe() const override;
  Status restore() override;

  /// The journal key of the module's power mode.
  static constexpr std::string_view kJournalKey = "nvpmodel";

 private:
  Result<int> query() const;
  Status switch_to(int id) const;

  JetsonPowerModes modes_;
  ControlJournal* journal_;
  CommandRunner run_;
  std::optional<int> original_;
  bool dirty_ = false;
};

/// Switches to mode `id` as a journal entry of kind "nvpmodel" asks at start, and checks it took.
Status restore_power_mode(const std::string& nvpmodel, int id, const CommandRunner& run);

}  // namespace joule::adapters
