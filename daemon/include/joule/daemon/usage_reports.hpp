#pragma once
// Usage reports (GET /v1/usage): what finished jobs used, summed per owner, project, device,
// node or day by one indexed SQLite query, run on a thread of its own with its own read
// connection so that a report over a million jobs does not hold the event loop.

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include "joule/adapters/database.hpp"
#include "joule/common/result.hpp"

namespace joule::daemon {

class UsageReports {
 public:
  using Done = std::function<void(Result<std::vector<adapters::UsageRow>>)>;

  /// Reads `database` (jouled's, written by the storage writer) on its own thread; answers on
  /// `io`. Devices named without a node are `local_node`'s.
  UsageReports(boost::asio::io_context& io, std::filesystem::path database, std::string local_node);
  ~UsageReports();
  UsageReports(const UsageReports&) = delete;
  UsageReports& operator=(const UsageReports&) = delete;

  /// Runs the query off the loop and calls `done` on it; at most kMaxInFlight at once (then a
  /// too_many error at once).
  void report(adapters::UsageQuery query, Done done);
  /// Fair share's history at start: the energy of the jobs that ended in [since_ms, until_ms),
  /// read off the loop; `done` runs on it.
  void recent_use(std::int64_t since_ms, std::int64_t until_ms,
                  std::function<void(Result<std::vector<adapters::RecentUse>>)> done);

  static constexpr std::size_t kMaxInFlight = 4;

 private:
  // Runs `work` with the reader on the report thread, then `then` on the loop (neither once
  // this is destroyed).
  void on_reader(std::function<void(Result<adapters::Database*>)> work, std::function<void()> then);

  boost::asio::io_context& io_;
  std::filesystem::path database_;
  std::string local_node_;
  std::shared_ptr<std::atomic<bool>> alive_ = std::make_shared<std::atomic<bool>>(true);
  std::size_t in_flight_ = 0;                   // on the loop
  std::unique_ptr<adapters::Database> reader_;  // on the report thread only
  boost::asio::thread_pool thread_{1};          // last: joined before the reader is closed
};

}  // namespace joule::daemon
