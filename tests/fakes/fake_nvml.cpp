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
//   log /tmp/x/nvml.log            append "init", "shutdown" and "set_limit N" lines there
//                                  ("set_limit N gpu I" for GPU I > 0)
//
// Without the variable every call behaves as on an idle GPU with an energy counter.

#include <cstdlib>
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
constexpr int kMaxDevices = 8;

struct Device {
  int index = 0;
  std::string name;  // "": the script's `name`
  std::optional<unsigned> limit_mw;  // set by SetPowerManagementLimit; nullopt: the script's
  std::size_t energy_cursor = 0;
  std::size_t power_cursor = 0;
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
  std::string log;
  Device device[kMaxDevices];
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
      if (key == "log") words >> fresh.log;
    }
  }
  if (fresh.devices > kMaxDevices) fresh.devices = kMaxDevices;
  state() = fresh;
}

Device* device_of(void* handle) {
  auto* device = static_cast<Device*>(handle);
  if (!state().initialised || device == nullptr) return nullptr;
  return device;
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
    case 4:
      return "Insufficient Permissions";
    case 9:
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
  const std::string text = device->name.empty() ? state().name : device->name;
  const std::size_t n = text.size() < length - 1 ? text.size() : length - 1;
  text.copy(name, n);
  name[n] = '\0';
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetTotalEnergyConsumption(void* handle,
                                                                               unsigned long long* energy_mj) {
  Device* device = device_of(handle);
  if (!device) return kUninitialized;
  if (!state().energy_supported) return kNotSupported;
  *energy_mj = next(state().energy_mj, device->energy_cursor);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetPowerUsage(void* handle, unsigned* power_mw) {
  Device* device = device_of(handle);
  if (!device) return kUninitialized;
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
  if (limit_mw < state().min_limit_mw || limit_mw > state().max_limit_mw) return kInvalidArgument;
  Device* device = device_of(handle);
  device->limit_mw = limit_mw;
  log_line("set_limit " + std::to_string(limit_mw) +
           (device->index > 0 ? " gpu " + std::to_string(device->index) : std::string()));
  return kSuccess;
}

}  // extern "C"
