#pragma once
// Keeps a job's processes off the NVIDIA GPUs it does not hold, in its cgroup, so that a job
// given GPU 1 cannot open GPU 0 whatever its CUDA_VISIBLE_DEVICES says. NVIDIA's GPU nodes are
// character devices of major 195 (/dev/nvidiaN is minor N, NVML's nvmlDeviceGetMinorNumber);
// nvidiactl (255) and nvidia-modeset (254) stay open, since CUDA needs them on every GPU.
//  - cgroup v1: "c 195:N rwm" lines written to the job's devices.deny.
//  - cgroup v2: a BPF_PROG_TYPE_CGROUP_DEVICE program denying those minors, attached to the job's
//    cgroup with BPF_F_ALLOW_MULTI (the unit's own device policy still applies above it). Needs
//    CAP_SYS_ADMIN (or CAP_BPF), as the GPU drop-in gives jouled.
// The cgroup's device rules are checked when a node is opened: a process that opened a GPU before
// it was moved into its cgroup keeps it (jouled moves a job in as it starts, long before CUDA
// initialises).

#include <filesystem>
#include <vector>

#include "joule/adapters/job_controls.hpp"
#include "joule/common/result.hpp"

namespace joule::adapters {

inline constexpr unsigned kNvidiaMajor = 195;

/// The devices.deny lines for `minors` (cgroup v1).
std::string gpu_deny_lines(const std::vector<unsigned>& minors);

/// v1: writes a deny line per minor to `devices_dir`/devices.deny; the first refusal names the file.
Status fence_gpus_v1(const std::filesystem::path& devices_dir, const std::vector<unsigned>& minors,
                     const ControlFiles& files);

/// v2: loads the program and attaches it to `cgroup_dir`; the kernel's verifier log or the
/// syscall's error in the message where it refuses.
Status fence_gpus_v2(const std::filesystem::path& cgroup_dir, const std::vector<unsigned>& minors);

}  // namespace joule::adapters
