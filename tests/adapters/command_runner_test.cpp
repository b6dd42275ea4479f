#include "joule/adapters/command_runner.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>

#include <gtest/gtest.h>

using joule::ErrorCode;
using joule::adapters::CommandOptions;
using joule::adapters::run_command;
using namespace std::chrono_literals;

TEST(CommandRunnerTest, captures_stdout_stderr_and_exit_code) {
  auto result = run_command({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"});
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->out, "out\n");
  EXPECT_EQ(result->err, "err\n");
  EXPECT_EQ(result->exit_code, 3);
  EXPECT_EQ(result->signal, 0);
  EXPECT_FALSE(result->success());
}

TEST(CommandRunnerTest, looks_up_path_and_passes_arguments_without_a_shell) {
  auto result = run_command({"printf", "%s|", "a b", "$HOME", "*"});
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_TRUE(result->success());
  EXPECT_EQ(result->out, "a b|$HOME|*|");
}

TEST(CommandRunnerTest, reports_the_signal_that_ended_it) {
  auto result = run_command({"/bin/sh", "-c", "kill -TERM $$"});
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->signal, 15);
  EXPECT_FALSE(result->success());
}

TEST(CommandRunnerTest, extra_environment_replaces_and_adds) {
  ::setenv("JOULE_RUNNER_TEST", "old", 1);
  CommandOptions options;
  options.env = {"JOULE_RUNNER_TEST=new", "JOULE_RUNNER_EXTRA=x"};
  auto result =
      run_command({"/bin/sh", "-c", "printf '%s %s' \"$JOULE_RUNNER_TEST\" \"$JOULE_RUNNER_EXTRA\""}, options);
  ::unsetenv("JOULE_RUNNER_TEST");
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->out, "new x");
}

TEST(CommandRunnerTest, a_missing_program_is_unavailable) {
  auto absolute = run_command({"/nonexistent/sbatch"});
  ASSERT_FALSE(absolute);
  EXPECT_EQ(absolute.error().code, ErrorCode::unavailable);
  EXPECT_NE(absolute.error().message.find("/nonexistent/sbatch"), std::string::npos);
  auto searched = run_command({"joule-no-such-tool-anywhere"});
  ASSERT_FALSE(searched);
  EXPECT_EQ(searched.error().code, ErrorCode::unavailable);
  EXPECT_EQ(run_command({}).error().code, ErrorCode::invalid_argument);
}

TEST(CommandRunnerTest, a_hanging_command_and_its_children_are_killed_at_the_timeout) {
  CommandOptions options;
  options.timeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  // The grandchild keeps the pipes open: the runner must not wait for it either.
  auto result = run_command({"/bin/sh", "-c", "sleep 30 & sleep 30"}, options);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, ErrorCode::unavailable);
  EXPECT_NE(result.error().message.find("timed out after 0.3 s"), std::string::npos) << result.error().message;
  EXPECT_LT(elapsed, 3s);
}

TEST(CommandRunnerTest, output_over_the_limit_kills_the_command) {
  CommandOptions options;
  options.max_output_bytes = 1000;
  auto result = run_command({"/bin/sh", "-c", "yes"}, options);
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, ErrorCode::internal);

  auto large = run_command({"/bin/sh", "-c", "head -c 3000000 /dev/zero; head -c 100000 /dev/zero >&2"});
  ASSERT_TRUE(large) << large.error().message;
  EXPECT_EQ(large->out.size(), 3000000U);
  EXPECT_EQ(large->err.size(), 100000U);
}

TEST(CommandRunnerTest, inherits_no_descriptor_of_ours) {
  const int fd = ::open("/dev/null", O_RDONLY);  // deliberately without O_CLOEXEC
  ASSERT_GE(fd, 3);
  auto result = run_command({"/bin/sh", "-c", "ls /proc/self/fd | wc -l"});
  ::close(fd);
  ASSERT_TRUE(result) << result.error().message;
  // 0, 1, 2 and the descriptor ls opens to read the directory.
  EXPECT_EQ(result->out, "4\n");
}
