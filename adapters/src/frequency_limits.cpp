#include "joule/adapters/frequency_limits.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "control_files.hpp"
#include "joule/adapters/sysfs.hpp"

namespace joule::adapters {
namespace {

using std::filesystem::path;

constexpr std::string_view kWriteHint = "jouled needs root, or write access to cpufreq's files granted by a udev rule";

Error unavailable(std::string message) { return make_error(ErrorCode::unavailable, std::move(message)); }

Result<std::uint64_t> read_number(const ControlFiles& files, const path& file) {
  auto text = detail::read_file(files, file);
  if (!text) return text.error();
  return parse_unsigned(trim(*text), file);
}

std::vector<double> parse_frequencies(std::string_view text) {
  std::vector<double> mhz;
  std::istringstream words{std::string(text)};
  for (std::uint64_t khz = 0; words >> khz;) mhz.push_back(static_cast<double>(khz) / 1000.0);
  std::sort(mhz.begin(), mhz.end());
  return mhz;
}

std::vector<std::string> parse_words(std::string_view text) {
  std::vector<std::string> words;
  std::istringstream in{std::string(text)};
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

// policy0, policy2, policy10: numeric order, as the kernel numbers them.
int policy_number(const path& dir) {
  const std::string name = dir.filename().string();
  return std::atoi(name.c_str() + 6);
}

std::string mhz_text(double mhz) { return fmt::format("{:g} MHz", mhz); }

// Whether jouled may write `file`, and why not: under the shipped unit, ProtectKernelTunables=yes
// mounts /sys read-only for it (`read_only_hint`); elsewhere it lacks permission (`hint`).
Status writable(const path& file, std::string_view read_only_hint, std::string_view hint) {
  if (::access(file.c_str(), W_OK) == 0) return {};
  return make_error(ErrorCode::permission_denied, fmt::format("{} is not writable by jouled ({})", file.string(),
                                                              errno == EROFS ? read_only_hint : hint));
}

}  // namespace

std::string CpuFrequencyKnob::describe() const {
  std::string text = fmt::format("{} (governor {}), {} polic{}, {:g}-{:g} MHz", driver, governor, policies.size(),
                                 policies.size() == 1 ? "y" : "ies", min_mhz, max_mhz);
  if (!energy_preferences.empty()) text += fmt::format(", energy preferences {}", fmt::join(energy_preferences, " "));
  return text;
}

Result<CpuFrequencyKnob> CpuFrequencyKnob::discover(const path& directory, ControlFiles given) {
  const ControlFiles files = detail::complete(std::move(given));
  CpuFrequencyKnob knob;
  knob.directory = directory;
  std::vector<path> dirs;
  for (const auto& entry : sorted_entries(directory))
    if (entry.filename().string().rfind("policy", 0) == 0) dirs.push_back(entry);
  if (dirs.empty())
    return unavailable(
        fmt::format("no cpufreq policies under {} (the kernel or the VM offers no CPU frequency "
                    "scaling here)",
                    directory.string()));
  std::sort(dirs.begin(), dirs.end(), [](const path& a, const path& b) { return policy_number(a) < policy_number(b); });
  for (const path& dir : dirs) {
    CpuFrequencyPolicy policy;
    policy.directory = dir;
    auto min = read_number(files, dir / "cpuinfo_min_freq");
    auto max = read_number(files, dir / "cpuinfo_max_freq");
    auto limit = read_number(files, dir / "scaling_max_freq");
    for (const auto* read : {&min, &max, &limit})
      if (!*read) return unavailable(read->error().message);
    if (*min == 0 || *max < *min)
      return unavailable(
          fmt::format("{}: cpuinfo_min_freq {} and cpuinfo_max_freq {} kHz are not a range", dir.string(), *min, *max));
    policy.min_mhz = static_cast<double>(*min) / 1000.0;
    policy.max_mhz = static_cast<double>(*max) / 1000.0;
    if (auto cpus = detail::read_file(files, dir / "affected_cpus")) policy.cpus = std::string(trim(*cpus));
    if (auto table = detail::read_file(files, dir / "scaling_available_frequencies"))
      policy.available_mhz = parse_frequencies(*table);
    if (auto ok = writable(dir / "scaling_max_freq",
                           "a read-only /sys: under systemd, ProtectKernelTunables=yes; a drop-in with "
                           "ReadWritePaths=/sys/devices/system/cpu/cpufreq lifts it",
                           kWriteHint);
        !ok)
      return ok.error();
    knob.policies.push_back(std::move(policy));
  }
  const path& first = knob.policies.front().directory;
  if (auto driver = detail::read_file(files, first / "scaling_driver")) knob.driver = std::string(trim(*driver));
  if (auto governor = detail::read_file(files, first / "scaling_governor"))
    knob.governor = std::string(trim(*governor));
  if (auto preferences = detail::read_file(files, first / "energy_performance_available_preferences"))
    knob.energy_preferences = parse_words(*preferences);
  knob.min_mhz = knob.policies.front().min_mhz;
  knob.max_mhz = knob.policies.front().max_mhz;
  for (const auto& policy : knob.policies) {
    knob.min_mhz = std::min(knob.min_mhz, policy.min_mhz);
    knob.max_mhz = std::max(knob.max_mhz, policy.max_mhz);
  }
  return knob;
}

SavedFileWrites::SavedFileWrites(ControlJournal* journal, ControlFiles files, std::string write_hint)
    : journal_(journal), files_(detail::complete(std::move(files))), write_hint_(std::move(write_hint)) {}

Result<std::string> SavedFileWrites::write(const path& file, const std::string& text) {
  const bool saved =
      std::any_of(originals_.begin(), originals_.end(), [&](const auto& original) { return original.first == file; });
  if (!saved) {
    auto original = detail::read_file(files_, file);
    if (!original) return detail::with_prefix(original.error(), "cannot save the setting before changing it");
    if (journal_) {
      if (auto noted = journal_->remember({file.string(), "file", *original, 0}); !noted)
        return detail::with_prefix(noted.error(), fmt::format("{} left unchanged", file.string()));
    }
    originals_.emplace_back(file, std::move(original).value());
  }
  if (const int err = files_.write(file, text))
    return detail::file_error(
        err, fmt::format("write {} to", trim(text)), file,
        err == EACCES || err == EPERM ? std::string_view(write_hint_) : std::string_view("the kernel refused it"));
  auto back = detail::read_file(files_, file);
  if (!back) return back.error();
  return std::string(trim(*back));
}

Status SavedFileWrites::restore() {
  Status first;
  // Last written first: a lowered minimum goes back after the maximum above it.
  while (!originals_.empty()) {
    const auto [file, original] = originals_.back();
    if (const int err = files_.write(file, original)) {
      if (first.ok()) first = detail::file_error(err, "restore", file, write_hint_);
      // Kept, so a later restore() tries again; the journal keeps it for the next start.
      if (err != ENOENT) break;
    }
    originals_.pop_back();
    if (journal_) (void)journal_->forget(file.string());
  }
  return first;
}

Result<std::uint64_t> cap_frequency(SavedFileWrites& writes, const path& floor_file, const path& limit_file,
                                    std::uint64_t target, const std::vector<std::uint64_t>& available) {
  if (auto floor = read_number(writes.files(), floor_file); floor && *floor > target) {
    if (auto lowered = writes.write(floor_file, fmt::format("{}\n", target)); !lowered) return lowered.error();
  }
  auto back = writes.write(limit_file, fmt::format("{}\n", target));
  if (!back) return back.error();
  auto applied = parse_unsigned(*back, limit_file);
  if (!applied) return applied.error();
  bool as_asked = *applied == target;
  if (!as_asked && !available.empty()) {
    std::uint64_t resolved = available.front();
    for (const auto frequency : available)
      if (frequency <= target) resolved = frequency;
    as_asked = resolved == *applied;
  }
  if (!as_asked)
    return make_error(ErrorCode::conflict,
                      fmt::format("{} reads back {} after {} was written: something else limits it (a thermal or "
                                  "firmware limit, or another tool)",
                                  limit_file.string(), *applied, target));
  return *applied;
}

CpuFrequencyLimit::CpuFrequencyLimit(CpuFrequencyKnob knob, ControlJournal* journal, ControlFiles files)
    : knob_(std::move(knob)), writes_(journal, std::move(files), std::string(kWriteHint)) {}

CpuFrequencyLimit::~CpuFrequencyLimit() { (void)restore(); }

std::string CpuFrequencyLimit::describe() const {
  return fmt::format("CPU frequency limits under {}", knob_.directory.string());
}

Result<std::string> CpuFrequencyLimit::set_max_mhz(double mhz) {
  if (!std::isfinite(mhz) || mhz < knob_.min_mhz || mhz > knob_.max_mhz)
    return make_error(ErrorCode::invalid_argument, fmt::format("{} MHz is outside the CPU's range, {:g}-{:g} MHz ({})",
                                                               mhz, knob_.min_mhz, knob_.max_mhz, knob_.driver));
  std::vector<std::string> in_force;
  for (const auto& policy : knob_.policies) {
    const auto target =
        static_cast<std::uint64_t>(std::llround(std::clamp(mhz, policy.min_mhz, policy.max_mhz) * 1000));
    std::vector<std::uint64_t> table_khz;
    for (const double available : policy.available_mhz)
      table_khz.push_back(static_cast<std::uint64_t>(std::llround(available * 1000)));
    auto applied = cap_frequency(writes_, policy.directory / "scaling_min_freq", policy.directory / "scaling_max_freq",
                                 target, table_khz);
    if (!applied) return applied.error();
    in_force.push_back(
        fmt::format("{} {}", policy.directory.filename().string(), mhz_text(static_cast<double>(*applied) / 1000.0)));
  }
  return fmt::format("{}", fmt::join(in_force, ", "));
}

Status CpuFrequencyLimit::set_energy_preference(const std::string& preference) {
  if (knob_.energy_preferences.empty())
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("the {} driver has no energy-performance preference", knob_.driver));
  if (std::find(knob_.energy_preferences.begin(), knob_.energy_preferences.end(), preference) ==
      knob_.energy_preferences.end())
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("\"{}\" is not one of the driver's energy preferences ({})", preference,
                                  fmt::join(knob_.energy_preferences, ", ")));
  for (const auto& policy : knob_.policies) {
    const auto file = policy.directory / "energy_performance_preference";
    auto back = writes_.write(file, preference + "\n");
    if (!back) return back.error();
    if (*back != preference)
      return make_error(ErrorCode::conflict,
                        fmt::format("{} reads back \"{}\" after \"{}\" was written", file.string(), *back, preference));
  }
  return {};
}

