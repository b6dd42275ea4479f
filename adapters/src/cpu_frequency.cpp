#include "joule/adapters/cpu_frequency.hpp"

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

Result<std::uint64_t> read_khz(const ControlFiles& files, const path& file) {
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
    auto min = read_khz(files, dir / "cpuinfo_min_freq");
    auto max = read_khz(files, dir / "cpuinfo_max_freq");
    auto limit = read_khz(files, dir / "scaling_max_freq");
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
    if (::access((dir / "scaling_max_freq").c_str(), W_OK) != 0) {
      // Under the shipped unit, ProtectKernelTunables=yes mounts /sys read-only for jouled.
      const bool read_only = errno == EROFS;
      return make_error(ErrorCode::permission_denied,
                        fmt::format("{} is not writable by jouled ({})", (dir / "scaling_max_freq").string(),
                                    read_only ? "a read-only /sys: under systemd, ProtectKernelTunables=yes; a drop-in "
                                                "with ReadWritePaths=/sys/devices/system/cpu/cpufreq lifts it"
                                              : kWriteHint));
    }
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

CpuFrequencyLimit::CpuFrequencyLimit(CpuFrequencyKnob knob, ControlJournal* journal, ControlFiles files)
    : knob_(std::move(knob)), journal_(journal), files_(detail::complete(std::move(files))) {}

CpuFrequencyLimit::~CpuFrequencyLimit() { (void)restore(); }

std::string CpuFrequencyLimit::describe() const {
  return fmt::format("CPU frequency limits under {}", knob_.directory.string());
}

Status CpuFrequencyLimit::write_saved(const path& file, const std::string& text, std::string* read_back) {
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
    return detail::file_error(err, fmt::format("write {} to", trim(text)), file,
                              err == EACCES || err == EPERM ? kWriteHint : std::string_view("the kernel refused it"));
  if (read_back) {
    auto back = detail::read_file(files_, file);
    if (!back) return back.error();
    *read_back = std::string(trim(*back));
  }
  return {};
}

Result<std::string> CpuFrequencyLimit::set_max_mhz(double mhz) {
  if (!std::isfinite(mhz) || mhz < knob_.min_mhz || mhz > knob_.max_mhz)
    return make_error(ErrorCode::invalid_argument, fmt::format("{} MHz is outside the CPU's range, {:g}-{:g} MHz ({})",
                                                               mhz, knob_.min_mhz, knob_.max_mhz, knob_.driver));
  std::vector<std::string> in_force;
  for (const auto& policy : knob_.policies) {
    const auto target =
        static_cast<std::uint64_t>(std::llround(std::clamp(mhz, policy.min_mhz, policy.max_mhz) * 1000));
    // Older kernels refuse a maximum below the minimum in force (EINVAL): lower that first.
    if (auto floor = read_khz(files_, policy.directory / "scaling_min_freq"); floor && *floor > target) {
      if (auto lowered = write_saved(policy.directory / "scaling_min_freq", fmt::format("{}\n", target)); !lowered)
        return lowered.error();
    }
    std::string back;
    if (auto written = write_saved(policy.directory / "scaling_max_freq", fmt::format("{}\n", target), &back); !written)
      return written.error();
    auto applied = parse_unsigned(back, policy.directory / "scaling_max_freq");
    if (!applied) return applied.error();
    // A table driver resolves the limit down to a frequency it has (the highest one not above
    // it, or its lowest); anything else means something else holds the limit.
    bool as_asked = *applied == target;
    if (!as_asked && !policy.available_mhz.empty()) {
      double resolved = policy.available_mhz.front();
      for (const double available : policy.available_mhz)
        if (available * 1000 <= static_cast<double>(target)) resolved = available;
      as_asked = std::llround(resolved * 1000) == static_cast<long long>(*applied);
    }
    if (!as_asked)
      return make_error(ErrorCode::conflict,
                        fmt::format("{} reads back {} kHz after {} kHz was written: something else limits it (a "
                                    "thermal or firmware limit, or another tool)",
                                    (policy.directory / "scaling_max_freq").string(), *applied, target));
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
    std::string back;
    if (auto written = write_saved(policy.directory / "energy_performance_preference", preference + "\n", &back);
        !written)
      return written.error();
    // The kernel may show a preference written by number as its name; a name reads back as itself.
    if (back != preference)
      return make_error(ErrorCode::conflict,
                        fmt::format("{} reads back \"{}\" after \"{}\" was written",
                                    (policy.directory / "energy_performance_preference").string(), back, preference));
  }
  return {};
}

Status CpuFrequencyLimit::restore() {
  Status first;
  // Last written first: a lowered scaling_min_freq goes back after the maximum above it.
  while (!originals_.empty()) {
    const auto [file, original] = originals_.back();
    if (const int err = files_.write(file, original)) {
      if (first.ok()) first = detail::file_error(err, "restore", file, kWriteHint);
      // Kept, so a later restore() tries again; the journal keeps it for the next start.
      if (err != ENOENT) break;
    }
    originals_.pop_back();
    if (journal_) (void)journal_->forget(file.string());
  }
  return first;
}

}  // namespace joule::adapters
