#pragma once
// A job trace for joule-sim: JSON Lines, one submitted job per line (blank lines are skipped):
//
//   {"at": 3600, "name": "lenet-a", "model": "../../../examples/models/lenet5.json",
//    "training": {"batch_size": 64, "epochs": 5, "samples_per_epoch": 60000},
//    "constraints": {"devices": ["cuda:*", "pi-1/cpu"], "deadline_seconds": 7200,
//                    "max_energy_joules": 500000},
//    "priority": 0}
//
//   at                 seconds after the trace's start when the job is submitted (>= 0)
//   name               optional; defaults to "job-<line>"
//   model              a model spec (as in POST /v1/jobs) inline, or the path of a JSON file holding
//                      one, relative to the trace file
//   training           as in POST /v1/jobs
//   constraints        optional: devices (globs matched against "node/device" and the bare
//                      device name, as schedulers::device_allowed does), deadline_seconds and
//                      not_before_seconds (relative to the job's submission; not_before before
//                      the deadline), max_energy_joules, max_slowdown
//                      (how much slower than at its device's defaults a knob setting may make
//                      it: 0.1 is 10 %; replaces the policy's knobs.max_slowdown)
//   priority           optional integer; higher first, then submission order
//   resources          optional: {"cores": N}, {"cores": {"min": a, "max": b}} (placement chooses
//                      between a and b) or {"gpus": N}, as in POST /v1/jobs: on a device
//                      that shares its cores (the cluster's `cores`) the job holds N of them
//                      beside other jobs; with gpus it runs on N GPUs of one node's profile at
//                      once, each held whole (data-parallel: see world.hpp)
//
// Every error is "file:line: /json/pointer: message".

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"
#include "joule/estimator/model_spec.hpp"

namespace joule::simulator {

struct TraceJob {
  std::string name;
  double at_seconds = 0.0;
  estimator::ModelSpec model;
  std::string model_key;  ///< the canonical spec JSON: equal networks share analysis and probes
  estimator::TrainingConfig training;
  std::vector<std::string> devices;  ///< glob patterns; empty: any device
  std::optional<double> deadline_seconds;
  std::optional<double> not_before_seconds;
  std::optional<double> max_energy_joules;
  std::optional<double> max_slowdown;
  int priority = 0;
  std::string owner;    ///< who submitted it (fair share, per-owner figures); empty: nobody in particular
  std::string project;  ///< its project (fair share with the policy's [[projects]] shares); empty: none
  int cores = 0;        ///< resources.cores; 0: none asked (it holds a whole device)
  int gpus = 0;         ///< resources.gpus; 0: none asked (any one device)
  int cores_max = 0;    ///< resources.cores {min, max}: its max (`cores`: its min); 0: a count
  int line = 0;
};

struct Trace {
  std::vector<TraceJob> jobs;  ///< in file order
  std::string source;
};

/// Reads a model spec file named in a trace (a path relative to the trace file).
using ModelReader = std::function<Result<nlohmann::json>(const std::string& path)>;

/// Parses a trace's text. `read_model` resolves "model": "<path>"; each path is read once.
Result<Trace> parse_trace(const std::string& text, const std::string& file_name, const ModelReader& read_model);

/// Reads a trace file, resolving model paths against its directory.
Result<Trace> load_trace(const std::filesystem::path& path);

}  // namespace joule::simulator