Status CpuFrequencyLimit::restore() { return writes_.restore(); }

namespace {

// The devfreq names of Jetson GPUs: "57000000.gpu" (Nano, TX1 on some releases), and the GPU's
// own name elsewhere.
bool is_jetson_gpu(const std::string& name) {
  for (const std::string_view suffix : {".gpu", ".ga10b", ".gv11b", ".gp10b", ".gm20b"})
    if (name.size() > suffix.size() && name.ends_with(suffix)) return true;
  return false;
}

constexpr std::string_view kDevfreqWriteHint = "jouled needs root, or write access to the devfreq files";

}  // namespace

std::string DevfreqKnob::describe() const {
  return fmt::format("{} (governor {}), {:g}-{:g} MHz, {} frequencies", name, governor, min_mhz, max_mhz,
                     available_hz.size());
}

Result<DevfreqKnob> DevfreqKnob::discover_gpu(const path& directory, ControlFiles given) {
  const ControlFiles files = detail::complete(std::move(given));
  for (const auto& entry : sorted_entries(directory)) {
    const std::string name = entry.filename().string();
    if (!is_jetson_gpu(name)) continue;
    DevfreqKnob knob;
    knob.directory = entry;
    knob.name = name;
    auto min = read_number(files, entry / "min_freq");
    auto max = read_number(files, entry / "max_freq");
    for (const auto* read : {&min, &max})
      if (!*read) return unavailable(read->error().message);
    if (auto table = detail::read_file(files, entry / "available_frequencies")) {
      std::istringstream words{*table};
      for (std::uint64_t hz = 0; words >> hz;) knob.available_hz.push_back(hz);
      std::sort(knob.available_hz.begin(), knob.available_hz.end());
    }
    if (auto governor = detail::read_file(files, entry / "governor")) knob.governor = std::string(trim(*governor));
    const auto lowest = knob.available_hz.empty() ? *min : knob.available_hz.front();
    const auto highest = knob.available_hz.empty() ? *max : knob.available_hz.back();
    knob.min_mhz = static_cast<double>(lowest) / 1e6;
    knob.max_mhz = static_cast<double>(highest) / 1e6;
    if (auto ok = writable(entry / "max_freq", "a read-only /sys: under systemd, ProtectKernelTunables=yes",
                           kDevfreqWriteHint);
        !ok)
      return ok.error();
    return knob;
  }
  return unavailable(fmt::format("no Jetson GPU among the devfreq devices under {}", directory.string()));
}

