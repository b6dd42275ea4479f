#include "joule/common/energy_source.hpp"

#include <gtest/gtest.h>

using joule::EnergySource;

TEST(EnergySourceTest, only_hardware_meters_are_measurements) {
  for (const auto source : {EnergySource::rapl, EnergySource::nvml, EnergySource::ina3221, EnergySource::hwmon,
                            EnergySource::battery, EnergySource::slurm}) {
    EXPECT_TRUE(joule::is_measurement(source)) << joule::to_string(source);
    EXPECT_TRUE(joule::is_measurement(joule::to_string(source)));
  }
  EXPECT_FALSE(joule::is_measurement(EnergySource::modelled));
  EXPECT_FALSE(joule::is_measurement(EnergySource::simulated));
  // A label stored or received as text is a measurement only when it names a hardware meter.
  for (const char* text : {"modelled", "simulated", "", "RAPL", "nvml ", "measured"})
    EXPECT_FALSE(joule::is_measurement(std::string_view(text))) << text;
}

TEST(EnergySourceTest, names_round_trip) {
  for (std::size_t i = 0; i < joule::kEnergySourceNames.size(); ++i) {
    const auto source = static_cast<EnergySource>(i);
    EXPECT_EQ(joule::energy_source_from_string(joule::to_string(source)), source);
  }
  EXPECT_FALSE(joule::energy_source_from_string("joules"));
}
