#include "joule/schedulers/time_format.hpp"

#include <gtest/gtest.h>

using joule::schedulers::format_rfc3339;
using joule::schedulers::parse_rfc3339;

TEST(TimeFormatTest, parses_utc_and_offsets) {
  EXPECT_EQ(parse_rfc3339("1970-01-01T00:00:00Z"), 0);
  EXPECT_EQ(parse_rfc3339("2026-12-01T18:00:00Z"), 1796148000000LL);
  EXPECT_EQ(parse_rfc3339("2026-12-01T20:00:00+02:00"), 1796148000000LL);
  EXPECT_EQ(parse_rfc3339("2026-12-01T18:00:00.25Z"), 1796148000250LL);
}

TEST(TimeFormatTest, rejects_what_is_not_rfc3339) {
  for (const char* bad : {"", "2026-12-01", "2026-12-01T18:00:00", "2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z",
                          "2026-12-01T18:00:00Zjunk", "tomorrow", "2026-12-01T25:00:00Z"}) {
    EXPECT_FALSE(parse_rfc3339(bad)) << bad;
  }
}

TEST(TimeFormatTest, format_round_trips) {
  for (long long millis : {0LL, 1796148000250LL, 951782400123LL /* 2000-02-29 */}) {
    EXPECT_EQ(parse_rfc3339(format_rfc3339(millis)), millis) << format_rfc3339(millis);
  }
  EXPECT_EQ(format_rfc3339(1796148000250LL), "2026-12-01T18:00:00.250Z");
}
