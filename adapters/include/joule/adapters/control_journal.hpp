#pragma once
// The originals of the device settings jouled changes (a CPU's frequency limit, a GPU's power
// limit), written down before the first change, so that a jouled killed with -9 puts them back at
// its next start just as a clean stop does.
//
// One small JSON file in the state directory, rewritten whole on every change (temporary file,
// fsync, rename, fsync of the directory): an entry is on disk before the setting it guards is
// written, and goes once the original is back. Not thread-safe: the daemon's strand owns it.

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "joule/adapters/job_controls.hpp"
#include "joule/common/result.hpp"

namespace joule::adapters {

class ControlJournal {
 public:
  /// One setting changed and not yet put back.
  struct Entry {
    /// What it is, unique: the file written ("/sys/.../policy0/scaling_max_freq") or
    /// "nvml:<index>:power_limit".
    std::string key;
    /// How to put it back: "file" (write `original` to the file `key`) or "nvml_power_limit"
    /// (`original` is the limit in milliwatts of GPU `index`).
    std::string kind;
    std::string original;
    unsigned index = 0;  ///< the GPU, for "nvml_power_limit"
  };

  /// Reads the journal at `file` (none there: empty). A file that is not a journal is an error
  /// naming it and what is wrong: it is never silently dropped, since it holds settings to restore.
  static Result<ControlJournal> open(std::filesystem::path file);

  const std::vector<Entry>& entries() const { return entries_; }
  const std::filesystem::path& file() const { return file_; }
  /// Notes an original before its setting is first written. A key already noted keeps its first
  /// original (the value before jouled touched it, not an earlier job's setting).
  Status remember(Entry entry);
  /// Drops the entry once its original is back; nothing to do for an unknown key.
  Status forget(const std::string& key);

 private:
  explicit ControlJournal(std::filesystem::path file) : file_(std::move(file)) {}
  Status save() const;

  std::filesystem::path file_;
  std::vector<Entry> entries_;
};

/// Puts back what a journal holds, as at jouled's start: "file" entries through `files`, others
/// through `restore_other` (the daemon's NVML devices). Each entry restored is forgotten; one that
/// cannot be is kept for the next start. Returns a line per entry for the log ("restored ... to
/// ...", or "cannot restore ...: why").
std::vector<std::string> restore_journalled(ControlJournal& journal, const ControlFiles& files,
                                            const std::function<Status(const ControlJournal::Entry&)>& restore_other);

}  // namespace joule::adapters
