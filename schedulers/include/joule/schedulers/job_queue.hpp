#pragma once
// The local run queue: which waiting job a free device takes next.
// Order: higher priority first, then submission order (FIFO). Pure; the caller owns the jobs.
// Pushing, erasing and a job's position cost O(log n): the position is shown with every queued
// job, and a listing of n queued jobs must not cost n².

#include <cstdint>
#include <ext/pb_ds/assoc_container.hpp>
#include <ext/pb_ds/tree_policy.hpp>
#include <functional>
#include <optional>
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
  /// How many jobs are ahead of this one (its position from 0), in O(log n); nullopt if it is not queued.
  std::optional<std::size_t> position(const std::string& job_id) const;

  /// The first job in order that `eligible` accepts (e.g. its device constraint matches).
  std::optional<std::string> next(const std::function<bool(const std::string&)>& eligible) const;

 private:
  // (-priority, sequence, id), kept sorted so the head is the next job. libstdc++'s policy
  // tree is a red-black tree whose nodes also count their subtree: rank queries in O(log n).
  using Key = std::tuple<int, std::int64_t, std::string>;
  using OrderedKeys = __gnu_pbds::tree<Key, __gnu_pbds::null_type, std::less<Key>, __gnu_pbds::rb_tree_tag,
                                       __gnu_pbds::tree_order_statistics_node_update>;
  OrderedKeys order_;
  std::unordered_map<std::string, Key> index_;
};

}  // namespace joule::schedulers
