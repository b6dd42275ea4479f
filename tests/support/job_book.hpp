#pragma once
// The job book (daemon::JobService) on a manual clock, for unit tests: a state directory and a
// database of its own (kept reachable, so a test can make it refuse writes), the event loop run
// until a condition holds, and submissions answered once they are committed. A test fixture
// derives from it to use the members by name.

#include <gtest/gtest.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "estimate_rows.hpp"
#include "http/routes/job_json.hpp"
#include "joule/adapters/storage_writer.hpp"
#include "joule/common/clock.hpp"
#include "joule/daemon/job_service.hpp"
#include "temp_dir.hpp"

namespace joule::testing {

/// An estimator that answers with what a test says (the daemon's is EstimateService).
class FixedEstimator final : public daemon::JobEstimator {
 public:
  using Answer = std::function<std::vector<daemon::EstimateRow>(const schedulers::JobSpec&)>;
  explicit FixedEstimator(Answer answer = {}) : answer_(std::move(answer)) {}
  void answer_with(Answer answer) { answer_ = std::move(answer); }
  std::vector<daemon::EstimateRow> estimate_job(const schedulers::JobSpec& spec) const override {
    return answer_ ? answer_(spec) : std::vector<daemon::EstimateRow>{};
  }
  /// From now on the models' part of each estimate (run off the loop) waits until `gate` is ready.
  void hold_model_work_until(std::shared_future<void> gate) { gate_ = std::move(gate); }
  ModelWork start_estimate(const schedulers::JobSpec& spec) const override {
    return [rows = estimate_job(spec), gate = gate_] {
      if (gate.valid()) gate.wait();
      return rows;
    };
  }

 private:
  Answer answer_;
  std::shared_future<void> gate_;
};

class JobBook {
 public:
  explicit JobBook(std::vector<daemon::Device> devices, std::int64_t start_unix_ms)
      : clock_(start_unix_ms),
        writer_(keep(std::move(adapters::Database::open(dir_ / "jouled.db")).value())),
        device_table_(std::move(devices)),
        jobs_(io_, writer_, metrics_, device_table_, options(), daemon::JobServiceLinks{&estimator_}, clock_) {
    EXPECT_TRUE(jobs_.recover({}, {}));
  }

  /// A coordinator's options: it runs nothing itself unless a test gives it local devices.
  daemon::JobServiceOptions options() const {
    daemon::JobServiceOptions o;
    o.state_directory = dir_.path();
    o.runner = JOULED_BINARY;
    o.node_name = "coordinator";
    return o;
  }

  /// Finished jobs beyond the latest `kept` leave the book's memory and are read back from the
  /// database through a reader of the book's own (the daemon's set-up, on a book still empty).
  void keep_finished(std::size_t kept) {
    archive_ = std::move(adapters::Database::open_reader(dir_ / "jouled.db")).value();
    jobs_.keep_finished_in(*archive_, kept);
  }

  /// Runs the loop until `done` holds (commits come back from the storage thread through it).
  template <typename Predicate>
  bool run_until(Predicate done) {
    auto busy = boost::asio::make_work_guard(io_);
    for (int i = 0; i < 2000 && !done(); ++i) {
      io_.run_for(std::chrono::milliseconds(2));
      io_.restart();
    }
    return done();
  }

  /// Jobs are estimated by `answer` from now on (before: they have none).
  void estimate_with(FixedEstimator::Answer answer) { estimator_.answer_with(std::move(answer)); }
  /// Each estimate's model work (off the loop) waits for `gate` from now on.
  void hold_model_work_until(std::shared_future<void> gate) { estimator_.hold_model_work_until(std::move(gate)); }

  /// POST /v1/jobs as the book answers it: once the job is stored, or with why not.
  Result<nlohmann::json> submit(const nlohmann::json& body) {
    std::optional<Result<nlohmann::json>> answer;
    jobs_.submit(body, daemon::JobService::Submitter{"token:test", std::nullopt},
                 [&](Result<daemon::JobView> result) { answer = rendered(result); });
    EXPECT_TRUE(run_until([&] { return answer.has_value(); }));
    return answer.value_or(make_error(ErrorCode::internal, "no answer"));
  }

  /// GET /v1/jobs/{id} as the API renders what the book returns.
  Result<nlohmann::json> shown(const std::string& id) const { return rendered(jobs_.job(id)); }
  /// GET /v1/jobs?state=...: one page, written as the API writes it and read back.
  Result<nlohmann::json> listed(const std::optional<std::string>& state, std::size_t limit,
                                const std::optional<std::string>& after = std::nullopt,
                                bool newest_first = false) const {
    auto page = jobs_.jobs(state, limit, after, newest_first);
    if (!page) return page.error();
    return nlohmann::json::parse(daemon::routes::job_page_text(*page, {}));
  }
  static Result<nlohmann::json> rendered(const Result<daemon::JobView>& view) {
    if (!view) return view.error();
    return nlohmann::json::parse(daemon::routes::job_text(*view, true, {}));
  }

 protected:
  // The writer owns the database; the book keeps a way to make it refuse writes, as a full disk
  // would (SQLite connections are serialized: a call here waits for the writer's).
  std::unique_ptr<adapters::Database> keep(std::unique_ptr<adapters::Database> database) {
    database_ = database.get();
    return database;
  }

  TempDir dir_;
  ManualClock clock_;
  boost::asio::io_context io_;
  adapters::Database* database_ = nullptr;
  adapters::StorageWriter writer_;
  std::unique_ptr<adapters::Database> archive_;  // declared before the book, which reads through it
  daemon::Metrics metrics_;
  FixedEstimator estimator_;
  daemon::DeviceTable device_table_;  // the book's devices (it adds agents' devices to them)
  daemon::JobService jobs_;
};

}  // namespace joule::testing
