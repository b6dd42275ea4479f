#include "joule/config/grid_signal_file.hpp"

#include <gtest/gtest.h>

using joule::config::parse_grid_signal;
using joule::schedulers::parse_rfc3339;

namespace {

std::string error_of(const std::string& text, const std::string& source = "forecast.csv") {
  auto parsed = parse_grid_signal(text, source);
  return parsed ? "(accepted)" : parsed.error().message;
}

}  // namespace

TEST(GridSignalFileTest, a_csv_of_time_value_rows_is_read_with_its_header_and_comments_skipped) {
  auto signal = parse_grid_signal(
      "time,gco2_per_kwh\n# from the operator's day-ahead forecast\n2026-11-28T00:00:00Z,400\n"
      "2026-11-28T00:30:00Z, 350.5\n\n2026-11-28T01:00:00+00:00,300\n",
      "forecast.csv");
  ASSERT_TRUE(signal) << signal.error().message;
  ASSERT_EQ(signal->points().size(), 3u);
  EXPECT_EQ(signal->at(*parse_rfc3339("2026-11-28T00:45:00Z")), 350.5);
  EXPECT_EQ(signal->end(), *parse_rfc3339("2026-11-28T01:30:00Z"));
}

TEST(GridSignalFileTest, csv_errors_name_the_file_and_line) {
  EXPECT_EQ(error_of("time,value\n2026-11-28T00:00:00Z,400\nyesterday,300\n"),
            "forecast.csv:3: \"yesterday\" is not an RFC 3339 time");
  EXPECT_EQ(error_of("2026-11-28T00:00:00Z,400\n2026-11-28T01:00:00Z,lots\n"),
            "forecast.csv:2: \"lots\" is not a number 0-5000 (gCO2e/kWh)");
  EXPECT_EQ(error_of("2026-11-28T00:00:00Z,400\n2026-11-28T01:00:00Z,-3\n"),
            "forecast.csv:2: \"-3\" is not a number 0-5000 (gCO2e/kWh)");
  EXPECT_EQ(error_of("2026-11-28T01:00:00Z,400\n2026-11-28T00:00:00Z,300\n"),
            "forecast.csv:2: 2026-11-28T00:00:00Z is not after the row before (2026-11-28T01:00:00.000Z): times must "
            "increase");
  EXPECT_EQ(error_of("2026-11-28T00:00:00Z\n"), "forecast.csv:1: expected time,value");
  EXPECT_EQ(error_of("time,value\n"), "forecast.csv: no time,value rows");
}

TEST(GridSignalFileTest, the_uk_national_grid_shape_takes_the_actual_where_there_is_one_and_ends_at_the_last_to) {
  auto signal = parse_grid_signal(R"({"data": [
      {"from": "2026-11-28T12:00Z", "to": "2026-11-28T12:30Z", "intensity": {"forecast": 180, "actual": 175, "index": "moderate"}},
      {"from": "2026-11-28T12:30Z", "to": "2026-11-28T13:00Z", "intensity": {"forecast": 160, "actual": null, "index": "low"}}]})",
                                  "https://api.carbonintensity.org.uk/intensity");
  ASSERT_TRUE(signal) << signal.error().message;
  EXPECT_EQ(signal->at(*parse_rfc3339("2026-11-28T12:10:00Z")), 175.0);
  EXPECT_EQ(signal->at(*parse_rfc3339("2026-11-28T12:40:00Z")), 160.0);
  EXPECT_EQ(signal->end(), *parse_rfc3339("2026-11-28T13:00:00Z"));
  EXPECT_EQ(
      error_of(
          R"({"data": [{"from": "2026-11-28T12:00Z", "to": "2026-11-28T12:30Z", "intensity": {"forecast": "high"}}]})",
          "uk.json"),
      "uk.json: /data/0/intensity/forecast: expected a number 0-5000 (gCO2e/kWh)");
}

