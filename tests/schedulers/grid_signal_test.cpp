#include "joule/schedulers/grid_signal.hpp"

#include <gtest/gtest.h>

namespace joule::schedulers {
namespace {

const UnixMillis kT0 = parse_rfc3339("2026-11-28T00:00:00Z").value();
constexpr UnixMillis kHour = 3'600'000;

// A day of hourly intensities: 400 at night, a solar dip to 100 from 10:00 to 14:00.
GridSignal solar_day() {
  std::vector<SignalPoint> points;
  for (int h = 0; h < 24; ++h) points.push_back({kT0 + h * kHour, h >= 10 && h < 14 ? 100.0 : 400.0});
  return GridSignal::from_points(points).value();
}

}  // namespace

TEST(GridSignalTest, each_value_holds_until_the_next_and_the_last_as_long_as_the_one_before) {
  const GridSignal signal = solar_day();
  EXPECT_EQ(signal.begin(), kT0);
  EXPECT_EQ(signal.end(), kT0 + 24 * kHour);
  EXPECT_EQ(signal.at(kT0 + 10 * kHour + 1), 100.0);
  EXPECT_EQ(signal.at(kT0 + 14 * kHour), 400.0);
  EXPECT_FALSE(signal.at(kT0 - 1));
  EXPECT_FALSE(signal.at(kT0 + 24 * kHour));
}

TEST(GridSignalTest, the_mean_over_a_run_weighs_each_value_by_its_time) {
  const GridSignal signal = solar_day();
  EXPECT_DOUBLE_EQ(*signal.mean_over(kT0 + 9 * kHour, kT0 + 11 * kHour), 250.0);
  EXPECT_DOUBLE_EQ(*signal.mean_over(kT0 + 10 * kHour + kHour / 2, kT0 + 12 * kHour), 100.0);
  EXPECT_NEAR(*signal.mean_over(kT0 + 13 * kHour, kT0 + 15 * kHour + kHour / 2), (100.0 + 1.5 * 400.0) / 2.5, 1e-9);
  EXPECT_FALSE(signal.mean_over(kT0 + 23 * kHour, kT0 + 25 * kHour));
  EXPECT_FALSE(signal.mean_over(kT0 + 2 * kHour, kT0 + 2 * kHour));
}

TEST(GridSignalTest, the_lowest_start_is_found_exactly_within_the_window_it_may_use) {
  const GridSignal signal = solar_day();
  // A 3-hour job that may start any time from 06:00 to 20:00: it fits in the dip.
  auto best = signal.lowest_start(kT0 + 6 * kHour, kT0 + 20 * kHour, 3 * kHour);
  ASSERT_TRUE(best);
  EXPECT_EQ(best->start, kT0 + 10 * kHour);
  EXPECT_DOUBLE_EQ(best->mean, 100.0);
  // A 6-hour job covers the dip whole: every start from 08:00 to 10:00 gives the same; the earliest.
  best = signal.lowest_start(kT0 + 6 * kHour, kT0 + 20 * kHour, 6 * kHour);
  ASSERT_TRUE(best);
  EXPECT_EQ(best->start, kT0 + 8 * kHour);
  EXPECT_DOUBLE_EQ(best->mean, 200.0);
  // A deadline that leaves only the night.
  best = signal.lowest_start(kT0 + 1 * kHour, kT0 + 4 * kHour, 3 * kHour);
  ASSERT_TRUE(best);
  EXPECT_DOUBLE_EQ(best->mean, 400.0);
  // A start that would run past the forecast is not offered.
  EXPECT_FALSE(signal.lowest_start(kT0 + 23 * kHour, kT0 + 30 * kHour, 2 * kHour));
}

TEST(GridSignalTest, bad_points_are_refused_naming_the_point) {
  auto none = GridSignal::from_points({});
  ASSERT_FALSE(none);
  auto unordered = GridSignal::from_points({{kT0, 100}, {kT0 + kHour, 120}, {kT0 + kHour, 130}});
  ASSERT_FALSE(unordered);
  EXPECT_EQ(unordered.error().message,
            "point 2 (2026-11-28T01:00:00.000Z) is not after point 1 (2026-11-28T01:00:00.000Z): times must increase");
  auto negative = GridSignal::from_points({{kT0, -5}});
  ASSERT_FALSE(negative);
  EXPECT_EQ(negative.error().message,
            "point 0 (2026-11-28T00:00:00.000Z): the value must be a finite number >= 0, got -5");
  EXPECT_FALSE(GridSignal::from_points({{kT0, 100}}, kT0));
  EXPECT_EQ(GridSignal::from_points({{kT0, 100}})->end(), kT0 + kHour);
}

}  // namespace joule::schedulers

TEST(GridSignalTest, far_past_its_end_a_short_run_reads_the_last_value_exactly) {
  // A constant stands in as one point at the epoch: a millisecond now, decades later, must not
  // read the difference of two huge integrals.
  const auto constant = joule::schedulers::GridSignal::from_points({{0, 0.3}}).value();
  const joule::schedulers::UnixMillis now = 1'796'169'600'000;
  EXPECT_EQ(constant.mean_extended(now, now + 1), 0.3);
  EXPECT_EQ(constant.mean_extended(now, now + 3'600'000), 0.3);
  const auto forecast = joule::schedulers::GridSignal::from_points({{now, 100.0}, {now + 3'600'000, 300.0}}).value();
  EXPECT_EQ(forecast.mean_extended(now - 3'600'000, now), 100.0);  // before: the first value
  EXPECT_DOUBLE_EQ(forecast.mean_extended(now - 3'600'000, now + 3'600'000), 100.0);
  EXPECT_DOUBLE_EQ(forecast.mean_extended(now + 3'600'000, now + 3 * 3'600'000), 300.0);  // past its end
  EXPECT_DOUBLE_EQ(forecast.mean_extended(now, now + 4 * 3'600'000), 250.0);
}
