#pragma once
// RFC 3339 timestamps <-> milliseconds since the Unix epoch. Pure: no clock is read here.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace joule::schedulers {

/// Milliseconds since 1970-01-01T00:00:00Z, the one time representation stored and compared.
using UnixMillis = std::int64_t;

/// Parses "2026-12-01T18:00:00Z", "2026-12-01T18:00:00.250+02:00" and the like.
std::optional<UnixMillis> parse_rfc3339(std::string_view text);

/// Formats as UTC with millisecond precision: "2026-12-01T18:00:00.250Z".
std::string format_rfc3339(UnixMillis millis);

}  // namespace joule::schedulers
