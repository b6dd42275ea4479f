#include "joule/adapters/gpu_fence.hpp"

#include <fcntl.h>
#include <linux/bpf.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include <fmt/format.h>

namespace joule::adapters {

namespace {

// One eBPF instruction (struct bpf_insn; the uapi header has no builders).
bpf_insn instruction(std::uint8_t code, std::uint8_t dst, std::uint8_t src, std::int16_t off, std::int32_t imm) {
  bpf_insn insn{};
  insn.code = code;
  insn.dst_reg = dst & 0xf;
  insn.src_reg = src & 0xf;
  insn.off = off;
  insn.imm = imm;
  return insn;
}

// The program: allow everything but a character device of NVIDIA's major whose minor is listed.
//   r2 = ctx->access_type & 0xffff (the device type); if r2 != char: allow
//   r3 = ctx->major;                                   if r3 != 195:  allow
//   r4 = ctx->minor;                                   if r4 == m:    deny (each listed m)
//   allow: r0 = 1; exit        deny: r0 = 0; exit
std::vector<bpf_insn> fence_program(const std::vector<unsigned>& minors) {
  const int n = static_cast<int>(minors.size());
  const int allow = 6 + n, deny = 8 + n;
  const auto jump = [](int from, int to) { return static_cast<std::int16_t>(to - (from + 1)); };
  std::vector<bpf_insn> program;
  program.push_back(instruction(BPF_LDX | BPF_MEM | BPF_W, 2, 1, offsetof(bpf_cgroup_dev_ctx, access_type), 0));
  program.push_back(instruction(BPF_ALU | BPF_AND | BPF_K, 2, 0, 0, 0xffff));
  program.push_back(instruction(BPF_JMP | BPF_JNE | BPF_K, 2, 0, jump(2, allow), BPF_DEVCG_DEV_CHAR));
  program.push_back(instruction(BPF_LDX | BPF_MEM | BPF_W, 3, 1, offsetof(bpf_cgroup_dev_ctx, major), 0));
  program.push_back(
      instruction(BPF_JMP | BPF_JNE | BPF_K, 3, 0, jump(4, allow), static_cast<std::int32_t>(kNvidiaMajor)));
  program.push_back(instruction(BPF_LDX | BPF_MEM | BPF_W, 4, 1, offsetof(bpf_cgroup_dev_ctx, minor), 0));
  for (int i = 0; i < n; ++i)
    program.push_back(
        instruction(BPF_JMP | BPF_JEQ | BPF_K, 4, 0, jump(6 + i, deny), static_cast<std::int32_t>(minors[i])));
  program.push_back(instruction(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 1));
  program.push_back(instruction(BPF_JMP | BPF_EXIT, 0, 0, 0, 0));
  program.push_back(instruction(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 0));
  program.push_back(instruction(BPF_JMP | BPF_EXIT, 0, 0, 0, 0));
  return program;
}

long bpf(int command, bpf_attr& attr) { return ::syscall(__NR_bpf, command, &attr, sizeof attr); }

std::string errno_hint(int err) {
  if (err == EPERM || err == EACCES) return " (needs CAP_SYS_ADMIN or CAP_BPF, as the GPU drop-in gives jouled)";
  return "";
}

}  // namespace

std::string gpu_deny_lines(const std::vector<unsigned>& minors) {
  std::string lines;
  for (const unsigned minor : minors) lines += fmt::format("c {}:{} rwm\n", kNvidiaMajor, minor);
  return lines;
}

Status fence_gpus_v1(const std::filesystem::path& devices_dir, const std::vector<unsigned>& minors,
                     const ControlFiles& files) {
  // One rule a write: the devices controller parses a single line each time.
  for (const unsigned minor : minors) {
    const auto file = devices_dir / "devices.deny";
    if (const int err = files.write(file, fmt::format("c {}:{} rwm\n", kNvidiaMajor, minor)); err != 0)
      return make_error(err == EACCES || err == EPERM ? ErrorCode::permission_denied : ErrorCode::io,
                        fmt::format("cannot write {}: {}", file.string(), std::strerror(err)));
  }
  return {};
}

Status fence_gpus_v2(const std::filesystem::path& cgroup_dir, const std::vector<unsigned>& minors) {
  if (minors.empty()) return {};
  const std::vector<bpf_insn> program = fence_program(minors);
  static const char kLicense[] = "GPL";
  std::string log(4096, '\0');
  bpf_attr load{};
  load.prog_type = BPF_PROG_TYPE_CGROUP_DEVICE;
  load.insns = reinterpret_cast<std::uint64_t>(program.data());
  load.insn_cnt = static_cast<std::uint32_t>(program.size());
  load.license = reinterpret_cast<std::uint64_t>(kLicense);
  load.log_buf = reinterpret_cast<std::uint64_t>(log.data());
  load.log_size = static_cast<std::uint32_t>(log.size());
  load.log_level = 1;
  const long prog = bpf(BPF_PROG_LOAD, load);
  if (prog < 0) {
    const int err = errno;
    log.resize(std::strlen(log.c_str()));
    return make_error(err == EPERM || err == EACCES ? ErrorCode::permission_denied : ErrorCode::unavailable,
                      fmt::format("cannot load the GPU device filter (bpf BPF_PROG_LOAD): {}{}{}", std::strerror(err),
                                  errno_hint(err), log.empty() ? "" : "; verifier: " + log));
  }
  const int cgroup = ::open(cgroup_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (cgroup < 0) {
    const int err = errno;
    ::close(static_cast<int>(prog));
    return make_error(ErrorCode::io, fmt::format("cannot open {}: {}", cgroup_dir.string(), std::strerror(err)));
  }
  bpf_attr attach{};
  attach.target_fd = static_cast<std::uint32_t>(cgroup);
  attach.attach_bpf_fd = static_cast<std::uint32_t>(prog);
  attach.attach_type = BPF_CGROUP_DEVICE;
  attach.attach_flags = BPF_F_ALLOW_MULTI;
  const long attached = bpf(BPF_PROG_ATTACH, attach);
  const int err = errno;
  // The attachment holds the program for as long as the cgroup lives.
  ::close(cgroup);
  ::close(static_cast<int>(prog));
  if (attached < 0)
    return make_error(err == EPERM || err == EACCES ? ErrorCode::permission_denied : ErrorCode::unavailable,
                      fmt::format("cannot attach the GPU device filter to {} (bpf BPF_PROG_ATTACH): {}{}",
                                  cgroup_dir.string(), std::strerror(err), errno_hint(err)));
  return {};
}

}  // namespace joule::adapters
