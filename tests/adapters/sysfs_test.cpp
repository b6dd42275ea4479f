#include "joule/adapters/sysfs.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "joule/adapters/meter_clocks.hpp"
#include "temp_dir.hpp"

using joule::ErrorCode;
using joule::Watts;
using joule::adapters::parse_signed;
using joule::adapters::parse_unsigned;
using joule::adapters::PowerIntegrator;
using joule::adapters::read_sysfs_file;
using joule::testing::TempDir;

TEST(SysfsTest, parses_numbers_with_trailing_newline_and_rejects_junk) {
  EXPECT_EQ(*parse_unsigned("262143328850\n", "f"), 262143328850ULL);
  EXPECT_EQ(*parse_unsigned("  7 \n", "f"), 7U);
  EXPECT_EQ(*parse_signed("-1200\n", "f"), -1200);
  auto empty = parse_unsigned("\n", "/sys/x/energy_uj");
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.error().code, ErrorCode::io);
  EXPECT_NE(empty.error().message.find("/sys/x/energy_uj"), std::string::npos);
  EXPECT_FALSE(parse_unsigned("12 34\n", "f"));
  EXPECT_FALSE(parse_unsigned("-5\n", "f"));
  EXPECT_FALSE(parse_unsigned("0x10\n", "f"));
  EXPECT_FALSE(parse_signed("N/A\n", "f"));
}

TEST(SysfsTest, missing_file_is_unavailable) {
  TempDir dir;
  auto text = read_sysfs_file(dir / "energy_uj");
  ASSERT_FALSE(text);
  EXPECT_EQ(text.error().code, ErrorCode::unavailable);
  EXPECT_EQ(*read_sysfs_file(dir.write("name", "package-0\n")), "package-0\n");
}

// A root-only file read by another user, as energy_uj is since CVE-2020-8694. Tests run as root,
// whom file modes do not stop, so a child process drops to `nobody` first.
TEST(SysfsTest, root_only_file_is_permission_denied_for_other_users) {
  TempDir dir;
  const auto file = dir.write("energy_uj", "123\n");
  std::filesystem::permissions(dir.path(), std::filesystem::perms::owner_all | std::filesystem::perms::others_exec |
                                               std::filesystem::perms::group_exec);
  std::filesystem::permissions(file, std::filesystem::perms::owner_read);
  if (::geteuid() != 0) {
    std::filesystem::permissions(file, std::filesystem::perms::none);
    auto text = read_sysfs_file(file);
    ASSERT_FALSE(text);
    EXPECT_EQ(text.error().code, ErrorCode::permission_denied);
    return;
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    auto text = read_sysfs_file(file);
    const bool denied = !text && text.error().code == ErrorCode::permission_denied &&
                        text.error().message.find("energy_uj") != std::string::npos;
    ::_exit(denied ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: not permission_denied; 2: could not drop to nobody";
}

TEST(PowerIntegratorTest, integrates_by_the_trapezoid_rule) {
  PowerIntegrator integrator;
  EXPECT_DOUBLE_EQ(integrator.add(Watts{10.0}, 100.0).value, 0.0);
  EXPECT_DOUBLE_EQ(integrator.add(Watts{30.0}, 102.0).value, 40.0);  // (10 + 30) / 2 × 2 s
  EXPECT_DOUBLE_EQ(integrator.add(Watts{30.0}, 102.0).value, 40.0);  // no time passed
  EXPECT_DOUBLE_EQ(integrator.add(Watts{-5.0}, 103.0).value, 55.0);  // negative counts as 0
  integrator.restart();
  EXPECT_DOUBLE_EQ(integrator.add(Watts{100.0}, 200.0).value, 55.0);  // the gap is not integrated
  EXPECT_DOUBLE_EQ(integrator.add(Watts{100.0}, 201.0).value, 155.0);
  EXPECT_DOUBLE_EQ(integrator.add(Watts{100.0}, 150.0).value, 155.0);  // a clock that went back adds nothing
}

TEST(MeterClocksTest, clocks_advance) {
  const double wall = joule::adapters::monotonic_seconds();
  const double cpu = joule::adapters::process_cpu_seconds();
  volatile double sink = 0.0;
  for (int i = 0; i < 200000; ++i) sink = sink + 1.0;
  EXPECT_GT(joule::adapters::monotonic_seconds(), wall);
  EXPECT_GT(joule::adapters::process_cpu_seconds(), cpu);
}
