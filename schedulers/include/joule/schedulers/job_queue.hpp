#pragma once
// The local run queue: which waiting job a free device takes next.
// Order: higher priority first, then submission order (FIFO). Pure; the caller owns the jobs.

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace joule::schedulers {

class JobQueue {
 public:
  /// Adds a waiting job. `sequence` is its submission number (unique, increasing).
  void push(const std::string& job_id, int priority, std::int64_t sequence);
  /// Removes a job (placed, cancelled); a no-op if it is not queued.
  void erase(const std::string& job_id);
  bool contains(const std::string& job_id) const { return index_.contains(job_id); }
  std::size_t size() const { return index_.size(); }

  /// The first `limit` jobs in order.
  std::vector<std::string> first(std::size_t limit) const;
  /// How many jobs are ahead of this one (its position from 0); nullopt if it is not queued.
  std::optional<std::size_t> position(const std::string& job_id) const;

  /// The first job in order that `eligible` accepts (e.g. its device constraint matches).
  std::optional<std::string> next(const std::function<bool(const std::string&)>& eligible) const;

 private:
  // (-priority, sequence, id): std::set keeps this sorted, so the head is the next job.
  using Key = std::tuple<int, std::int64_t, std::string>;
  std::set<Key> order_;
  std::unordered_map<std::string, Key> index_;
};

}  // namespace joule::schedulers
