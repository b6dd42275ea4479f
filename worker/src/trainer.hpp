#pragma once
// The probe loop of joule-worker: train every network of a request under one meter, interleaved
// (A B A B ...), and report per-step joules and seconds. Torch-free header: main.cpp and the
// tests that drive the binary do not compile LibTorch.
//
// Method (docs/design.md, "Probing real devices"):
//  * the process pins glibc malloc's thresholds before anything allocates (pin_allocator);
//  * threads are set explicitly: ATen intra-op = `threads`, inter-op = 1, OpenBLAS = `threads`
//    (ATen does not set OpenBLAS's own pool, which otherwise uses every core);
//  * each network gets `warmup_steps` unmetered steps (all but the first timed, to size the
//    readings), then `repetitions` rounds run every network in turn for as many steps as make
//    a reading last `min_reading_seconds` at the pace of its previous reading (the warm-up's
//    at first), at least `steps_per_repetition`; each block is one reading of the meter
//    and of CLOCK_MONOTONIC (a GPU is synchronised before each reading);
//  * a network's figures are the medians of its readings; spreads are (max − min) / median.

#include "joule/adapters/energy_meter.hpp"
#include "joule/common/result.hpp"
#include "joule/worker/protocol.hpp"

namespace joule::worker {

/// mallopt(M_MMAP_THRESHOLD, 32 MiB), mallopt(M_TRIM_THRESHOLD, 1 GiB) and mallopt(M_MMAP_MAX, 0)
/// (no chunk of 32 MiB or more mapped and unmapped each step): glibc's dynamic
/// thresholds otherwise make conv timings depend on what ran before (+22–40 %). Jobs get the same
/// settings from jouled (joule/common/allocator_settings.hpp). Call first in main.
void pin_allocator();

/// Sets ATen's intra-op threads and OpenBLAS's threads to `threads`, and inter-op threads to 1
/// (ATen allows that once per process; later calls leave it as it is).
void set_worker_threads(int threads);

/// Fails with unavailable when `device` is "cuda:N" and this LibTorch or machine has no such GPU;
/// a MIG device ("mig:G.I") needs CUDA_VISIBLE_DEVICES naming it (invalid_argument otherwise).
Status check_device(const std::string& device);
/// The LibTorch device a device name trains on: a MIG device is the process's only CUDA device.
std::string torch_device(const std::string& device);

/// How long one reading must last for a meter source to resolve it (when the request says 0).
double default_min_reading_seconds(std::string_view source);

/// Trains and meters the request's networks with `meter` (opened by the caller; its source
/// is reported and decides `measured`). Errors: invalid_argument for specs that do not build,
/// unavailable for a missing device, io for a failed meter read, internal for a non-finite loss.
Result<ProbeResult> run_probe(const ProbeRequest& request, adapters::EnergyMeter& meter);

}  // namespace joule::worker
