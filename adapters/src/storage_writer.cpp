#include "joule/adapters/storage_writer.hpp"

#include <vector>

namespace joule::adapters {

StorageWriter::StorageWriter(std::unique_ptr<Database> database)
    : database_(std::move(database)), thread_([this] { run(); }) {}

StorageWriter::~StorageWriter() { stop(); }

void StorageWriter::submit(Write write, Done done) {
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      queue_.push_back(Pending{std::move(write), std::move(done)});
      wake_.notify_one();
      return;
    }
  }
  done(make_error(ErrorCode::unavailable, "storage is shutting down"));
}

void StorageWriter::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void StorageWriter::run() {
  for (;;) {
    std::deque<Pending> batch;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      batch.swap(queue_);
    }
    commit_batch(batch);
  }
}

void StorageWriter::commit_batch(std::deque<Pending>& batch) {
  std::vector<Status> results;
  results.reserve(batch.size());
  Status transaction = database_->begin();
  for (auto& pending : batch) {
    if (!transaction) {
      results.push_back(transaction);
      continue;
    }
    Status step = database_->savepoint();
    if (step) {
      step = pending.write(*database_);
      const Status close = step ? database_->release_savepoint() : database_->rollback_to_savepoint();
      if (step && !close) step = close;
    }
    results.push_back(step);
  }
  if (transaction) {
    transaction = database_->commit();
    if (!transaction) (void)database_->rollback();
  }
  commits_.fetch_add(1);
  writes_.fetch_add(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    // A write that succeeded inside a transaction that failed to commit is not durable.
    batch[i].done(transaction ? results[i] : transaction);
  }
}

}  // namespace joule::adapters
