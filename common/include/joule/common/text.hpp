#pragma once
// Untrusted text made safe to show: UTF-8 validation and an escaped, one-line form of any
// bytes, for logs, problem bodies and terminals (a newline in a job name must not forge a
// log line; a stray byte must not break a JSON dump).

#include <cstdint>
#include <string>
#include <string_view>

namespace joule {

/// Length of the well-formed UTF-8 sequence at the start of `text` (RFC 3629: no overlongs,
/// no surrogates, nothing above U+10FFFF), or 0 where the first byte does not start one.
inline std::size_t utf8_sequence_length(std::string_view text) {
  if (text.empty()) return 0;
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // overlong
    if (lead == 0xED) high = 0x9F;  // UTF-16 surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;   // overlong
    if (lead == 0xF4) high = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (text.size() < length || byte(1) < low || byte(1) > high) return 0;
  for (std::size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  }
  return length;
}

/// Whether every byte of `text` belongs to a well-formed UTF-8 sequence.
inline bool is_valid_utf8(std::string_view text) {
  while (!text.empty()) {
    const std::size_t length = utf8_sequence_length(text);
    if (length == 0) return false;
    text.remove_prefix(length);
  }
  return true;
}

/// Whether `text` holds a C0 control character or DEL (newline, tab, escape, NUL...).
inline bool has_control_character(std::string_view text) {
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7F) return true;
  }
  return false;
}

/// `text` on one line, as valid UTF-8: control characters and bytes that are not UTF-8 become
/// C-style escapes (\n, \t, \\, \x1b, \xff); everything else, non-ASCII letters included, is
/// kept. Long input is cut at `max_bytes` of output with "..." after it.
inline std::string printable(std::string_view text, std::size_t max_bytes = 1024) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size() < max_bytes ? text.size() : max_bytes);
  while (!text.empty()) {
    if (out.size() >= max_bytes) {
      out += "...";
      break;
    }
    const std::size_t length = utf8_sequence_length(text);
    const auto byte = static_cast<unsigned char>(text.front());
    if (length == 1 && byte >= 0x20 && byte != 0x7F && byte != '\\') {
      out.push_back(text.front());
    } else if (length > 1) {
      out.append(text.substr(0, length));
    } else if (byte == '\\') {
      out += "\\\\";
    } else if (byte == '\n') {
      out += "\\n";
    } else if (byte == '\r') {
      out += "\\r";
    } else if (byte == '\t') {
      out += "\\t";
    } else {
      out += "\\x";
      out.push_back(kHex[byte >> 4]);
      out.push_back(kHex[byte & 0xF]);
    }
    text.remove_prefix(length > 1 ? length : 1);
  }
  return out;
}

}  // namespace joule
