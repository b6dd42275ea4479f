#pragma once
// The meter of an agent's device on the coordinator: what the agent last reported its own
// meter read, under that meter's source. It never reads hardware itself.

#include <optional>
#include <string>

#include "joule/adapters/energy_meter.hpp"

namespace joule::daemon {

class ReportedMeter final : public adapters::EnergyMeter, public adapters::ReportedReadings {
 public:
  explicit ReportedMeter(std::string source) : source_(std::move(source)) {}

  std::string_view source() const override { return source_; }
  Result<Joules> read() override {
    if (error_) return make_error(ErrorCode::unavailable, *error_);
    return Joules{offset_ + last_};
  }
  /// The agent's cumulative reading. It restarts from zero when the agent restarts; the sum
  /// here keeps counting so the coordinator's counters never go backwards.
  void report(const std::string& source, double joules, std::optional<std::string> error) override {
    source_ = source;
    if (joules < last_) offset_ += last_;
    last_ = joules;
    error_ = std::move(error);
  }
  /// The node is lost: readings stop until it is heard from again.
  void silence(std::string why) override { error_ = std::move(why); }
  adapters::ReportedReadings* reported_readings() override { return this; }

 private:
  std::string source_;
  double offset_ = 0.0;
  double last_ = 0.0;
  std::optional<std::string> error_;
};

}  // namespace joule::daemon