TEST(GridSignalFileTest, electricitymaps_and_watttime_shapes_are_read) {
  auto forecast = parse_grid_signal(R"({"zone": "DE", "forecast": [
      {"carbonIntensity": 302, "datetime": "2026-11-28T12:00:00.000Z"},
      {"carbonIntensity": 287, "datetime": "2026-11-28T13:00:00.000Z"}], "updatedAt": "2026-11-28T11:55:00.000Z"})",
                                    "em.json");
  ASSERT_TRUE(forecast) << forecast.error().message;
  EXPECT_EQ(forecast->at(*parse_rfc3339("2026-11-28T13:30:00Z")), 287.0);
  auto history = parse_grid_signal(
      R"({"zone": "DE", "history": [{"carbonIntensity": 310, "datetime": "2026-11-27T12:00:00.000Z"}]})", "em.json");
  ASSERT_TRUE(history) << history.error().message;
  auto watttime = parse_grid_signal(R"({"data": [{"point_time": "2026-11-28T12:00:00+00:00", "value": 910.5},
      {"point_time": "2026-11-28T12:05:00+00:00", "value": 905.0}], "meta": {"region": "CAISO_NORTH"}})",
                                    "wt.json");
  ASSERT_TRUE(watttime) << watttime.error().message;
  EXPECT_EQ(watttime->end(), *parse_rfc3339("2026-11-28T12:10:00Z"));
  EXPECT_EQ(error_of(R"({"forecast": [{"carbonIntensity": 302, "datetime": "noon"}]})", "em.json"),
            "em.json: /forecast/0/datetime: \"noon\" is not an RFC 3339 time");
  EXPECT_EQ(error_of(R"({"forecast": [{"carbonIntensity": 302, "datetime": "2026-11-28T12:00:00Z"},
      {"carbonIntensity": 300, "datetime": "2026-11-28T11:00:00Z"}]})",
                     "em.json"),
            "em.json: /forecast/1: 2026-11-28T11:00:00.000Z is not after the row before: times must increase");
  EXPECT_EQ(error_of("{\"forecast\": [", "em.json"), "em.json: not valid JSON");
  EXPECT_NE(error_of(R"({"zone": "DE"})", "em.json").find("em.json: not a signal"), std::string::npos);
}

TEST(GridSignalFileTest, price_signals_read_awattar_and_octopus_and_count_negative_prices_as_free) {
  using joule::config::SignalKind;
  // aWATTar: hours in milliseconds, EUR/MWh.
  auto awattar = parse_grid_signal(
      R"({"object": "list", "data": [
        {"start_timestamp": 1796169600000, "end_timestamp": 1796173200000, "marketprice": 82.5, "unit": "Eur/MWh"},
        {"start_timestamp": 1796173200000, "end_timestamp": 1796176800000, "marketprice": -4.1, "unit": "Eur/MWh"}]})",
      "awattar", SignalKind::price);
  ASSERT_TRUE(awattar) << awattar.error().message;
  ASSERT_EQ(awattar->points().size(), 2u);
  EXPECT_DOUBLE_EQ(awattar->points()[0].value, 0.0825);
  EXPECT_DOUBLE_EQ(awattar->points()[1].value, 0.0);  // paid to draw power: counted as free
  EXPECT_EQ(awattar->end(), 1796176800000);
  // Octopus: newest first, pence per kWh including VAT, read in pounds oldest first.
  auto octopus = parse_grid_signal(
      R"({"count": 2, "next": null, "previous": null, "results": [
        {"value_exc_vat": 20.0, "value_inc_vat": 21.0, "valid_from": "2026-11-28T00:30:00Z", "valid_to": "2026-11-28T01:00:00Z"},
        {"value_exc_vat": 10.0, "value_inc_vat": 10.5, "valid_from": "2026-11-28T00:00:00Z", "valid_to": "2026-11-28T00:30:00Z"}]})",
      "octopus", SignalKind::price);
  ASSERT_TRUE(octopus) << octopus.error().message;
  ASSERT_EQ(octopus->points().size(), 2u);
  EXPECT_DOUBLE_EQ(octopus->points()[0].value, 0.105);
  EXPECT_DOUBLE_EQ(octopus->points()[1].value, 0.21);
  EXPECT_EQ(octopus->end(), *parse_rfc3339("2026-11-28T01:00:00Z"));
  // A CSV price may be negative; a carbon intensity may not.
  auto csv = parse_grid_signal("2026-11-28T00:00:00Z,-0.02\n2026-11-28T01:00:00Z,0.3\n", "p.csv", SignalKind::price);
  ASSERT_TRUE(csv) << csv.error().message;
  EXPECT_DOUBLE_EQ(csv->points()[0].value, 0.0);
  EXPECT_EQ(error_of("2026-11-28T00:00:00Z,-0.02\n"), "forecast.csv:1: \"-0.02\" is not a number 0-5000 (gCO2e/kWh)");
  // Errors name the row.
  auto bad =
      parse_grid_signal(R"({"data": [{"start_timestamp": 1796169600000, "marketprice": 82.5, "unit": "Eur/kWh"}]})",
                        "awattar", SignalKind::price);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "awattar: /data/0/unit: expected a price per MWh, got \"Eur/kWh\"");
  auto carbon_json =
      parse_grid_signal(R"({"forecast": [{"datetime": "2026-11-28T00:00:00Z", "carbonIntensity": 300}]})", "price.json",
                        SignalKind::price);
  ASSERT_FALSE(carbon_json);
  EXPECT_NE(carbon_json.error().message.find("not a price signal"), std::string::npos);
}

