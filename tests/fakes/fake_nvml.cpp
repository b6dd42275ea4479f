// A fake libnvidia-ml for the NVML tests: the entry points Joule uses, replaying readings from
// a script named by JOULE_FAKE_NVML_SCRIPT, which nvmlInit_v2 (re)reads. One line per setting:
//
//   init 0                         nvmlInit_v2's return code (999 = unknown error)
//   devices 2                      how many GPUs (default 1)
//   name NVIDIA Fake A100          nvmlDeviceGetName, every GPU's (as identical GPUs have one name)
//   name_of 2 NVIDIA Fake L4       GPU 2's own name (a node with GPUs of two kinds)
//   energy_mj 1000 2500 400        successive TotalEnergyConsumption readings of each GPU (the last repeats)
//   energy_mj not_supported        TotalEnergyConsumption returns NVML_ERROR_NOT_SUPPORTED
//   power_mw 100000 300000         successive PowerUsage readings
//   limit_mw 250000                every GPU's power limit at start (each GPU then has its own)
//   limit_constraints_mw 100000 300000
//   set_limit_return 4             force SetPowerManagementLimit's return code
//   set_limit_needs_cap_sys_admin  SetPowerManagementLimit returns NVML_ERROR_NO_PERMISSION unless
//                                  the calling thread has CAP_SYS_ADMIN in its effective set, as
//                                  the driver allows it (NV_IS_SUSER())
//   device_node /dev/nvidiactl     nvmlInit_v2 returns NVML_ERROR_DRIVER_NOT_LOADED unless this
//                                  path exists, as where a sandbox hides the driver's nodes
//   log /tmp/x/nvml.log            append "init", "shutdown" and "set_limit N" lines there
//                                  ("set_limit N gpu I" for GPU I > 0)
//   mig 0 3g.20gb 3g.20gb 1g.5gb   GPU 0 in MIG mode with these MIG devices (profiles as nvidia-smi
//                                  names them: N compute slices, M GB), indices 0, 1, 2; as on
//                                  real drivers they have no energy counter or power reading of
//                                  their own, and their GPU's counter keeps counting for all
//
// Without the variable every call behaves as on an idle GPU with an energy counter.

#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int kSuccess = 0;
constexpr int kUninitialized = 1;
constexpr int kInvalidArgument = 2;
constexpr int kNotSupported = 3;
constexpr int kNoPermission = 4;
constexpr int kNotFound = 6;
constexpr int kDriverNotLoaded = 9;
constexpr int kMaxDevices = 8;
constexpr int kMaxMigDevices = 7;  // an A100's or H100's most

struct Device {
  int index = 0;
  std::string name;  // "": the script's `name`
  std::optional<unsigned> limit_mw;  // set by SetPowerManagementLimit; nullopt: the script's
  std::size_t energy_cursor = 0;
  std::size_t power_cursor = 0;
  // MIG: on a GPU, its MIG devices' profiles ("3g.20gb"; empty: not in MIG mode); on a MIG
  // device, its own profile and its GPU.
  std::vector<std::string> mig_profiles;
  std::string profile;
  int parent = -1;
};

struct State {
  bool initialised = false;
  int init_return = kSuccess;
  int devices = 1;
  std::string name = "NVIDIA Fake GPU";
  bool energy_supported = true;
  std::vector<unsigned long long> energy_mj = {0};
  std::vector<unsigned> power_mw = {50000};
  unsigned limit_mw = 250000;
  unsigned min_limit_mw = 100000;
  unsigned max_limit_mw = 300000;
  int set_limit_return = kSuccess;
  bool set_limit_needs_cap_sys_admin = false;
  std::string device_node;  // "": none needed
  std::string log;
  Device device[kMaxDevices];
  Device mig[kMaxDevices][kMaxMigDevices];
};

State& state() {
  static State s;
  return s;
}

void log_line(const std::string& line) {
  if (!state().log.empty()) std::ofstream(state().log, std::ios::app) << line << '\n';
}

