#pragma once
// Group commit: writes that arrive together share one SQLite transaction and one fsync.
//
// Every write runs on the writer's own thread inside a savepoint, so one failing write does
// not spoil the others in its batch. `done` is called on the writer thread after the batch's
// COMMIT returned (so the write is durable), or with the error; callers hop back to their own
// executor before touching their state.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "joule/adapters/database.hpp"

namespace joule::adapters {

class StorageWriter {
 public:
  using Write = std::function<Status(Database&)>;
  using Done = std::function<void(Status)>;

  explicit StorageWriter(std::unique_ptr<Database> database);
  /// Drains what was submitted, then stops.
  ~StorageWriter();
  StorageWriter(const StorageWriter&) = delete;
  StorageWriter& operator=(const StorageWriter&) = delete;

  /// Queues a write. After stop() it fails at once with `unavailable`.
  void submit(Write write, Done done);
  /// Finishes every queued write, then joins the thread. Idempotent.
  void stop();

  std::uint64_t commits() const { return commits_.load(); }
  std::uint64_t writes() const { return writes_.load(); }

 private:
  struct Pending {
    Write write;
    Done done;
  };
  void run();
  void commit_batch(std::deque<Pending>& batch);

  std::unique_ptr<Database> database_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  std::atomic<std::uint64_t> commits_{0};
  std::atomic<std::uint64_t> writes_{0};
  std::thread thread_;
};

}  // namespace joule::adapters
