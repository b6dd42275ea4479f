#include "joule/adapters/frequency_limits.hpp"

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "../fakes/sysfs_fixtures.hpp"
#include "joule/adapters/control_journal.hpp"
#include "temp_dir.hpp"
#include "text_file.hpp"

using joule::ErrorCode;
using joule::testing::contains;
using joule::testing::read_text;
using joule::testing::TempDir;
using namespace joule::adapters;  // NOLINT: the module under test
using std::filesystem::path;

namespace {

const path kCpufreq = "sys/devices/system/cpu/cpufreq";

// Plays cpufreq over a fixture tree: plain files, except what a test tells it to do as the kernel
// would (resolve a limit down to the frequency table, hold a lower limit, refuse a file), and it
// keeps every write in order.
struct FakeCpufreq {
  std::vector<std::string> writes;  // "policy0/scaling_max_freq=1800000"
  bool resolve_to_table = false;    // as kernels since 5.x do for table drivers
  std::vector<std::uint64_t> table;
  std::optional<std::uint64_t> held_max_khz;  // a thermal limit the max cannot go above
  std::string refuse;                         // file name refused with `refuse_errno`
  int refuse_errno = EINVAL;

  ControlFiles files() {
    ControlFiles real = ControlFiles::system();
    ControlFiles fake = real;
    fake.write = [this, real](const path& file, std::string_view text) {
      const std::string name = file.filename().string();
      if (name == refuse) return refuse_errno;
      writes.push_back(file.parent_path().filename().string() + "/" + name + "=" + std::string(trim(text)));
      std::string value(text);
      if (name == "scaling_max_freq") {
        std::uint64_t khz = std::stoull(std::string(trim(text)));
        if (resolve_to_table && !table.empty()) {
          // The highest frequency not above the limit, else the lowest there is.
          std::uint64_t resolved = *std::min_element(table.begin(), table.end());
          for (const auto f : table)
            if (f <= khz) resolved = std::max(resolved, f);
          khz = resolved;
        }
        if (held_max_khz) khz = std::min(khz, *held_max_khz);
        value = std::to_string(khz) + "\n";
      }
      return real.write(file, value);
    };
    return fake;
  }
};

}  // namespace

TEST(CpuFrequencyKnobTest, finds_intel_pstate_policies_with_their_range_and_energy_preferences) {
  TempDir root;
  joule::testing::write_cpufreq_policy(root, joule::testing::intel_pstate_policy(0));
  auto second = joule::testing::intel_pstate_policy(1);
  second.max_khz = 3300000;  // an efficiency core of a hybrid part
  joule::testing::write_cpufreq_policy(root, second);
  auto knob = CpuFrequencyKnob::discover(root / kCpufreq);
  ASSERT_TRUE(knob) << knob.error().message;
  EXPECT_EQ(knob->driver, "intel_pstate");
  EXPECT_EQ(knob->policies.size(), 2u);
  EXPECT_DOUBLE_EQ(knob->min_mhz, 400);
  EXPECT_DOUBLE_EQ(knob->max_mhz, 4700);
  EXPECT_DOUBLE_EQ(knob->policies[1].max_mhz, 3300);
  EXPECT_EQ(knob->policies[1].cpus, "1");
  EXPECT_TRUE(knob->policies[0].available_mhz.empty());
  EXPECT_EQ(knob->describe(),
            "intel_pstate (governor powersave), 2 policies, 400-4700 MHz, energy preferences default performance "
            "balance_performance balance_power power");
}

TEST(CpuFrequencyKnobTest, orders_policies_by_number_and_reads_acpi_cpufreq_tables) {
  TempDir root;
  for (const int n : {10, 2, 0}) joule::testing::write_cpufreq_policy(root, joule::testing::acpi_cpufreq_policy(n));
  auto knob = CpuFrequencyKnob::discover(root / kCpufreq);
  ASSERT_TRUE(knob) << knob.error().message;
  ASSERT_EQ(knob->policies.size(), 3u);
  EXPECT_EQ(knob->policies[0].directory.filename(), "policy0");
  EXPECT_EQ(knob->policies[2].directory.filename(), "policy10");
  EXPECT_EQ(knob->policies[0].available_mhz, (std::vector<double>{1200, 1800, 2400, 3000}));
  EXPECT_TRUE(knob->energy_preferences.empty());
  EXPECT_EQ(knob->describe(), "acpi-cpufreq (governor schedutil), 3 policies, 1200-3000 MHz");
}

