#pragma once
// Untrusted text made safe to show: UTF-8 validation and an escaped, one-line form of any
// bytes, for logs, problem bodies and terminals (a newline in a job name must not forge a
// log line; a stray byte must not break a JSON dump). And trimming, which every parser needs.

#include <cstdint>
#include <string>
#include <string_view>

namespace joule {

/// The text without leading and trailing spaces, tabs and line ends.
inline std::string_view trim(std::string_view text) {
  constexpr std::string_view kSpace = " \t\r\n";
  const auto first = text.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(kSpace) - first + 1);
}

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

/// Whether the well-formed sequence `sequence` (from utf8_sequence_length) is a character
/// that moves or hides text on a terminal or in a log: C0 controls and DEL, C1 controls
/// (U+0080-U+009F: NEL, the 8-bit CSI), the line and paragraph separators U+2028/U+2029, and
/// the bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069).
inline bool is_control_sequence(std::string_view sequence) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(sequence[i]); };
  if (sequence.size() == 1) return byte(0) < 0x20 || byte(0) == 0x7F;
  if (sequence.size() == 2) return byte(0) == 0xC2 && byte(1) <= 0x9F;
  if (sequence.size() == 3 && byte(0) == 0xE2 && byte(1) == 0x80) return byte(2) >= 0xA8 && byte(2) <= 0xAE;
  if (sequence.size() == 3 && byte(0) == 0xE2 && byte(1) == 0x81) return byte(2) >= 0xA6 && byte(2) <= 0xA9;
  return false;
}

/// Whether `text` holds a control character (see is_control_sequence: newline, tab, escape,
/// NUL, NEL, U+2028, bidi overrides...). Bytes that are not UTF-8 are not counted here.
inline bool has_control_character(std::string_view text) {
  while (!text.empty()) {
    const std::size_t length = utf8_sequence_length(text);
    if (length == 0) {
      text.remove_prefix(1);
      continue;
    }
    if (is_control_sequence(text.substr(0, length))) return true;
    text.remove_prefix(length);
  }
  return false;
}

/// `text` on one line, as valid UTF-8: control characters and bytes that are not UTF-8 become
/// C-style escapes (\n, \t, \\, \x1b, \xff, \u{85}, \u{2028}); everything else, non-ASCII
/// letters included, is kept. Long input is cut at `max_bytes` of output with "..." after it.
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
    } else if (length > 1 && !is_control_sequence(text.substr(0, length))) {
      out.append(text.substr(0, length));
    } else if (length > 1) {
      // C1 controls, line separators and bidi overrides: shown by code point, \u{85}.
      const auto b = [&](std::size_t i) { return static_cast<unsigned>(static_cast<unsigned char>(text[i])); };
      const unsigned code = length == 2 ? ((b(0) & 0x1F) << 6) | (b(1) & 0x3F)
                                        : ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
      out += "\\u{";
      for (int shift = code > 0xFF ? 12 : 4; shift >= 0; shift -= 4) out.push_back(kHex[(code >> shift) & 0xF]);
      out += "}";
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