void load_script() {
  State fresh;
  for (int i = 0; i < kMaxDevices; ++i) fresh.device[i].index = i;
  if (const char* path = std::getenv("JOULE_FAKE_NVML_SCRIPT")) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      std::string key;
      words >> key;
      if (key == "init") words >> fresh.init_return;
      if (key == "devices") words >> fresh.devices;
      if (key == "name") std::getline(words >> std::ws, fresh.name);
      if (key == "name_of") {
        int index = -1;
        words >> index;
        if (index >= 0 && index < kMaxDevices) std::getline(words >> std::ws, fresh.device[index].name);
      }
      if (key == "energy_mj") {
        fresh.energy_mj.clear();
        std::string word;
        while (words >> word) {
          if (word == "not_supported")
            fresh.energy_supported = false;
          else
            fresh.energy_mj.push_back(std::stoull(word));
        }
      }
      if (key == "power_mw") {
        fresh.power_mw.clear();
        for (unsigned v = 0; words >> v;) fresh.power_mw.push_back(v);
      }
      if (key == "limit_mw") words >> fresh.limit_mw;
      if (key == "limit_constraints_mw") words >> fresh.min_limit_mw >> fresh.max_limit_mw;
      if (key == "set_limit_return") words >> fresh.set_limit_return;
      if (key == "set_limit_needs_cap_sys_admin") fresh.set_limit_needs_cap_sys_admin = true;
      if (key == "device_node") words >> fresh.device_node;
      if (key == "log") words >> fresh.log;
      if (key == "mig") {
        int index = -1;
        words >> index;
        if (index >= 0 && index < kMaxDevices)
          for (std::string profile; words >> profile;) fresh.device[index].mig_profiles.push_back(profile);
      }
    }
  }
  if (fresh.devices > kMaxDevices) fresh.devices = kMaxDevices;
  for (int g = 0; g < kMaxDevices; ++g)
    for (int i = 0; i < kMaxMigDevices; ++i) {
      Device& mig = fresh.mig[g][i];
      mig.index = i;
      mig.parent = g;
      if (i < static_cast<int>(fresh.device[g].mig_profiles.size())) mig.profile = fresh.device[g].mig_profiles[i];
    }
  state() = fresh;
}

Device* device_of(void* handle) {
  auto* device = static_cast<Device*>(handle);
  if (!state().initialised || device == nullptr) return nullptr;
  return device;
}

// Whether the calling thread may use CAP_SYS_ADMIN now (capget, not /proc: the caller's own thread).
bool has_cap_sys_admin() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capget, &header, data) != 0) return false;
  return (data[CAP_SYS_ADMIN / 32].effective & (1u << (CAP_SYS_ADMIN % 32))) != 0;
}