TEST(CpuFrequencyKnobTest, no_cpufreq_is_unavailable_with_the_reason) {
  TempDir root;
  auto none = CpuFrequencyKnob::discover(root / kCpufreq);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, ErrorCode::unavailable);
  EXPECT_TRUE(contains(none.error().message, "no cpufreq policies under")) << none.error().message;
  joule::testing::write_cpufreq_policy(root, joule::testing::intel_pstate_policy(0));
  std::filesystem::remove(root / kCpufreq / "policy0/cpuinfo_max_freq");
  auto broken = CpuFrequencyKnob::discover(root / kCpufreq);
  ASSERT_FALSE(broken);
  EXPECT_TRUE(contains(broken.error().message, "cpuinfo_max_freq")) << broken.error().message;
}

TEST(CpuFrequencyLimitTest, caps_every_policy_and_puts_the_saved_bytes_back) {
  TempDir root;
  for (const int n : {0, 1}) joule::testing::write_cpufreq_policy(root, joule::testing::amd_pstate_epp_policy(n));
  FakeCpufreq kernel;
  auto knob = CpuFrequencyKnob::discover(root / kCpufreq);
  ASSERT_TRUE(knob);
  {
    CpuFrequencyLimit limit(*knob, nullptr, kernel.files());
    auto set = limit.set_max_mhz(2000);
    ASSERT_TRUE(set) << set.error().message;
    EXPECT_EQ(*set, "policy0 2000 MHz, policy1 2000 MHz");
    EXPECT_EQ(read_text(root / kCpufreq / "policy1/scaling_max_freq"), "2000000\n");
    ASSERT_TRUE(limit.set_energy_preference("power"));
    EXPECT_EQ(read_text(root / kCpufreq / "policy0/energy_performance_preference"), "power\n");
    ASSERT_TRUE(limit.set_max_mhz(1500));  // a second setting keeps the first original
    ASSERT_TRUE(limit.restore());
    EXPECT_EQ(read_text(root / kCpufreq / "policy0/scaling_max_freq"), "5132000\n");
    EXPECT_EQ(read_text(root / kCpufreq / "policy1/energy_performance_preference"), "balance_performance\n");
    ASSERT_TRUE(limit.set_max_mhz(1000));
  }  // the destructor restores
  EXPECT_EQ(read_text(root / kCpufreq / "policy0/scaling_max_freq"), "5132000\n");
  EXPECT_EQ(kernel.writes.back(), "policy0/scaling_max_freq=5132000");
}

TEST(CpuFrequencyLimitTest, a_table_driver_resolves_the_limit_down_to_a_frequency_it_has) {
  TempDir root;
  joule::testing::write_cpufreq_policy(root, joule::testing::acpi_cpufreq_policy(0));
  FakeCpufreq kernel;
  kernel.resolve_to_table = true;
  kernel.table = {3000000, 2400000, 1800000, 1200000};
  CpuFrequencyLimit limit(*CpuFrequencyKnob::discover(root / kCpufreq), nullptr, kernel.files());
  auto set = limit.set_max_mhz(2000);
  ASSERT_TRUE(set) << set.error().message;
  EXPECT_EQ(*set, "policy0 1800 MHz");
}

TEST(CpuFrequencyLimitTest, a_maximum_below_the_minimum_lowers_the_minimum_first_and_both_come_back) {
  TempDir root;
  auto policy = joule::testing::intel_pstate_policy(0);
  joule::testing::write_cpufreq_policy(root, policy);
  root.write((kCpufreq / "policy0/scaling_min_freq").string(), "2000000\n");  // someone set a floor
  FakeCpufreq kernel;
  CpuFrequencyLimit limit(*CpuFrequencyKnob::discover(root / kCpufreq), nullptr, kernel.files());
  ASSERT_TRUE(limit.set_max_mhz(1000));
  ASSERT_TRUE(limit.restore());
  EXPECT_EQ(kernel.writes,
            (std::vector<std::string>{"policy0/scaling_min_freq=1000000", "policy0/scaling_max_freq=1000000",
                                      "policy0/scaling_max_freq=4700000", "policy0/scaling_min_freq=2000000"}));
}