TEST(GridSignalFileTest, absurd_values_and_gaps_between_rows_are_refused_with_the_row) {
  using joule::config::SignalKind;
  EXPECT_EQ(error_of("2026-11-28T00:00:00Z,400\n2026-11-28T01:00:00Z,40000\n"),
            "forecast.csv:2: \"40000\" is not a number 0-5000 (gCO2e/kWh)");
  auto price = parse_grid_signal("2026-11-28T00:00:00Z,2500000\n", "p.csv", SignalKind::price);
  ASSERT_FALSE(price);
  EXPECT_EQ(price.error().message, "p.csv:1: \"2500000\" is not a number up to 100000 (a price per kWh)");
  // The UK National Grid's half hours must follow each other.
  EXPECT_EQ(error_of(R"({"data": [
      {"from": "2026-11-28T12:00Z", "to": "2026-11-28T12:30Z", "intensity": {"forecast": 200}},
      {"from": "2026-11-28T13:00Z", "to": "2026-11-28T13:30Z", "intensity": {"forecast": 210}}]})",
                     "uk.json"),
            "uk.json: /data/1/from: starts at 2026-11-28T13:00:00.000Z but the row before ends at "
            "2026-11-28T12:30:00.000Z: a gap between rows");
  // As must aWATTar's hours and Octopus Energy's half hours.
  auto awattar = parse_grid_signal(R"({"data": [
      {"start_timestamp": 0, "end_timestamp": 3600000, "marketprice": 80, "unit": "Eur/MWh"},
      {"start_timestamp": 1800000, "end_timestamp": 5400000, "marketprice": 90, "unit": "Eur/MWh"}]})",
                                   "awattar", SignalKind::price);
  ASSERT_FALSE(awattar);
  EXPECT_NE(awattar.error().message.find("/data/1/start_timestamp: starts at 1970-01-01T00:30:00.000Z but the row "
                                         "before ends at 1970-01-01T01:00:00.000Z: an overlap"),
            std::string::npos)
      << awattar.error().message;
  auto octopus = parse_grid_signal(R"({"results": [
      {"value_inc_vat": 20.0, "valid_from": "2026-11-28T02:00:00Z", "valid_to": "2026-11-28T02:30:00Z"},
      {"value_inc_vat": 10.0, "valid_from": "2026-11-28T00:00:00Z", "valid_to": "2026-11-28T00:30:00Z"}]})",
                                   "octopus", SignalKind::price);
  ASSERT_FALSE(octopus);
  EXPECT_NE(octopus.error().message.find("a gap between rows"), std::string::npos) << octopus.error().message;
}
