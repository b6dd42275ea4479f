#pragma once
// Reading a small file whole, and looking for text in it: what tests that check files a program
// wrote (sysfs fixtures, logs, journals) need.

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace joule::testing {

/// The whole file; empty when it cannot be read.
inline std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace joule::testing