TEST(CpuFrequencyLimitTest, out_of_range_refused_and_read_back_errors_name_the_file_and_change_nothing) {
  TempDir root;
  joule::testing::write_cpufreq_policy(root, joule::testing::intel_pstate_policy(0));
  const auto max_file = root / kCpufreq / "policy0/scaling_max_freq";
  FakeCpufreq kernel;
  auto knob = *CpuFrequencyKnob::discover(root / kCpufreq);
  {
    CpuFrequencyLimit limit(knob, nullptr, kernel.files());
    auto high = limit.set_max_mhz(9000);
    ASSERT_FALSE(high);
    EXPECT_EQ(high.error().code, ErrorCode::invalid_argument);
    EXPECT_EQ(high.error().message, "9000 MHz is outside the CPU's range, 400-4700 MHz (intel_pstate)");
    EXPECT_TRUE(kernel.writes.empty());

    kernel.held_max_khz = 1200000;  // a thermal limit holds it lower
    auto held = limit.set_max_mhz(3000);
    ASSERT_FALSE(held);
    EXPECT_EQ(held.error().code, ErrorCode::conflict);
    EXPECT_TRUE(contains(held.error().message, "scaling_max_freq reads back 1200000 after 3000000 was written"))
        << held.error().message;
    kernel.held_max_khz.reset();
    ASSERT_TRUE(limit.restore());
    EXPECT_EQ(read_text(max_file), "4700000\n");
  }
  {
    kernel.refuse = "scaling_max_freq";
    CpuFrequencyLimit limit(knob, nullptr, kernel.files());
    auto refused = limit.set_max_mhz(3000);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code, ErrorCode::invalid_argument);
    EXPECT_TRUE(contains(refused.error().message, "cannot write 3000000 to")) << refused.error().message;
    EXPECT_TRUE(contains(refused.error().message, "policy0/scaling_max_freq: invalid argument (the kernel refused it)"))
        << refused.error().message;
  }
  EXPECT_EQ(read_text(max_file), "4700000\n");
}

TEST(CpuFrequencyLimitTest, energy_preferences_are_checked_against_the_driver_and_the_kernel) {
  TempDir root;
  joule::testing::write_cpufreq_policy(root, joule::testing::intel_pstate_policy(0));
  FakeCpufreq kernel;
  CpuFrequencyLimit limit(*CpuFrequencyKnob::discover(root / kCpufreq), nullptr, kernel.files());
  auto unknown = limit.set_energy_preference("turbo");
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().message,
            "\"turbo\" is not one of the driver's energy preferences (default, performance, balance_performance, "
            "balance_power, power)");
  kernel.refuse = "energy_performance_preference";
  kernel.refuse_errno = EBUSY;  // intel_pstate under the performance governor
  auto busy = limit.set_energy_preference("power");
  ASSERT_FALSE(busy);
  EXPECT_EQ(busy.error().code, ErrorCode::conflict);

  TempDir table_root;
  joule::testing::write_cpufreq_policy(table_root, joule::testing::acpi_cpufreq_policy(0));
  CpuFrequencyLimit none(*CpuFrequencyKnob::discover(table_root / kCpufreq));
  EXPECT_EQ(none.set_energy_preference("power").error().message,
            "the acpi-cpufreq driver has no energy-performance preference");
}

TEST(CpuFrequencyLimitTest, a_journalled_setting_comes_back_at_the_next_start_after_a_kill) {
  TempDir root;
  for (const int n : {0, 1}) joule::testing::write_cpufreq_policy(root, joule::testing::intel_pstate_policy(n));
  auto journal = ControlJournal::open(root / "controls.json");
  ASSERT_TRUE(journal) << journal.error().message;
  auto limit = std::make_unique<CpuFrequencyLimit>(*CpuFrequencyKnob::discover(root / kCpufreq), &*journal);
  ASSERT_TRUE(limit->set_max_mhz(1600));
  ASSERT_TRUE(limit->set_energy_preference("power"));
  EXPECT_EQ(journal->entries().size(), 4u);

  // jouled killed with -9: nothing restored, the journal on disk is what the next start reads.
  auto next = ControlJournal::open(root / "controls.json");
  ASSERT_TRUE(next) << next.error().message;
  ASSERT_EQ(next->entries().size(), 4u);
  EXPECT_EQ(next->entries()[0].kind, "file");
  EXPECT_EQ(next->entries()[0].original, "4700000\n");
  const auto lines = restore_journalled(*next, ControlFiles::system(), {});
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_TRUE(contains(lines[0], "restored ")) << lines[0];
  EXPECT_TRUE(contains(lines[0], "policy0/scaling_max_freq to 4700000")) << lines[0];
  EXPECT_TRUE(next->entries().empty());
  EXPECT_TRUE(ControlJournal::open(root / "controls.json")->entries().empty());
  EXPECT_EQ(read_text(root / kCpufreq / "policy1/scaling_max_freq"), "4700000\n");
  EXPECT_EQ(read_text(root / kCpufreq / "policy1/energy_performance_preference"), "balance_performance\n");

  ASSERT_TRUE(limit->restore());  // the first process's restore changes nothing more
  EXPECT_TRUE(journal->entries().empty());
}

