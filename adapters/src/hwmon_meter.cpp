#include "joule/adapters/hwmon_meter.hpp"

#include <algorithm>
#include <map>
#include <regex>

#include <fmt/format.h>

namespace joule::adapters {

namespace {

struct Found {
  int number;
  std::filesystem::path input;
  std::string label;
};

// The `<kind>N_input` channels of one hwmon directory, by channel number.
std::vector<Found> channels_of(const std::filesystem::path& dir, const std::string& kind, const FileReader& reader) {
  const std::regex pattern(kind + R"((\d+)_input)");
  std::vector<Found> found;
  for (const auto& entry : sorted_entries(dir)) {
    const std::string file = entry.filename().string();
    std::smatch match;
    if (!std::regex_match(file, match, pattern)) continue;
    const int number = std::stoi(match[1].str());
    auto label = read_trimmed(reader, dir / fmt::format("{}{}_label", kind, number));
    found.push_back(Found{number, entry, label ? *label : std::string()});
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.number < b.number; });
  return found;
}

}  // namespace

Result<std::unique_ptr<HwmonMeter>> HwmonMeter::open(HwmonOptions options) {
  const auto class_dir = options.sys_root / "class" / "hwmon";
  for (const auto& dir : sorted_entries(class_dir)) {
    auto name = read_trimmed(options.reader, dir / "name");
    if (!name || (!options.device_name.empty() && *name != options.device_name)) continue;
    for (const bool energy : {true, false}) {
      const auto found = channels_of(dir, energy ? "energy" : "power", options.reader);
      std::vector<Channel> chosen;
      for (const auto& channel : found) {
        const bool pick =
            options.label.empty() ? channel.label.rfind("Esocket", 0) == 0 : channel.label == options.label;
        if (pick) chosen.push_back(Channel{channel.input, channel.label, std::nullopt});
      }
      if (chosen.empty() && options.label.empty() && !found.empty())
        chosen.push_back(Channel{found.front().input, found.front().label, std::nullopt});
      if (!chosen.empty()) {
        std::string device = *name;
        return std::unique_ptr<HwmonMeter>(new HwmonMeter(std::move(options), device, energy, std::move(chosen)));
      }
    }
  }
  return make_error(ErrorCode::unavailable,
                    fmt::format("no hwmon device{} with an energy or power channel{} under {}",
                                options.device_name.empty() ? "" : " named " + options.device_name,
                                options.label.empty() ? "" : " labelled " + options.label, class_dir.string()));
}

Result<Joules> HwmonMeter::read() {
  if (!energy_) {
    auto power_uw = read_signed(options_.reader, channels_.front().input);
    if (!power_uw) return power_uw.error();
    return integrator_.add(Watts{static_cast<double>(*power_uw) * 1e-6}, options_.now_seconds());
  }
  std::vector<std::uint64_t> now_uj;
  for (const auto& channel : channels_) {
    auto value = read_unsigned(options_.reader, channel.input);
    if (!value) return value.error();
    now_uj.push_back(*value);
  }
  for (std::size_t i = 0; i < channels_.size(); ++i) {
    auto& last = channels_[i].last_uj;
    const std::uint64_t cur = now_uj[i];
    if (last) total_uj_ += static_cast<double>(cur >= *last ? cur - *last : cur);
    last = cur;
  }
  return Joules{total_uj_ * 1e-6};
}

std::string HwmonMeter::description() const {
  std::string text = name_;
  for (std::size_t i = 0; i < channels_.size(); ++i) {
    text += (i == 0 ? " " : " + ") + channels_[i].input.filename().string();
    if (!channels_[i].label.empty()) text += " (" + channels_[i].label + ")";
  }
  return text + " in " + channels_.front().input.parent_path().string();
}

}  // namespace joule::adapters
