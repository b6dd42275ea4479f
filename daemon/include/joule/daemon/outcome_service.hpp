#pragma once
// What finished jobs teach the estimates (estimator/outcome_calibration.hpp), per device: a
// job that succeeded with an estimate and metered joules of the same source becomes a row, and
// new estimates are corrected (mean) and calibrated (spread) by the rows. The rows are rebuilt
// from the job book at start, so they survive restarts without a table of their own.
// Rows are kept apart by the environment the estimate's model was learnt under (LibTorch, BLAS,
// threads: a change re-probes the device): what jobs taught about one environment's estimates
// does not correct another's. Rows of estimates stored before estimates named their environment
// count for every environment, as they did before.
// A job on several GPUs teaches no device's model; it teaches the overhead of running on
// several GPUs of its model (DataParallelCalibration), which estimates on several then apply.
// No I/O and no clock: feedback in, corrected estimates and views out.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/daemon/job_links.hpp"
#include "joule/estimator/data_parallel.hpp"
#include "joule/estimator/outcome_calibration.hpp"

namespace joule::daemon {

class OutcomeService {
 public:
  /// A job that ran to its end and was metered: learnt from when it is complete (not adopted
  /// after a restart), its estimate row is "ok" and the estimate and the meter share a source.
  /// Returns whether it became a row.
  bool record(const JobFeedback& feedback);
  /// The same for the history of finished jobs at start, refitting each device once; returns
  /// how many became rows.
  std::size_t record_all(const std::vector<JobFeedback>& history);
  /// Corrects, in place, every row with an estimate on a device with enough rows: its joules (and
  /// seconds, once a job overhead is learnt) become the corrected figures, and its correction
  /// keeps the model's own and says what was done.
  void apply(std::vector<EstimateRow>& rows) const;
  /// The environment of the model a device now estimates with (DeviceEnergyModel::environment):
  /// which of its rows view() and summaries() describe.
  void set_environment(const std::string& device, const std::string& environment);
  /// GET /v1/devices' "calibration" of one device: rows, leave-one-out errors and coverage.
  nlohmann::json view(const std::string& device) const;
  /// The same figures for the metrics, of every device that has had rows (empty figures where its
  /// model's environment has none yet).
  std::map<std::string, estimator::CalibrationSummary> summaries() const;
  /// The overhead of a job on `gpus` GPUs of the model `gpu_group`: what finished jobs on such
  /// GPUs taught, else the prior.
  estimator::DataParallelOverhead data_parallel_overhead(const std::string& gpu_group, int gpus) const;
  /// GET /v1/devices' "calibration.data_parallel" of a GPU of that model: per GPU count, the jobs
  /// and the overheads they taught.
  nlohmann::json data_parallel_view(const std::string& gpu_group) const;

 private:
  /// The row a feedback makes, when it teaches anything.
  static std::optional<estimator::OutcomeRow> row_of(const JobFeedback& feedback);
  /// A job on several GPUs, into its GPU model's overhead; whether it taught anything.
  bool record_data_parallel(const JobFeedback& feedback);

  struct DeviceRows {
    /// By environment; "" holds the rows that name none (and a simulated device's).
    std::map<std::string, estimator::OutcomeCalibration> by_environment;
    /// Rows whose estimate named no environment: they join every environment's calibration.
    std::vector<estimator::OutcomeRow> unnamed;
    /// Rows each environment learnt from jobs of its own (not counting the unnamed).
    std::map<std::string, std::size_t> own_rows;
    std::string current;  ///< set_environment's
  };
  /// The calibration for estimates made under `environment`: its own, else the unnamed rows'.
  static const estimator::OutcomeCalibration* calibration_for(const DeviceRows& rows, const std::string& environment);
  /// The environment's calibration, created (with the unnamed rows) when it has none yet.
  static estimator::OutcomeCalibration& calibration_of(DeviceRows& rows, const std::string& environment);

  std::map<std::string, DeviceRows> devices_;
  std::map<std::string, estimator::DataParallelCalibration> data_parallel_;  ///< by GPU model
};

}  // namespace joule::daemon
