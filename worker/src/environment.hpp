#pragma once
// What a measurement was taken under (WorkerEnvironment): the LibTorch version, the BLAS the
// process actually loaded, the threads, the device and its name. Torch-free header.

#include <filesystem>
#include <string>
#include <vector>

#include "joule/worker/protocol.hpp"

namespace joule::worker {

/// The environment of this process for `device` ("cpu", "cuda:N"); threads are read back from
/// ATen (at::get_num_threads), so call it after set_worker_threads.
WorkerEnvironment detect_environment(const std::string& device);

/// "1.13.0": the LibTorch headers' TORCH_VERSION_{MAJOR,MINOR,PATCH}.
std::string torch_version();

/// The BLAS in this process: OpenBLAS's openblas_get_config() when it is loaded, the BLAS
/// libraries mapped in /proc/self/maps (libblas.so.3 resolved through the alternatives), or
/// LibTorch's BLAS_INFO when BLAS is linked into libtorch (pip builds link MKL statically).
/// "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64 (/usr/lib/.../libblas.so.3)"
std::string loaded_blas();

/// The "model name" of `cpuinfo` (x86), else its "Hardware"/"Model" line (Arm boards), else
/// "unknown CPU".
std::string cpu_model_name(const std::filesystem::path& cpuinfo = "/proc/cpuinfo");

/// Pulls the BLAS out of a maps file's text: the mapped paths whose file name looks like a BLAS
/// ("libblas", "libopenblas", "libmkl", "libblis", "libflexiblas"), deduplicated, in order.
std::vector<std::string> blas_libraries_in_maps(const std::string& maps_text);

}  // namespace joule::worker
