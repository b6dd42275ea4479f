#include "joule/adapters/log_file.hpp"

#include <sys/stat.h>

#include <fstream>

#include <gtest/gtest.h>

#include "temp_dir.hpp"

using joule::adapters::LogWindow;
using joule::adapters::read_log_window;

namespace {

void write(const std::filesystem::path& path, const std::string& text) { std::ofstream(path) << text; }

TEST(LogFileTest, reads_the_tail_by_default_and_says_where_it_starts) {
  joule::testing::TempDir dir;
  write(dir / "out.log", "0123456789");
  auto chunk = read_log_window(dir / "out.log", LogWindow{std::nullopt, 4, 1 << 20});
  ASSERT_TRUE(chunk) << chunk.error().message;
  EXPECT_EQ(chunk->bytes, "6789");
  EXPECT_EQ(chunk->offset, 6u);
  EXPECT_EQ(chunk->size, 10u);
  EXPECT_EQ(chunk->next_offset(), 10u);
}

TEST(LogFileTest, a_window_never_exceeds_its_bound_and_pages_on_from_its_offset) {
  joule::testing::TempDir dir;
  write(dir / "out.log", "abcdefghij");
  auto first = read_log_window(dir / "out.log", LogWindow{0, 0, 3});
  ASSERT_TRUE(first);
  EXPECT_EQ(first->bytes, "abc");
  auto second = read_log_window(dir / "out.log", LogWindow{first->next_offset(), 0, 3});
  ASSERT_TRUE(second);
  EXPECT_EQ(second->bytes, "def");
  // A huge tail is bounded too: the window starts where the tail would and stops at the bound.
  auto tail = read_log_window(dir / "out.log", LogWindow{std::nullopt, 1ULL << 62, 4});
  ASSERT_TRUE(tail);
  EXPECT_EQ(tail->bytes, "abcd");
  auto past = read_log_window(dir / "out.log", LogWindow{1ULL << 62, 0, 4});
  ASSERT_TRUE(past);
  EXPECT_EQ(past->bytes, "");
  EXPECT_EQ(past->offset, 10u);
}

TEST(LogFileTest, a_missing_log_is_empty) {
  joule::testing::TempDir dir;
  auto chunk = read_log_window(dir / "none.log", LogWindow{});
  ASSERT_TRUE(chunk);
  EXPECT_TRUE(chunk->bytes.empty());
}

TEST(LogFileTest, a_symbolic_link_in_the_logs_place_is_not_followed) {
  joule::testing::TempDir dir;
  write(dir / "secret", "not for you");
  std::filesystem::create_symlink(dir / "secret", dir / "out.log");
  auto chunk = read_log_window(dir / "out.log", LogWindow{});
  ASSERT_FALSE(chunk);
  EXPECT_EQ(chunk.error().code, joule::ErrorCode::permission_denied);
  EXPECT_NE(chunk.error().message.find("symbolic link"), std::string::npos) << chunk.error().message;
}

TEST(LogFileTest, a_fifo_or_directory_in_the_logs_place_is_refused_without_blocking) {
  joule::testing::TempDir dir;
  ASSERT_EQ(::mkfifo((dir / "fifo.log").c_str(), 0600), 0);
  auto fifo = read_log_window(dir / "fifo.log", LogWindow{});
  ASSERT_FALSE(fifo);
  EXPECT_EQ(fifo.error().code, joule::ErrorCode::permission_denied);
  std::filesystem::create_directory(dir / "dir.log");
  EXPECT_FALSE(read_log_window(dir / "dir.log", LogWindow{}));
}

}  // namespace
