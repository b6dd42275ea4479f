#pragma once
// The `nvml` meter of one MIG device, a share of its GPU's energy counter.
//
// NVML meters no MIG device alone: nvmlDeviceGetTotalEnergyConsumption and PowerUsage answer
// for the whole GPU and are not supported on a MIG device's handle. So the GPU's counter is
// split among its MIG devices by a stated rule (MigPartition): each interval between two
// readings goes to the MIG devices that had work in it (a job or a probe; jouled says which,
// SharedGpuCounter::set_busy), in proportion to their compute slices, and to all of them by
// their slices while none had. The MIG devices' joules add up to the GPU's, its idle power
// included; a job alone on its GPU is charged the whole GPU. Probes read the GPU's counter whole
// (joule-worker meters itself), which is why jouled probes a MIG device only while its siblings
// have no work: the rule then gives that device the whole interval too.

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "joule/adapters/energy_meter.hpp"
#include "joule/adapters/meter_clocks.hpp"
#include "joule/adapters/nvml_library.hpp"
#include "joule/adapters/nvml_meter.hpp"

namespace joule::adapters {

/// "mig:G.I": GPU G's MIG device I (nvidia-smi -L's "MIG ... Device I" under "GPU G").
struct MigName {
  unsigned gpu = 0;
  unsigned index = 0;
};
/// The GPU and index a "mig:G.I" name names; nothing for any other name.
std::optional<MigName> parse_mig_name(const std::string& device);

/// One GPU in MIG mode: its counter, its MIG devices and which of them have work. Shared by the
/// MIG devices' meters (MigMeter); read from one strand, as every meter is.
class MigPartition {
 public:
  /// Fails (unavailable) where GPU `gpu` is not in MIG mode or has no MIG devices, naming what
  /// it is instead.
  static Result<std::shared_ptr<MigPartition>> open(std::shared_ptr<NvmlLibrary> library, unsigned gpu,
                                                    SecondsClock now_seconds = monotonic_seconds);

  unsigned gpu() const { return gpu_; }
  const std::string& gpu_name() const { return gpu_meter_->name(); }
  /// The GPU's /dev/nvidiaN minor, which every one of its MIG devices' jobs opens.
  std::optional<unsigned> gpu_minor() const;
  const std::vector<MigDevice>& devices() const { return devices_; }
  const MigDevice* device(unsigned index) const;
  /// Whether MIG device `index` has work from now on: the GPU's counter is read first, so the
  /// interval before counts by how things stood in it.
  void set_busy(unsigned index, bool busy);
  bool others_busy(unsigned index) const;
  /// MIG device `index`'s joules since the partition was opened (reads the GPU's counter).
  Result<Joules> read(unsigned index);
  /// The rule, for the meter's description and a job's energy scope.
  std::string rule(unsigned index) const;

 private:
  MigPartition(unsigned gpu, std::unique_ptr<NvmlMeter> gpu_meter, std::vector<MigDevice> devices);
  /// Reads the GPU's counter and shares what it gained since the last reading.
  Status advance();
  double slices(unsigned index) const;

  unsigned gpu_;
  std::unique_ptr<NvmlMeter> gpu_meter_;
  std::vector<MigDevice> devices_;
  std::set<unsigned> busy_;
  std::map<unsigned, double> joules_;  ///< by MIG device index
  double last_gpu_joules_ = 0.0;
};

/// The MIG partitions of a node, one per GPU in MIG mode, opened when a first MIG device of the
/// GPU is asked for: every MIG device of a GPU shares one (meter_selection.hpp).
class MigPartitions {
 public:
  Result<std::shared_ptr<MigPartition>> of(const std::string& nvml_library, unsigned gpu, SecondsClock now_seconds);

 private:
  std::map<std::pair<std::string, unsigned>, std::weak_ptr<MigPartition>> open_;
};

/// The meter of one MIG device: its share of the GPU's counter (MigPartition). Offers
/// SharedGpuCounter, and no power limit (the GPU's is its siblings' too).
class MigMeter final : public EnergyMeter, public SharedGpuCounter {
 public:
  static Result<std::unique_ptr<MigMeter>> open(std::shared_ptr<MigPartition> partition, unsigned index);

  std::string_view source() const override { return "nvml"; }
  Result<Joules> read() override { return partition_->read(index_); }
  SharedGpuCounter* shared_gpu_counter() override { return this; }

  void set_busy(bool busy) override { partition_->set_busy(index_, busy); }
  bool others_busy() const override { return partition_->others_busy(index_); }
  const std::string& cuda_visible() const override { return uuid_; }
  std::string share_rule() const override { return partition_->rule(index_); }

  /// "MIG 3g.20gb (MIG-...) of GPU 0 NVIDIA A100-SXM4-40GB: <the rule>".
  std::string description() const;
  const std::string& name() const { return name_; }
  std::optional<unsigned> gpu_minor() const { return partition_->gpu_minor(); }

 private:
  MigMeter(std::shared_ptr<MigPartition> partition, unsigned index, std::string uuid, std::string name)
      : partition_(std::move(partition)), index_(index), uuid_(std::move(uuid)), name_(std::move(name)) {}

  std::shared_ptr<MigPartition> partition_;
  unsigned index_;
  std::string uuid_;
  std::string name_;
};

}  // namespace joule::adapters
