#pragma once
// Private to the config module: collects the problems and warnings of one TOML file, each
// located by the line of the node it is about, so a file is reported whole rather than
// one problem per reload.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "joule/config/daemon_config.hpp"

namespace joule::config::detail {

class Checker {
 public:
  explicit Checker(std::string file) : file_(std::move(file)) {}

  const std::string& file() const { return file_; }

  void problem(const toml::node& node, std::string message) {
    problems_.push_back(ConfigProblem{file_, static_cast<int>(node.source().begin.line), std::move(message)});
  }
  void warning(const toml::node& node, std::string message) {
    warnings_.push_back(ConfigProblem{file_, static_cast<int>(node.source().begin.line), std::move(message)});
  }
  void warn_unknown(const toml::table& table, const std::string& where, const std::set<std::string>& known) {
    for (const auto& [key, node] : table) {
      if (!known.contains(std::string(key.str())))
        warning(node, fmt::format("unknown key {}{} (ignored)", where, key.str()));
    }
  }
  /// Like warn_unknown, but each unknown key is a problem; `known` is listed in the message.
  void reject_unknown(const toml::table& table, const std::string& where, const std::vector<std::string>& known) {
    for (const auto& [key, node] : table) {
      if (std::find(known.begin(), known.end(), key.str()) == known.end())
        problem(node, fmt::format("unknown key {}{} (known: {})", where, key.str(), fmt::join(known, ", ")));
    }
  }

  template <class T>
  std::optional<T> get(const toml::table& table, const char* key, const std::string& name) {
    const toml::node* node = table.get(key);
    if (!node) return std::nullopt;
    if constexpr (std::is_same_v<T, double>) {
      if (auto v = node->value<double>()) return *v;  // integers convert too
      problem(*node, fmt::format("{} must be a number", name));
    } else if constexpr (std::is_same_v<T, std::int64_t>) {
      if (node->is_integer()) return node->value<std::int64_t>();
      problem(*node, fmt::format("{} must be an integer", name));
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (node->is_string()) return node->value<std::string>();
      problem(*node, fmt::format("{} must be a string", name));
    }
    return std::nullopt;
  }

  double positive(const toml::table& table, const char* key, const std::string& name, double fallback,
                  bool allow_zero = false) {
    auto value = get<double>(table, key, name);
    if (!value) return fallback;
    if (*value < 0.0 || (!allow_zero && *value == 0.0)) {
      problem(*table.get(key), fmt::format("{} must be {} 0, got {}", name, allow_zero ? ">=" : ">", *value));
      return fallback;
    }
    return *value;
  }

  std::int64_t integer_in(const toml::table& table, const char* key, const std::string& name, std::int64_t low,
                          std::int64_t high, std::int64_t fallback) {
    auto value = get<std::int64_t>(table, key, name);
    if (!value) return fallback;
    if (*value < low || *value > high) {
      problem(*table.get(key), fmt::format("{} must be between {} and {}, got {}", name, low, high, *value));
      return fallback;
    }
    return *value;
  }

  std::vector<ConfigProblem> problems_;
  std::vector<ConfigProblem> warnings_;

 private:
  std::string file_;
};

}  // namespace joule::config::detail