TEST(ControlJournalTest, keeps_the_first_original_and_refuses_a_file_that_is_not_a_journal) {
  TempDir root;
  auto journal = ControlJournal::open(root / "controls.json");
  ASSERT_TRUE(journal);
  ASSERT_TRUE(journal->remember({"nvml:0:power_limit", "nvml_power_limit", "250000", 0}));
  ASSERT_TRUE(journal->remember({"nvml:0:power_limit", "nvml_power_limit", "200000", 0}));
  ASSERT_EQ(journal->entries().size(), 1u);
  EXPECT_EQ(journal->entries()[0].original, "250000");
  ASSERT_TRUE(journal->forget("nvml:0:power_limit"));
  ASSERT_TRUE(journal->forget("not there"));

  root.write("bad.json", "{\"entries\": [{\"key\": 1}]}");
  auto bad = ControlJournal::open(root / "bad.json");
  ASSERT_FALSE(bad);
  EXPECT_TRUE(contains(bad.error().message, "bad.json: /entries/0 lacks key, kind or original")) << bad.error().message;
  root.write("garbage.json", "not json");
  EXPECT_FALSE(ControlJournal::open(root / "garbage.json"));
}

TEST(ControlJournalTest, an_entry_that_cannot_be_restored_is_kept_for_the_next_start) {
  TempDir root;
  auto journal = ControlJournal::open(root / "controls.json");
  ASSERT_TRUE(journal->remember({"nvml:1:power_limit", "nvml_power_limit", "300000", 1}));
  const auto lines = restore_journalled(*journal, ControlFiles::system(), [](const ControlJournal::Entry& entry) {
    return joule::make_error(ErrorCode::unavailable, "no GPU " + std::to_string(entry.index) + " here");
  });
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "cannot restore nvml:1:power_limit to 300000 (kept for the next start): no GPU 1 here");
  EXPECT_EQ(ControlJournal::open(root / "controls.json")->entries().size(), 1u);
}

TEST(DevfreqKnobTest, finds_a_jetson_gpu_among_devfreq_devices_and_caps_its_clock) {
  TempDir root;
  // An Orin's GPU and another devfreq device (not a GPU), as /sys/class/devfreq lists them.
  joule::testing::write_devfreq_gpu(root, "17000000.ga10b", {306000000, 408000000, 612000000, 816000000, 1020000000});
  joule::testing::write_devfreq_gpu(root, "15340000.vic", {115200000, 729600000});
  auto knob = DevfreqKnob::discover_gpu(root / "sys/class/devfreq");
  ASSERT_TRUE(knob) << knob.error().message;
  EXPECT_EQ(knob->name, "17000000.ga10b");
  EXPECT_EQ(knob->describe(), "17000000.ga10b (governor nvhost_podgov), 306-1020 MHz, 5 frequencies");
  const auto max_file = knob->directory / "max_freq";
  TempDir state;
  auto journal = ControlJournal::open(state / "controls.json");
  {
    DevfreqLimit limit(*knob, &*journal);
    auto set = limit.set_max_mhz(612);
    ASSERT_TRUE(set) << set.error().message;
    EXPECT_EQ(*set, "17000000.ga10b 612 MHz");
    EXPECT_EQ(read_text(max_file), "612000000\n");
    EXPECT_EQ(journal->entries().size(), 1u);
    auto high = limit.set_max_mhz(2000);
    ASSERT_FALSE(high);
    EXPECT_EQ(high.error().message, "2000 MHz is outside the GPU's range, 306-1020 MHz");
  }
  EXPECT_EQ(read_text(max_file), "1020000000\n");
  EXPECT_TRUE(journal->entries().empty());

  TempDir none;
  joule::testing::write_devfreq_gpu(none, "15340000.vic", {115200000, 729600000});
  auto missing = DevfreqKnob::discover_gpu(none / "sys/class/devfreq");
  ASSERT_FALSE(missing);
  EXPECT_TRUE(contains(missing.error().message, "no Jetson GPU among the devfreq devices")) << missing.error().message;
}
