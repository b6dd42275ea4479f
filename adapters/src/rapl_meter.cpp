#include "joule/adapters/rapl_meter.hpp"

#include <algorithm>
#include <regex>

#include <fmt/format.h>

namespace joule::adapters {

std::string rapl_permission_hint(const std::filesystem::path& energy_uj_path) {
  return fmt::format(
      "{}: permission denied (root-only since CVE-2020-8694); grant read access with a udev rule "
      "(SUBSYSTEM==\"powercap\", ACTION==\"add\", RUN+=\"/bin/chmod o+r /sys%p/energy_uj\") or `chmod o+r` on "
      "energy_uj, or run jouled with CAP_DAC_READ_SEARCH (AmbientCapabilities= in its systemd unit)",
      energy_uj_path.string());
}

Result<std::unique_ptr<RaplMeter>> RaplMeter::open(RaplOptions options) {
  const auto class_dir = options.sys_root / "class" / "powercap";
  // "intel-rapl:N" and "intel-rapl:N:M"; "intel-rapl-mmio:N" and the control type "intel-rapl" do not match.
  static const std::regex kZone(R"(intel-rapl:(\d+)(:\d+)?)");
  std::unique_ptr<RaplMeter> meter(new RaplMeter(options));
  std::vector<Zone> packages, psys;  // packages with their dram sub-zones, in entry order
  for (const auto& entry : sorted_entries(class_dir)) {
    const std::string entry_name = entry.filename().string();
    std::smatch match;
    if (!std::regex_match(entry_name, match, kZone)) continue;
    auto name = read_trimmed(options.reader, entry / "name");
    if (!name) return name.error();
    const bool sub_zone = match[2].matched;
    std::vector<Zone>* into = nullptr;
    if (!sub_zone && name->rfind("package", 0) == 0) into = &packages;
    if (!sub_zone && *name == "psys") into = &psys;
    if (*name == "dram") into = &packages;  // a sub-zone of its package (a top zone on a few servers)
    if (!into) continue;
    auto max_uj = read_unsigned(options.reader, entry / "max_energy_range_uj");
    if (!max_uj) return max_uj.error();
    into->push_back(Zone{entry_name, *name, entry / "energy_uj", *max_uj, std::nullopt});
  }
  const bool has_package =
      std::any_of(packages.begin(), packages.end(), [](const Zone& z) { return z.name != "dram"; });
  if (!has_package && psys.empty())
    return make_error(ErrorCode::unavailable, fmt::format("{}: no intel-rapl package or psys zone (needs the "
                                                          "intel_rapl_msr module; AMD needs kernel 5.11+)",
                                                          class_dir.string()));
  meter->zones_ = has_package ? std::move(packages) : std::move(psys);
  meter->boot_id_ = meter->read_boot_id();
  return meter;
}

std::string RaplMeter::read_boot_id() const {
  auto id = read_trimmed(options_.reader, options_.proc_root / "sys" / "kernel" / "random" / "boot_id");
  return id ? *id : std::string();
}

Result<std::uint64_t> RaplMeter::read_energy_uj(const Zone& zone) const {
  auto text = options_.reader(zone.energy_uj_path);
  if (!text) {
    if (text.error().code == ErrorCode::permission_denied)
      return make_error(ErrorCode::permission_denied, rapl_permission_hint(zone.energy_uj_path));
    return text.error();
  }
  auto value = parse_unsigned(*text, zone.energy_uj_path);
  if (value && *value > zone.max_energy_range_uj)
    return make_error(ErrorCode::io, fmt::format("{}: {} exceeds max_energy_range_uj {}", zone.energy_uj_path.string(),
                                                 *value, zone.max_energy_range_uj));
  return value;
}

Result<Joules> RaplMeter::read() {
  // Read every zone before changing any state, so a failed read leaves the baselines whole.
  std::vector<std::uint64_t> now_uj;
  now_uj.reserve(zones_.size());
  for (const auto& zone : zones_) {
    auto value = read_energy_uj(zone);
    if (!value) return value.error();
    now_uj.push_back(*value);
  }
  const std::string boot_id = read_boot_id();
  const bool restarted = boot_id != boot_id_;
  boot_id_ = boot_id;
  for (std::size_t i = 0; i < zones_.size(); ++i) {
    Zone& zone = zones_[i];
    const std::uint64_t cur = now_uj[i];
    if (zone.last_uj) {
      const std::uint64_t prev = *zone.last_uj;
      std::uint64_t delta = 0;
      if (restarted)
        delta = cur;  // counters restarted at boot: everything since then is in this interval
      else if (cur >= prev)
        delta = cur - prev;
      else
        delta = cur + (zone.max_energy_range_uj - prev);
      total_uj_ += static_cast<double>(delta);
    }
    zone.last_uj = cur;
  }
  return Joules{total_uj_ * 1e-6};
}

std::string RaplMeter::description() const {
  std::string text;
  for (const auto& zone : zones_) {
    const bool dram = zone.name == "dram";
    if (!text.empty()) text += dram ? " + " : "; ";
    text += zone.entry + " " + zone.name;
  }
  return text;
}

}  // namespace joule::adapters
