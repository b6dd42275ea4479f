#include "environment.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <sstream>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/version.h>

// Only a CUDA LibTorch links the CUDA runtime this needs (CMake defines JOULE_WORKER_CUDA);
// Debian's CPU-only LibTorch ships the header without the library.
#if defined(JOULE_WORKER_CUDA) && __has_include(<ATen/cuda/CUDAContext.h>)
#include <ATen/cuda/CUDAContext.h>
#define JOULE_WORKER_CUDA_NAMES 1
#endif

namespace joule::worker {
namespace {

std::string trim(std::string text) {
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  text.erase(text.begin(), std::find_if(text.begin(), text.end(), not_space));
  text.erase(std::find_if(text.rbegin(), text.rend(), not_space).base(), text.end());
  return text;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string gpu_name(const std::string& device) {
#ifdef JOULE_WORKER_CUDA_NAMES
  if (torch::cuda::is_available()) {
    const int index = device.rfind("mig:", 0) == 0 ? 0 : std::stoi(device.substr(device.find(':') + 1));
    if (index >= 0 && static_cast<std::size_t>(index) < torch::cuda::device_count())
      return at::cuda::getDeviceProperties(index)->name;
  }
#endif
  return fmt::format("{} (name unknown: this LibTorch has no CUDA)", device);
}

}  // namespace

std::string torch_version() {
  return fmt::format("{}.{}.{}", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
}

std::vector<std::string> blas_libraries_in_maps(const std::string& maps_text) {
  static const std::regex blas_name(
      "/lib(open)?blas[^/]*\\.so|/libmkl[^/]*\\.so|/libblis[^/]*\\.so|/libflexiblas[^/]*\\.so");
  std::vector<std::string> found;
  std::istringstream lines(maps_text);
  std::string line;
  while (std::getline(lines, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = trim(line.substr(slash));
    if (std::regex_search(path, blas_name) && std::find(found.begin(), found.end(), path) == found.end())
      found.push_back(path);
  }
  return found;
}

std::string loaded_blas() {
  const std::vector<std::string> libraries = blas_libraries_in_maps(read_text("/proc/self/maps"));
  std::string where;
  for (const auto& library : libraries) where += (where.empty() ? "" : ", ") + library;
  using GetConfig = const char* (*)();
  if (auto* get_config = reinterpret_cast<GetConfig>(::dlsym(RTLD_DEFAULT, "openblas_get_config"))) {
    const std::string config = trim(get_config());
    return where.empty() ? config : fmt::format("{} ({})", config, where);
  }
  if (!where.empty()) {
    // Debian's reference BLAS lives in .../blas/libblas.so.3 (the alternatives' lowest priority).
    const bool reference = where.find("/blas/libblas.so") != std::string::npos;
    return reference ? fmt::format("reference BLAS ({})", where) : where;
  }
  static const std::regex blas_info("BLAS_INFO=([^,\\s]+)");
  std::smatch match;
  const std::string config = at::show_config();
  if (std::regex_search(config, match, blas_info))
    return fmt::format("linked into LibTorch (BLAS_INFO={})", match[1].str());
  return "unknown";
}

std::string cpu_model_name(const std::filesystem::path& cpuinfo) {
  std::ifstream in(cpuinfo);
  std::string line;
  std::string fallback;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    const std::string value = trim(line.substr(colon + 1));
    if (value.empty()) continue;
    if (key == "model name") return value;
    if ((key == "Hardware" || key == "Model") && fallback.empty()) fallback = value;
  }
  return fallback.empty() ? "unknown CPU" : fallback;
}

// What at::show_config() says of CUDA ("CUDA Runtime 11.7", a line of a CUDA build's config) and
// how many GPUs this process sees.
std::string cuda_summary() {
  std::istringstream config(at::show_config());
  for (std::string line; std::getline(config, line);) {
    const auto at = line.find("CUDA Runtime");
    if (at == std::string::npos) continue;
    const std::size_t gpus = torch::cuda::is_available() ? torch::cuda::device_count() : 0;
    return fmt::format("{}; {} GPU{} visible", trim(line.substr(at)), gpus, gpus == 1 ? "" : "s");
  }
  return "none: this LibTorch was built without CUDA (a GPU needs a worker built against PyTorch's, "
         "bench/gpu/build_worker.sh)";
}

WorkerEnvironment detect_environment(const std::string& device) {
  WorkerEnvironment environment;
  environment.torch_version = torch_version();
  environment.blas = loaded_blas();
  environment.threads = at::get_num_threads();
  environment.device = device;
  environment.device_name = device == "cpu" ? cpu_model_name() : gpu_name(device);
  environment.cuda = cuda_summary();
  return environment;
}

}  // namespace joule::worker
