#include "joule/daemon/usage_reports.hpp"

#include <boost/asio/post.hpp>

#include <fmt/format.h>

namespace joule::daemon {

UsageReports::UsageReports(boost::asio::io_context& io, std::filesystem::path database, std::string local_node)
    : io_(io), database_(std::move(database)), local_node_(std::move(local_node)) {}

UsageReports::~UsageReports() {
  *alive_ = false;
  thread_.stop();
  thread_.join();
}

void UsageReports::report(adapters::UsageQuery query, Done done) {
  if (in_flight_ >= kMaxInFlight)
    return done(make_error(ErrorCode::too_many,
                           fmt::format("{} usage reports are being summed; retry when one is done", kMaxInFlight)));
  ++in_flight_;
  query.local_node = local_node_;
  auto rows = std::make_shared<Result<std::vector<adapters::UsageRow>>>(std::vector<adapters::UsageRow>{});
  on_reader(
      [rows, query = std::move(query)](Result<adapters::Database*> reader) {
        *rows = reader ? (*reader)->usage(query) : Result<std::vector<adapters::UsageRow>>(reader.error());
      },
      [this, rows, done = std::move(done)] {
        --in_flight_;
        done(std::move(*rows));
      });
}

void UsageReports::recent_use(std::int64_t since_ms, std::int64_t until_ms,
                              std::function<void(Result<std::vector<adapters::RecentUse>>)> done) {
  auto rows = std::make_shared<Result<std::vector<adapters::RecentUse>>>(std::vector<adapters::RecentUse>{});
  on_reader(
      [rows, since_ms, until_ms](Result<adapters::Database*> reader) {
        *rows = reader ? (*reader)->recent_use(since_ms, until_ms)
                       : Result<std::vector<adapters::RecentUse>>(reader.error());
      },
      [rows, done = std::move(done)] { done(std::move(*rows)); });
}

void UsageReports::on_reader(std::function<void(Result<adapters::Database*>)> work, std::function<void()> then) {
  boost::asio::post(thread_, [this, alive = alive_, work = std::move(work), then = std::move(then)]() mutable {
    if (!reader_) {
      auto opened = adapters::Database::open_reader(database_);
      if (!opened) {
        work(make_error(ErrorCode::unavailable, fmt::format("cannot read jobs: {}", opened.error().message)));
      } else {
        reader_ = std::move(opened).value();
      }
    }
    if (reader_) work(reader_.get());
    if (!*alive) return;
    boost::asio::post(io_, [alive, then = std::move(then)] {
      if (*alive) then();
    });
  });
}

}  // namespace joule::daemon
