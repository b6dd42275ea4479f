#pragma once
// The device names jouled.toml and policy files accept: "cpu", "cuda:N" (an NVIDIA GPU, N up to
// 999), "mig:G.I" (GPU G's MIG device I) and "sim:<profile>".

#include <algorithm>
#include <string_view>

namespace joule::config {

namespace device_names_detail {
inline bool digits(std::string_view text, std::size_t most) {
  return !text.empty() && text.size() <= most &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}
}  // namespace device_names_detail

inline bool is_cuda_device_name(std::string_view name) {
  return name.starts_with("cuda:") && device_names_detail::digits(name.substr(5), 3);
}

inline bool is_mig_device_name(std::string_view name) {
  if (!name.starts_with("mig:")) return false;
  const auto dot = name.find('.', 4);
  return dot != std::string_view::npos && device_names_detail::digits(name.substr(4, dot - 4), 3) &&
         device_names_detail::digits(name.substr(dot + 1), 2);
}

/// A GPU jobs run on: a whole one or a MIG device.
inline bool is_gpu_device_name(std::string_view name) { return is_cuda_device_name(name) || is_mig_device_name(name); }

inline bool is_device_name(std::string_view name) {
  if (name == "cpu") return true;
  if (name.starts_with("sim:")) return name.size() > 4;
  return is_gpu_device_name(name);
}

}  // namespace joule::config