template <class T>
T next(const std::vector<T>& values, std::size_t& cursor) {
  if (values.empty()) return T{};
  const T value = values[cursor < values.size() ? cursor : values.size() - 1];
  ++cursor;
  return value;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int nvmlInit_v2() {
  load_script();
  log_line("init");
  if (state().init_return != kSuccess) return state().init_return;
  struct stat node {};
  if (!state().device_node.empty() && ::stat(state().device_node.c_str(), &node) != 0) return kDriverNotLoaded;
  state().initialised = true;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlShutdown() {
  log_line("shutdown");
  state().initialised = false;
  return kSuccess;
}

__attribute__((visibility("default"))) const char* nvmlErrorString(int result) {
  switch (result) {
    case kSuccess:
      return "Success";
    case kUninitialized:
      return "Uninitialized";
    case kInvalidArgument:
      return "Invalid Argument";
    case kNotSupported:
      return "Not Supported";
    case kNoPermission:
      return "Insufficient Permissions";
    case kDriverNotLoaded:
      return "Driver Not Loaded";
    default:
      return "Unknown Error";
  }
}

__attribute__((visibility("default"))) int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** device) {
  if (!state().initialised) return kUninitialized;
  if (device == nullptr || index >= static_cast<unsigned>(state().devices)) return kInvalidArgument;
  *device = &state().device[index];
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetName(void* handle, char* name, unsigned length) {
  Device* device = device_of(handle);
  if (!device) return kUninitialized;
  if (name == nullptr || length == 0) return kInvalidArgument;
  std::string text = device->name.empty() ? state().name : device->name;
  if (device->parent >= 0) {
    const Device& gpu = state().device[device->parent];
    text = (gpu.name.empty() ? state().name : gpu.name) + " MIG " + device->profile;
  }
  const std::size_t n = text.size() < length - 1 ? text.size() : length - 1;
  text.copy(name, n);
  name[n] = '\0';
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetTotalEnergyConsumption(void* handle,
                                                                               unsigned long long* energy_mj) {
  Device* device = device_of(handle);
  if (!device) return kUninitialized;
  if (!state().energy_supported || device->parent >= 0) return kNotSupported;
  *energy_mj = next(state().energy_mj, device->energy_cursor);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetPowerUsage(void* handle, unsigned* power_mw) {
  Device* device = device_of(handle);
  if (!device) return kUninitialized;
  if (device->parent >= 0) return kNotSupported;
  *power_mw = next(state().power_mw, device->power_cursor);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetPowerManagementLimit(void* handle, unsigned* limit_mw) {
  if (!device_of(handle)) return kUninitialized;
  *limit_mw = device_of(handle)->limit_mw.value_or(state().limit_mw);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetPowerManagementLimitConstraints(void* handle, unsigned* min_mw,
                                                                                        unsigned* max_mw) {
  if (!device_of(handle)) return kUninitialized;
  *min_mw = state().min_limit_mw;
  *max_mw = state().max_limit_mw;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceSetPowerManagementLimit(void* handle, unsigned limit_mw) {
  if (!device_of(handle)) return kUninitialized;
  if (state().set_limit_return != kSuccess) return state().set_limit_return;
  if (state().set_limit_needs_cap_sys_admin && !has_cap_sys_admin()) return kNoPermission;
  if (limit_mw < state().min_limit_mw || limit_mw > state().max_limit_mw) return kInvalidArgument;
  Device* device = device_of(handle);
  device->limit_mw = limit_mw;
  log_line("set_limit " + std::to_string(limit_mw) +
           (device->index > 0 ? " gpu " + std::to_string(device->index) : std::string()));
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetMigMode(void* handle, unsigned* current, unsigned* pending) {
  Device* device = device_of(handle);
  if (!device) return kUninitialized;
  if (device->parent >= 0) return kInvalidArgument;
  *current = *pending = device->mig_profiles.empty() ? 0 : 1;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetMaxMigDeviceCount(void* handle, unsigned* count) {
  Device* device = device_of(handle);
  if (!device) return kUninitialized;
  *count = device->mig_profiles.empty() ? 0 : kMaxMigDevices;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetMigDeviceHandleByIndex(void* handle, unsigned index,
                                                                               void** mig) {
  Device* device = device_of(handle);
  if (!device) return kUninitialized;
  if (device->parent >= 0 || index >= kMaxMigDevices || mig == nullptr) return kInvalidArgument;
  if (index >= device->mig_profiles.size()) return kNotFound;
  *mig = &state().mig[device->index][index];
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetUUID(void* handle, char* uuid, unsigned length) {
  Device* device = device_of(handle);
  if (!device) return kUninitialized;
  char text[96];
  if (device->parent >= 0)
    std::snprintf(text, sizeof text, "MIG-%08x-0000-4000-8000-%012x", 0xfa4e0000u + device->parent, device->index);
  else
    std::snprintf(text, sizeof text, "GPU-%08x-0000-4000-8000-000000000000", 0xfa4e0000u + device->index);
  if (uuid == nullptr || length <= std::strlen(text)) return kInvalidArgument;
  std::strcpy(uuid, text);
  return kSuccess;
}

// nvmlDeviceAttributes_t as nvml.h lays it out.
struct Attributes {
  unsigned multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount, sharedJpegCount,
      sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
  unsigned long long memorySizeMB;
};

__attribute__((visibility("default"))) int nvmlDeviceGetAttributes_v2(void* handle, Attributes* attributes) {
  Device* device = device_of(handle);
  if (!device) return kUninitialized;
  if (device->parent < 0 || attributes == nullptr) return kNotSupported;  // a whole GPU's are not asked for here
  // "3g.20gb": 3 slices, 20 GB (an A100's 14 multiprocessors a slice).
  unsigned slices = 0, gigabytes = 0;
  std::sscanf(device->profile.c_str(), "%ug.%ugb", &slices, &gigabytes);
  *attributes = Attributes{14 * slices, 1, 0, 0, 0, 0, slices, slices, 1024ull * gigabytes};
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetMinorNumber(void* handle, unsigned* minor) {
  Device* device = device_of(handle);
  if (!device) return kUninitialized;
  if (device->parent >= 0 || minor == nullptr) return kInvalidArgument;
  *minor = static_cast<unsigned>(device->index);  // /dev/nvidiaN for GPU N, as on most hosts
  return kSuccess;
}

}  // extern "C"
