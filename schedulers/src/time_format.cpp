#include "joule/schedulers/time_format.hpp"

#include <cctype>
#include <chrono>

#include <fmt/format.h>

namespace joule::schedulers {
namespace {

bool read_digits(std::string_view text, std::size_t& pos, std::size_t count, int& out) {
  if (pos + count > text.size()) return false;
  out = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const char c = text[pos + i];
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    out = out * 10 + (c - '0');
  }
  pos += count;
  return true;
}

bool expect(std::string_view text, std::size_t& pos, char c) {
  if (pos >= text.size() || (text[pos] != c && !(c == 'T' && text[pos] == 't'))) return false;
  ++pos;
  return true;
}

}  // namespace

std::optional<UnixMillis> parse_rfc3339(std::string_view text) {
  std::size_t pos = 0;
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  if (!read_digits(text, pos, 4, year) || !expect(text, pos, '-') || !read_digits(text, pos, 2, month) ||
      !expect(text, pos, '-') || !read_digits(text, pos, 2, day) || !expect(text, pos, 'T') ||
      !read_digits(text, pos, 2, hour) || !expect(text, pos, ':') || !read_digits(text, pos, 2, minute) ||
      !expect(text, pos, ':') || !read_digits(text, pos, 2, second))
    return std::nullopt;
  int millis = 0;
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    int digits = 0;
    while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) {
      if (digits < 3) millis = millis * 10 + (text[pos] - '0');
      ++digits;
      ++pos;
    }
    if (digits == 0) return std::nullopt;
    for (; digits < 3; ++digits) millis *= 10;
  }
  int offset_minutes = 0;
  if (pos < text.size() && (text[pos] == 'Z' || text[pos] == 'z')) {
    ++pos;
  } else if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) {
    const int sign = text[pos] == '+' ? 1 : -1;
    ++pos;
    int off_h = 0, off_m = 0;
    if (!read_digits(text, pos, 2, off_h) || !expect(text, pos, ':') || !read_digits(text, pos, 2, off_m) ||
        off_h > 23 || off_m > 59)
      return std::nullopt;
    offset_minutes = sign * (off_h * 60 + off_m);
  } else {
    return std::nullopt;  // RFC 3339 requires an offset; a bare local time is ambiguous
  }
  if (pos != text.size()) return std::nullopt;

  using namespace std::chrono;
  const year_month_day date{std::chrono::year{year}, std::chrono::month{static_cast<unsigned>(month)},
                            std::chrono::day{static_cast<unsigned>(day)}};
  if (!date.ok() || hour > 23 || minute > 59 || second > 60) return std::nullopt;
  const auto days_since_epoch = sys_days{date}.time_since_epoch().count();
  const std::int64_t seconds =
      days_since_epoch * 86400LL + hour * 3600LL + minute * 60LL + second - offset_minutes * 60LL;
  return seconds * 1000 + millis;
}

std::string format_rfc3339(UnixMillis millis) {
  using namespace std::chrono;
  const auto floor_days = static_cast<std::int64_t>(millis >= 0 ? millis / 86400000 : (millis - 86399999) / 86400000);
  const year_month_day date{sys_days{days{floor_days}}};
  std::int64_t in_day = millis - floor_days * 86400000LL;
  const auto hour = in_day / 3600000;
  in_day %= 3600000;
  const auto minute = in_day / 60000;
  in_day %= 60000;
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", static_cast<int>(date.year()),
                     static_cast<unsigned>(date.month()), static_cast<unsigned>(date.day()), hour, minute,
                     in_day / 1000, in_day % 1000);
}

}  // namespace joule::schedulers
