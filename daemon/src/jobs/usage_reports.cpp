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
  boost::asio::post(thread_, [this, alive = alive_, query = std::move(query), done = std::move(done)]() mutable {
    Result<std::vector<adapters::UsageRow>> rows = std::vector<adapters::UsageRow>{};
    if (!reader_) {
      auto opened = adapters::Database::open_reader(database_);
      if (opened)
        reader_ = std::move(opened).value();
      else
        rows = make_error(ErrorCode::unavailable, fmt::format("cannot read jobs: {}", opened.error().message));
    }
    if (reader_) rows = reader_->usage(query);
    if (!*alive) return;
    boost::asio::post(io_, [this, alive, rows = std::move(rows), done = std::move(done)]() mutable {
      if (!*alive) return;
      --in_flight_;
      done(std::move(rows));
    });
  });
}

}  // namespace joule::daemon
