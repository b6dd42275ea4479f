#include "joule/adapters/storage_writer.hpp"

#include <future>
#include <vector>

#include <gtest/gtest.h>

#include "temp_dir.hpp"

using joule::Status;
using joule::adapters::Database;
using joule::adapters::StorageWriter;
using joule::adapters::StoredJob;
using joule::testing::TempDir;

namespace {

StoredJob job(const std::string& id, std::int64_t sequence) {
  StoredJob row;
  row.id = id;
  row.sequence = sequence;
  row.name = id;
  row.spec_json = "{}";
  row.state = "queued";
  return row;
}

}  // namespace

TEST(StorageWriterTest, done_comes_after_commit_so_a_fresh_connection_sees_the_write) {
  TempDir dir;
  auto db = Database::open(dir / "jouled.db");
  ASSERT_TRUE(db);
  StorageWriter writer(std::move(db).value());
  std::promise<Status> committed;
  writer.submit([](Database& d) { return d.insert_job(job("a", 1)); }, [&](Status s) { committed.set_value(s); });
  ASSERT_TRUE(committed.get_future().get());
  auto reader = Database::open(dir / "jouled.db");
  ASSERT_TRUE(reader);
  EXPECT_EQ((*reader)->load_jobs()->size(), 1u);
}

TEST(StorageWriterTest, concurrent_writes_share_commits) {
  TempDir dir;
  auto db = Database::open(dir / "jouled.db");
  ASSERT_TRUE(db);
  StorageWriter writer(std::move(db).value());
  constexpr int kWrites = 400;
  std::vector<std::promise<Status>> results(kWrites);
  for (int i = 0; i < kWrites; ++i) {
    writer.submit([i](Database& d) { return d.insert_job(job("j" + std::to_string(i), i + 1)); },
                  [&results, i](Status s) { results[i].set_value(s); });
  }
  for (auto& result : results) ASSERT_TRUE(result.get_future().get());
  EXPECT_EQ(writer.writes(), static_cast<std::uint64_t>(kWrites));
  // Group commit: the writes queued while a commit ran went into later batches together.
  EXPECT_LT(writer.commits(), static_cast<std::uint64_t>(kWrites));
}

TEST(StorageWriterTest, a_failing_write_does_not_spoil_its_batch) {
  TempDir dir;
  auto db = Database::open(dir / "jouled.db");
  ASSERT_TRUE(db);
  StorageWriter writer(std::move(db).value());
  std::promise<void> gate;
  auto opened = gate.get_future().share();
  std::promise<Status> blocker_done, good_done, bad_done, good2_done;
  // The first write holds the thread so the next three land in one batch.
  writer.submit(
      [opened](Database&) {
        opened.wait();
        return Status{};
      },
      [&](Status s) { blocker_done.set_value(s); });
  writer.submit([](Database& d) { return d.insert_job(job("x", 1)); }, [&](Status s) { good_done.set_value(s); });
  writer.submit([](Database& d) { return d.insert_job(job("x", 2)); }, [&](Status s) { bad_done.set_value(s); });
  writer.submit([](Database& d) { return d.insert_job(job("y", 3)); }, [&](Status s) { good2_done.set_value(s); });
  gate.set_value();
  EXPECT_TRUE(blocker_done.get_future().get());
  EXPECT_TRUE(good_done.get_future().get());
  EXPECT_FALSE(bad_done.get_future().get());
  EXPECT_TRUE(good2_done.get_future().get());
  writer.stop();
  auto reader = Database::open(dir / "jouled.db");
  EXPECT_EQ((*reader)->load_jobs()->size(), 2u);
}

TEST(StorageWriterTest, stop_drains_then_refuses) {
  TempDir dir;
  auto db = Database::open(dir / "jouled.db");
  ASSERT_TRUE(db);
  StorageWriter writer(std::move(db).value());
  int done = 0;
  for (int i = 0; i < 50; ++i) {
    writer.submit([i](Database& d) { return d.insert_job(job("j" + std::to_string(i), i + 1)); },
                  [&done](Status s) { done += s ? 1 : 0; });
  }
  writer.stop();
  EXPECT_EQ(done, 50);
  Status late;
  writer.submit([](Database&) { return Status{}; }, [&late](Status s) { late = s; });
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().code, joule::ErrorCode::unavailable);
}