DevfreqLimit::DevfreqLimit(DevfreqKnob knob, ControlJournal* journal, ControlFiles files)
    : knob_(std::move(knob)), writes_(journal, std::move(files), std::string(kDevfreqWriteHint)) {}

DevfreqLimit::~DevfreqLimit() { (void)restore(); }

std::string DevfreqLimit::describe() const { return "the GPU clock limit of " + knob_.directory.string(); }

Result<std::string> DevfreqLimit::set_max_mhz(double mhz) {
  if (!std::isfinite(mhz) || mhz < knob_.min_mhz || mhz > knob_.max_mhz)
    return make_error(ErrorCode::invalid_argument, fmt::format("{} MHz is outside the GPU's range, {:g}-{:g} MHz", mhz,
                                                               knob_.min_mhz, knob_.max_mhz));
  const auto target = static_cast<std::uint64_t>(std::llround(mhz * 1e6));
  auto applied =
      cap_frequency(writes_, knob_.directory / "min_freq", knob_.directory / "max_freq", target, knob_.available_hz);
  if (!applied) return applied.error();
  return fmt::format("{} {}", knob_.name, mhz_text(static_cast<double>(*applied) / 1e6));
}

Status DevfreqLimit::restore() { return writes_.restore(); }

}  // namespace joule::adapters
