#!/usr/bin/env bash
# jouled installed on a GPU node and run by a real systemd with the GPU drop-in, against the fake
# NVML (tests/fakes/fake_nvml.cpp) installed where the driver puts libnvidia-ml.so.1:
#
#   bash tests/packaging/systemd_gpu_dropin.sh BUILD_DIR SOURCE_DIR FAKE_NVML_LIBRARY
#
# systemd runs as PID 1 of new PID, mount, UTS, network and cgroup namespaces, on a throwaway
# overlay of / (writes land in a tmpfs), with a cgroup2 of its own (a child of the host's), a
# private /dev holding /dev/nvidiactl, /dev/nvidia0 and /dev/nvidia1 (major 195; /proc/devices is
# overlaid so that the names gpu.conf allows resolve to it, as under the driver), /proc/sys and
# /sys read-only, and units only from /etc/systemd/system and a directory of empty targets, so it
# starts nothing but jouled. The machine itself is not touched; the namespace's PID 1 is killed at
# the end. There:
# 1. `cmake --install BUILD_DIR --prefix /usr`, the fake as /usr/lib/<multiarch>/libnvidia-ml.so.1
#    (ldconfig), systemd-sysusers on the installed sysusers file, a config with cuda:0 and cuda:1,
#    and the installed gpu.conf copied into /etc/systemd/system/jouled.service.d/ as the docs say.
#    A test drop-in only adds the fake's script (JOULE_FAKE_NVML_SCRIPT) and a log file.
#    The fake's script makes nvmlInit_v2 fail without /dev/nvidiactl, and a power limit fail
#    without CAP_SYS_ADMIN (both as the driver does).
# 2. With gpu.conf: `systemctl start jouled` succeeds (Type=notify); jouled holds CAP_SYS_ADMIN;
#    GET /v1/devices shows both GPUs metered by nvml; a job with a GPU power limit runs at it
#    (the fake logs the limit set and the original put back); the job, under an account of its
#    own, holds no capability at all (CapPrm, CapEff, CapAmb 0); it sees /dev/nvidia0 and gets past
#    the device cgroup there (ENXIO: no driver behind it), and any other device (/dev/ttyS0) is
#    closed to it (EPERM: DevicePolicy=closed).
#    jouled has a cgroup for jobs (the delegated one), and the job is fenced off the GPU it does not
#    hold (EPERM: jouled's BPF device filter on its cgroup, bpf() and CAP_SYS_ADMIN from gpu.conf).
# 3. gpu.conf without its two CAP_SYS_ADMIN lines: NVML still meters, jouled lacks CAP_SYS_ADMIN,
#    and the job's limit is refused with "needs root or CAP_SYS_ADMIN".
# 4. Without gpu.conf (PrivateDevices=yes): the job's /dev has no nvidia nodes and the GPUs are not
#    metered by nvml. 5. A built-in job trains (its job file written before the directory is the
#    job account's).
# `systemd-analyze security jouled` is printed for each; `systemctl stop jouled` ends each.
#
# Exits 77 (skipped) with the reason where this cannot run: not root, a tool missing, no cgroup2
# to make a child of, no overlay of /, or systemd not booting in the namespaces.
set -euo pipefail

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }

[[ $# -eq 3 ]] || fail "usage: $0 BUILD_DIR SOURCE_DIR FAKE_NVML_LIBRARY"
build=$(realpath "$1")
source=$(realpath "$2")
fake=$(realpath "$3")
[[ -f $fake ]] || fail "no fake NVML library at $3"
[[ $(id -u) -eq 0 ]] || skip "needs root (namespaces, mounts, a cgroup of its own)"
for tool in unshare nsenter script pivot_root findmnt curl python3 cmake systemd-sysusers systemd-analyze ldconfig; do
  command -v "$tool" >/dev/null || skip "$tool not found"
done
[[ -x /lib/systemd/systemd ]] || skip "no /lib/systemd/systemd"
cgroup2=$(findmnt -rn -t cgroup2 -o TARGET | head -n 1)
[[ -n $cgroup2 ]] || skip "no cgroup2 hierarchy mounted"

started=$SECONDS
tmp=$(mktemp -d /var/tmp/joule-systemd.XXXXXX)
cgroup=$cgroup2/joule-systemd-test.$$
launcher=""
pid1=""
# Everything in the namespaces is in $cgroup: killed at once (PID 1 first, then cgroup.kill where the
# kernel has it), waited for, and the cgroups systemd made there removed, deepest first.
cleanup() {
  local status=$?
  set +e
  [[ -n $pid1 ]] && kill -KILL "$pid1" 2>/dev/null
  [[ -f $cgroup/cgroup.kill ]] && echo 1 >"$cgroup/cgroup.kill"
  [[ -n $launcher ]] && wait "$launcher" 2>/dev/null
  for _ in $(seq 50); do
    [[ ! -d $cgroup || -z $(find "$cgroup" -name cgroup.procs -exec cat {} + 2>/dev/null) ]] && break
    sleep 0.1
  done
  [[ -d $cgroup ]] && find "$cgroup" -depth -type d -exec rmdir {} \; 2>/dev/null
  [[ -d $cgroup ]] && echo "note: could not remove $cgroup" >&2
  rm -rf "$tmp"
  exit "$status"
}
trap cleanup EXIT
mkdir "$cgroup" 2>/dev/null || skip "cannot make a cgroup in $cgroup2"

# ---- The namespaces' PID 1: builds the root, then becomes systemd --------------------------------
cat >"$tmp/pid1.sh" <<'EOF'
set -euo pipefail
tmp=$1 build=$2 source=$3
console=$(tty)
mkdir -p "$tmp/ovl"
mount -t tmpfs -o mode=0755 tmpfs "$tmp/ovl"
mkdir -p "$tmp/ovl/upper" "$tmp/ovl/work" "$tmp/ovl/root"
root=$tmp/ovl/root
mount -t overlay overlay -o "lowerdir=/,upperdir=$tmp/ovl/upper,workdir=$tmp/ovl/work" "$root" 2>"$tmp/mount.log" || exit 77
# A fresh node: what another run left on this machine is hidden (empty tmpfs over it).
for dir in etc/jouled var/lib/jouled var/lib/jouled-jobs; do
  if [[ -d $root/$dir ]]; then mount -t tmpfs -o mode=0755 tmpfs "$root/$dir"; fi
done
mount -t proc proc "$root/proc"
mount --bind "$root/proc/sys" "$root/proc/sys"
mount -o remount,bind,ro "$root/proc/sys"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$root/sys/fs/cgroup"
mount -t tmpfs -o mode=0755,nosuid tmpfs "$root/dev"
for node in null zero full random urandom tty; do
  touch "$root/dev/$node"
  mount --bind "/dev/$node" "$root/dev/$node"
done
mkdir "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
touch "$root/dev/console"
mount --bind "$console" "$root/dev/console"
# What the NVIDIA driver makes (nvidiactl is minor 255, GPU N minor N), and a device nobody allows.
mknod -m 0666 "$root/dev/nvidiactl" c 195 255
mknod -m 0666 "$root/dev/nvidia0" c 195 0
mknod -m 0666 "$root/dev/nvidia1" c 195 1
mknod -m 0666 "$root/dev/ttyS0" c 4 64
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$root/run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/tmp"
# The source (read-only) and build trees, wherever they are: the overlay holds / alone (not what
# is mounted below it), and a clone in /tmp would be under the tmpfs above. The build stays
# writable: `cmake --install` writes the unit it fills in there first.
mkdir -p "$root$source"
mount --bind "$source" "$root$source"
mount -o remount,bind,ro "$root$source"
mkdir -p "$root$build"
mount --bind "$build" "$root$build"
# The driver's name for major 195, so that DeviceAllow=char-nvidia-frontend resolves as on a node.
mkdir -p "$root/run/joule-test/units"
sed '/^Character devices:/a 195 nvidia-frontend' /proc/devices >"$root/run/joule-test/devices"
mount --bind "$root/run/joule-test/devices" "$root/proc/devices"
# Only jouled: the host's /etc/systemd/system hidden, and empty targets for its default dependencies.
mount -t tmpfs -o mode=0755 tmpfs "$root/etc/systemd/system"
for target in joule-test sysinit basic shutdown network; do
  printf '[Unit]\nDescription=%s (test)\n' "$target" >"$root/run/joule-test/units/$target.target"
done
cd "$root"
mkdir -p oldroot
pivot_root . oldroot
umount -l /oldroot
rmdir /oldroot
exec env -i container=joule-test SYSTEMD_UNIT_PATH=/etc/systemd/system:/run/joule-test/units \
  /lib/systemd/systemd --system --unit=joule-test.target --log-level=info --show-status=no
EOF
(
  echo "$BASHPID" >"$cgroup/cgroup.procs"
  exec script -qfec "unshare --cgroup --pid --fork --mount --uts --net --propagation private bash $tmp/pid1.sh $tmp $build $source" \
    "$tmp/console.log" </dev/null >/dev/null 2>&1
) &
launcher=$!

# PID 1 (as the host numbers it): the process of the cgroup that is systemd and 1 in its namespace.
for _ in $(seq 100); do
  while read -r pid; do
    if [[ $(cat "/proc/$pid/comm" 2>/dev/null) == systemd && $(awk '/^NSpid:/ {print $NF}' "/proc/$pid/status" 2>/dev/null) == 1 &&
      -S /proc/$pid/root/run/systemd/private ]]; then
      pid1=$pid
    fi
  done < <(find "$cgroup" -name cgroup.procs -exec cat {} + 2>/dev/null)
  [[ -n $pid1 ]] && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.2
done
if [[ -z $pid1 ]]; then
  [[ -s $tmp/mount.log ]] && skip "cannot mount an overlay of /: $(cat "$tmp/mount.log")"
  tail -n 20 "$tmp/console.log" >&2 || true
  skip "systemd did not boot in the namespaces (its console above)"
fi
inside() { nsenter -t "$pid1" -m -u -n -p -C -r -w env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 "$@"; }
state=""
for _ in $(seq 50); do
  state=$(inside systemctl is-system-running 2>/dev/null) || true
  [[ $state == running || $state == degraded ]] && break
  sleep 0.2
done
[[ $state == running ]] || { inside systemctl --failed --no-pager >&2 || true; fail "systemd in the namespaces is $state, not running"; }
echo "ok: systemd $(inside systemctl --version | awk 'NR == 1 {print $2}') is PID 1 of its namespaces (host PID $pid1), running after $((SECONDS - started)) s"

# ---- Inside: install, start, check ---------------------------------------------------------------
cat >"$tmp/checks.sh" <<'EOF'
set -euo pipefail
fail() {
  echo "FAIL: $*" >&2
  systemctl status jouled --no-pager -l >&2 || true
  tail -n 30 /run/joule-test/jouled.log >&2 || true
  head -c 3000 /run/joule-test/devices.json >&2 || true
  exit 1
}
build=$1 fake=$2 source=$3
export SYSTEMD_PAGER=cat SYSTEMD_COLORS=0

# 1. Installed as on a node.
cmake --install "$build" --prefix /usr >/run/joule-test/install.log 2>&1 || { cat /run/joule-test/install.log >&2; fail "cmake --install failed"; }
multiarch=$(dirname "$(ldd /usr/bin/jouled | awk '/libc\.so/ {print $3}')")
# The unit is written for /usr, so the installed one is the repository's, byte for byte; so is gpu.conf.
cmp -s /usr/lib/systemd/system/jouled.service "$source/systemd/jouled.service" || fail "the installed unit differs from systemd/jouled.service"
cmp -s /usr/share/joule/drop-ins/gpu.conf "$source/systemd/drop-ins/gpu.conf" || fail "the installed gpu.conf differs from systemd/drop-ins/gpu.conf"
install -m 0644 "$fake" "$multiarch/libnvidia-ml.so.1"
ldconfig
systemd-sysusers /usr/lib/sysusers.d/jouled.conf
getent passwd jouled >/dev/null || fail "systemd-sysusers did not create jouled from the installed sysusers file"
# The config: the CPU, modelled, and with $1 = gpus both fake GPUs, their meter left to jouled.
write_config() {
  printf '[server]\nlisten = "127.0.0.1:8571"\n[probing]\nenabled = false\n' >/etc/jouled/jouled.toml
  printf '[[devices]]\nname = "cpu"\nmeter = "modelled"\ncpufreq = "off"\n' >>/etc/jouled/jouled.toml
  if [[ $1 == gpus ]]; then printf '[[devices]]\nname = "cuda:%s"\nmeter = "auto"\n' 0 1 >>/etc/jouled/jouled.toml; fi
}
write_config gpus
cat >/etc/jouled/fake-nvml.script <<'NVML'
devices 2
name NVIDIA Fake H100
limit_mw 250000
limit_constraints_mw 100000 300000
set_limit_needs_cap_sys_admin
device_node /dev/nvidiactl
log /var/lib/jouled/nvml.log
NVML
mkdir -p /etc/systemd/system/jouled.service.d
cat >/etc/systemd/system/jouled.service.d/zz-test.conf <<'UNIT'
# The test's own: the fake NVML's script, and a log in place of the journal (none runs here).
[Service]
Environment=JOULE_FAKE_NVML_SCRIPT=/etc/jouled/fake-nvml.script
StandardOutput=append:/run/joule-test/jouled.log
StandardError=inherit
UNIT
ln -s /usr/lib/systemd/system/jouled.service /run/joule-test/units/jouled.service
echo "ok: installed (cmake --install --prefix /usr), fake NVML as $multiarch/libnvidia-ml.so.1, jouled user $(id -u jouled)"

api() { curl -sS --max-time 10 "$@"; }
json() { python3 -c "import json, sys; d = json.load(sys.stdin); $1"; }
# Starts jouled under the drop-in $1 (or none), runs the job $2 (JSON) to its end; leaves its log
# in /run/joule-test/job.log and its JSON in job.json, /v1/devices in devices.json.
run_case() {
  local name=$1 dropin=$2 job=$3
  rm -f /etc/systemd/system/jouled.service.d/gpu.conf /var/lib/jouled/nvml.log
  [[ -n $dropin ]] && printf '%s\n' "$dropin" >/etc/systemd/system/jouled.service.d/gpu.conf
  systemctl daemon-reload
  local t0=$SECONDS
  systemctl start jouled || fail "$name: systemctl start jouled failed"
  [[ $(systemctl is-active jouled) == active ]] || fail "$name: jouled is not active"
  echo "ok: $name: systemctl start jouled: active after $((SECONDS - t0)) s (drop-ins: $(systemctl show -P DropInPaths jouled | xargs -n 1 basename | paste -sd ' '))"
  main=$(systemctl show -P MainPID jouled)
  jouled_caps=$(awk '/^CapEff:/ {print $2}' "/proc/$main/status")
  api http://127.0.0.1:8571/v1/devices >/run/joule-test/devices.json || fail "$name: GET /v1/devices failed"
  local id reply
  reply=$(api -X POST -H 'Content-Type: application/json' -d "$job" http://127.0.0.1:8571/v1/jobs)
  id=$(json 'print(d["id"])' <<<"$reply" 2>/dev/null) || fail "$name: POST /v1/jobs failed: $reply"
  local state=""
  for _ in $(seq 100); do
    api "http://127.0.0.1:8571/v1/jobs/$id" >/run/joule-test/job.json
    state=$(json 'print(d["state"])' </run/joule-test/job.json)
    [[ $state == succeeded || $state == failed || $state == cancelled ]] && break
    sleep 0.2
  done
  [[ $state == succeeded ]] || { cat /run/joule-test/job.json >&2; fail "$name: the job ended $state"; }
  api "http://127.0.0.1:8571/v1/jobs/$id/log" >/run/joule-test/job.log
  systemd-analyze security jouled --no-pager 2>/dev/null | tail -n 1 | sed "s/^/   $name: /"
  systemctl stop jouled
  [[ $(systemctl is-active jouled || true) == inactive ]] || fail "$name: jouled did not stop"
}
# The device's meter and the job's events, one per line.
meters() { json 'print(" ".join(x["name"] + "=" + x["meter"]["source"] for x in d["devices"]))' </run/joule-test/devices.json; }
events() { json 'print("\n".join(e.get("message", str(e)) if isinstance(e, dict) else str(e) for e in d.get("events", [])))' </run/joule-test/job.json; }
probe='grep -E "^Cap(Prm|Eff|Amb):" /proc/self/status; ls /dev | grep -E "^(nvidia|ttyS)" | sed "s/^/dev: /"; for node in nvidia0 nvidia1 nvidiactl ttyS0 null; do head -c 0 /dev/$node 2>&1 && echo "open $node: ok"; done; true'
job=$(python3 -c 'import json, sys; print(json.dumps({"name": "caps", "run": {"command": ["sh", "-c", sys.argv[1]]}, "knobs": {"gpu_power_limit_watts": 180}}))' "$probe")
plain=$(python3 -c 'import json, sys; print(json.dumps({"name": "devs", "run": {"command": ["sh", "-c", sys.argv[1]]}}))' "$probe")
gpu_conf=$(cat /usr/share/joule/drop-ins/gpu.conf)

# 2. With gpu.conf as shipped.
run_case "gpu.conf" "$gpu_conf" "$job"
(( (0x$jouled_caps >> 21) & 1 )) || fail "gpu.conf: jouled lacks CAP_SYS_ADMIN (CapEff $jouled_caps)"
[[ $(meters) == *"cuda:0=nvml"*"cuda:1=nvml"* ]] || fail "gpu.conf: the GPUs are not metered by nvml: $(meters)"
grep -q '^set_limit 180000' /var/lib/jouled/nvml.log || fail "gpu.conf: no limit set through NVML: $(cat /var/lib/jouled/nvml.log)"
grep -q '^set_limit 250000' /var/lib/jouled/nvml.log || fail "gpu.conf: the original limit was not put back: $(cat /var/lib/jouled/nvml.log)"
events | grep -q 'knobs set: gpu_power_limit_watts 180' || fail "gpu.conf: the job's limit was not set: $(events)"
for cap in CapPrm CapEff CapAmb; do
  grep -qx "$cap:[[:space:]]*0*" /run/joule-test/job.log || fail "gpu.conf: the job holds capabilities: $(cat /run/joule-test/job.log)"
done
device=$(json 'print(d["device"])' </run/joule-test/job.json)
held=${device#cuda:} other=$((1 - ${device#cuda:}))
grep -q "^dev: nvidia$held" /run/joule-test/job.log || fail "gpu.conf: the job does not see /dev/nvidia$held"
grep -q "nvidia$held.*No such device or address" /run/joule-test/job.log ||
  fail "gpu.conf: the job's /dev/nvidia$held is not open to the device cgroup: $(grep nvidia "/run/joule-test/job.log")"
# The fence: jouled's BPF device filter on the job's cgroup (the delegated cgroup the base unit
# leaves writable, bpf() and CAP_SYS_ADMIN from gpu.conf) keeps the job off the GPU it does not hold.
grep -q "nvidia$other.*Operation not permitted" /run/joule-test/job.log ||
  fail "gpu.conf: the job is not fenced off /dev/nvidia$other: $(grep "nvidia$other" /run/joule-test/job.log); $(
    events | grep -i 'fence\|device rules\|CUDA_VISIBLE_DEVICES alone'; grep -o 'job cgroups: unavailable[^;]*' /run/joule-test/jouled.log | tail -n 1)"
fence="/dev/nvidia$other EPERM (fenced)"
! grep -q 'job cgroups: unavailable' /run/joule-test/jouled.log ||
  fail "gpu.conf: jouled has no cgroup for jobs: $(grep -o 'job cgroups: unavailable[^;]*' /run/joule-test/jouled.log | tail -n 1)"
grep -q "ttyS0.*Operation not permitted" /run/joule-test/job.log || fail "gpu.conf: /dev/ttyS0 is not closed to the job"
grep -q "open null: ok" /run/joule-test/job.log || fail "gpu.conf: /dev/null is closed to the job"
echo "ok: gpu.conf: jouled CapEff $jouled_caps (CAP_SYS_ADMIN); meters $(meters); job on $device at 180 W (NVML: $(paste -sd ',' /var/lib/jouled/nvml.log))"
echo "ok: gpu.conf: the job: $(grep -E '^Cap' /run/joule-test/job.log | paste -sd ' '); /dev/nvidia$held ENXIO (allowed, no driver), /dev/ttyS0 EPERM (closed), $fence"

# 3. gpu.conf without its CAP_SYS_ADMIN lines.
run_case "gpu.conf without CAP_SYS_ADMIN" "$(grep -v '^CapabilityBoundingSet=\|^AmbientCapabilities=' <<<"$gpu_conf")" "$job"
(( ((0x$jouled_caps >> 21) & 1) == 0 )) || fail "without CAP_SYS_ADMIN: jouled still holds it (CapEff $jouled_caps)"
[[ $(meters) == *"cuda:0=nvml"*"cuda:1=nvml"* ]] || fail "without CAP_SYS_ADMIN: the GPUs are not metered by nvml: $(meters)"
! grep -q '^set_limit' /var/lib/jouled/nvml.log || fail "without CAP_SYS_ADMIN: a limit was set: $(cat /var/lib/jouled/nvml.log)"
events | grep -q 'needs root or CAP_SYS_ADMIN' || fail "without CAP_SYS_ADMIN: the job's events do not say why: $(events)"
echo "ok: without CAP_SYS_ADMIN: meters $(meters); the limit refused: $(events | grep -m 1 -o 'knobs refused.*')"

# 4. No drop-in: the base unit's PrivateDevices=yes. NVML finds no /dev/nvidiactl, the GPUs have no
# meter, and jouled stops at start (systemd restarts it, Restart=on-failure, until stopped).
rm -f /etc/systemd/system/jouled.service.d/gpu.conf
systemctl daemon-reload
! systemctl start jouled 2>/dev/null || fail "no drop-in: jouled started with GPUs it cannot meter"
systemctl stop jouled
why=$(grep -o 'no meter for cuda:0: nvml: [^;]*' /run/joule-test/jouled.log | tail -n 1)
[[ $why == *"Driver Not Loaded"* ]] || fail "no drop-in: jouled's log does not say NVML found no driver"
echo "ok: no drop-in: jouled with cuda:0 and cuda:1 stops at start: $why"
# The same unit without GPUs in the config: what a job's /dev holds.
write_config cpu
run_case "no drop-in, no GPU in the config" "" "$plain"
! grep -q '^dev: nvidia' /run/joule-test/job.log || fail "no drop-in: the job sees NVIDIA devices"
! grep -q 'job cgroups: unavailable' /run/joule-test/jouled.log ||
  fail "the base unit leaves jouled no cgroup for jobs: $(grep -o 'job cgroups: unavailable[^;]*' /run/joule-test/jouled.log | tail -n 1)"
echo "ok: no drop-in: the job's /dev has no nvidia nodes ($(grep -m 1 nvidia0 /run/joule-test/job.log))"
# A built-in job, trained by the installed joule-worker under its own account: jouled writes its
# job file into the work directory before handing that to the account (it cannot after).
builtin='{"name": "builtin", "model": {"input": {"shape": [8]}, "layers": [{"type": "linear", "out_features": 4}]},
  "training": {"batch_size": 8, "epochs": 1, "samples_per_epoch": 72},
  "run": {"builtin": {"dataset": {"format": "synthetic", "samples": 80, "classes": 4}}}}'
run_case "a built-in job" "" "$builtin"
echo "ok: a built-in job: trained by joule-worker under the unit ($(json 'print(d["state"], d.get("energy", {}).get("source", ""))' </run/joule-test/job.json))"
EOF
inside bash "$tmp/checks.sh" "$build" "$fake" "$source" || { tail -n 20 "$tmp/console.log" >&2; fail "the checks in the namespaces failed (systemd's console above)"; }
echo "ok: all checks passed in $((SECONDS - started)) s"
