#!/usr/bin/env bash
# Cross-builds Joule for Debian 12 arm64 (Raspberry Pi 4/5, a Jetson with a Debian-based image) on
# an amd64 Debian 12 machine, packages it, and checks it under qemu user emulation. Not part of CI
# (a second whole build); the suite's `arm64_emulated` test runs the check where this has been run.
#
#   scripts/cross-arm64.sh           sysroot, build and .deb in build-arm64/ (needs root: packages,
#                                    the sysroot's chroot, binfmt_misc)
#   scripts/cross-arm64.sh --check   then the arm64 unit tests and a jouled smoke test under qemu
#
# 1. Tools from Debian: crossbuild-essential-arm64 (g++ for aarch64), qemu-user-static (runs
#    arm64 programs here), mmdebstrap and arch-test (the sysroot), lintian, dpkg-dev.
# 2. build-arm64/sysroot: Debian 12 arm64 with every -dev package the build needs, made by
#    mmdebstrap. Its maintainer scripts run under qemu, so what they set up is real: the
#    alternatives that point libblas.so.3 at OpenBLAS, and dpkg's database dpkg-shlibdeps reads.
# 3. qemu-aarch64 registered with binfmt_misc where it is not yet: the kernel then runs arm64
#    programs, and the processes they start (jouled's jobs, joule-worker), through qemu.
# 4. CMake with cmake/arm64-linux-gnu.cmake into build-arm64/build: jouled, joulectl, joule-sim,
#    joule-worker against Debian's arm64 LibTorch, and the unit tests (joule-worker's with them).
# 5. The package: dpkg-shlibdeps inside the sysroot names the libraries' packages, cpack builds
#    build-arm64/joule_<version>_arm64.deb and lintian checks it like the amd64 one.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=$root/build-arm64
sysroot=$out/sysroot
build=$out/build
check=0
[[ ${1:-} == --check ]] && check=1

say() { echo "== cross-arm64: $*"; }
[[ $(id -u) -eq 0 ]] || { echo "cross-arm64: run as root (packages, the sysroot's chroot, binfmt_misc)" >&2; exit 1; }
[[ $(dpkg --print-architecture) == amd64 ]] || { echo "cross-arm64: this builds on amd64" >&2; exit 1; }

# ---- 1. tools -------------------------------------------------------------------------------
tools=(crossbuild-essential-arm64 qemu-user-static mmdebstrap arch-test lintian dpkg-dev cmake ninja-build)
missing=()
for package in "${tools[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  say "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# ---- 3 (first: the sysroot's maintainer scripts need it). qemu through binfmt_misc ------------
binfmt=/proc/sys/fs/binfmt_misc
if [[ ! -e $binfmt/register ]]; then
  mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null ||
    { echo "cross-arm64: binfmt_misc cannot be mounted here; arm64 programs cannot run" >&2; exit 1; }
fi
if [[ ! -e $binfmt/qemu-aarch64 ]]; then
  say "registering qemu-aarch64 with binfmt_misc"
  cat /usr/lib/binfmt.d/qemu-aarch64.conf >"$binfmt/register"
fi
# Where qemu looks for an arm64 program's loader and libraries when nothing says (Debian builds it
# with --interp-prefix=/etc/qemu-binfmt/%M): jouled runs its jobs from a clean environment, so
# QEMU_LD_PREFIX would not reach their runner. A prefix already there is left as it is.
prefix_link=/etc/qemu-binfmt/aarch64
if [[ ! -e $prefix_link && ! -L $prefix_link ]]; then
  say "pointing $prefix_link at $sysroot"
  mkdir -p /etc/qemu-binfmt
  ln -s "$sysroot" "$prefix_link"
elif [[ $(readlink -f "$prefix_link") != "$(readlink -f "$sysroot")" ]]; then
  echo "cross-arm64: $prefix_link points elsewhere ($(readlink -f "$prefix_link")): the check's jobs use that" >&2
fi

# ---- 2. the sysroot ---------------------------------------------------------------------------
# The same libraries scripts/install-deps.sh installs, for arm64, plus what dpkg-shlibdeps needs.
libraries=libc6-dev,libstdc++-12-dev,libboost-dev,libeigen3-dev,liblbfgspp-dev,nlohmann-json3-dev,libfmt-dev
libraries+=,libspdlog-dev,libcli11-dev,libtomlplusplus-dev,prometheus-cpp-dev,libsystemd-dev,libsqlite3-dev
libraries+=,libssl-dev,libtorch-dev,libopenblas0-pthread,libblas-dev,libgtest-dev,libgmock-dev,libbenchmark-dev
libraries+=,dpkg-dev
if [[ ! -f $sysroot/.complete ]]; then
  say "making the arm64 sysroot $sysroot (Debian's packages; maintainer scripts under qemu: minutes)"
  rm -rf "$sysroot"
  mkdir -p "$out"
  mmdebstrap --mode=root --variant=apt --architectures=arm64 --include="$libraries" bookworm "$sysroot" \
    >"$out/sysroot.log" 2>&1 || { tail -n 20 "$out/sysroot.log" >&2; exit 1; }
  # The compiler and qemu read the sysroot through this machine's file system, where an absolute
  # link (libblas.so.3 -> /etc/alternatives/...) would point out of it: make each relative.
  find "$sysroot" -xdev -type l -lname '/*' -print0 | while IFS= read -r -d '' link; do
    ln -sfn "$(realpath -m -s --relative-to="$(dirname "$link")" "$sysroot$(readlink "$link")")" "$link"
  done
  touch "$sysroot/.complete"
fi

# ---- 4. the build -----------------------------------------------------------------------------
say "building into $build"
# No benchmarks (none runs in the emulated check); tests: the unit tests are the ones run here.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_TOOLCHAIN_FILE="$root/cmake/arm64-linux-gnu.cmake" -DJOULE_ARM64_SYSROOT="$sysroot" \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG" -DJOULE_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target jouled joulectl joule-sim joule-worker joule_unit_tests joule_worker_tests

# ---- 5. the package ---------------------------------------------------------------------------
# dpkg-shlibdeps reads the libraries' shlibs and symbols files from dpkg's database: the
# sysroot's, so it runs there (under qemu) on copies of the programs.
say "library dependencies (dpkg-shlibdeps in the sysroot)"
scratch=$sysroot/tmp/joule-shlibs
rm -rf "$scratch" && mkdir -p "$scratch/debian"
printf 'Source: joule\n\nPackage: joule\nArchitecture: arm64\n' >"$scratch/debian/control"
for program in daemon/jouled cli/joulectl simulator/joule-sim worker/joule-worker; do
  cp "$build/$program" "$scratch/"
done
depends=$(chroot "$sysroot" sh -c 'cd /tmp/joule-shlibs && dpkg-shlibdeps -O jouled joulectl joule-sim joule-worker' |
  sed -n 's/^shlibs:Depends=//p')
rm -rf "$scratch"
[[ -n $depends ]] || { echo "cross-arm64: dpkg-shlibdeps found no libraries" >&2; exit 1; }
echo "   Depends: $depends"
cmake -S . -B "$build" -DJOULE_PACKAGE_LIBRARY_DEPENDS="$depends" >/dev/null
rm -f "$out"/*.deb
cpack -G DEB --config "$build/CPackConfig.cmake" -B "$out/package" >"$out/cpack.log" 2>&1 ||
  { tail -n 30 "$out/cpack.log" >&2; exit 1; }
mv "$out"/package/*.deb "$out/"
deb=$(ls "$out"/*.deb)
say "built $deb ($(du -k "$deb" | cut -f1) KiB)"
dpkg-deb -f "$deb" Architecture | grep -qx arm64 || { echo "cross-arm64: $deb is not arm64" >&2; exit 1; }
# As tests/packaging/deb_test.sh checks the amd64 one: the package's own overrides explain the rest.
lintian --display-info --fail-on error,warning "$deb" 2>&1 | grep -v '^running with root privileges' || true
lintian --fail-on error,warning "$deb" >/dev/null 2>&1 ||
  { echo "cross-arm64: lintian found errors or warnings the overrides do not explain" >&2; exit 1; }
say "lintian: no errors, no unexplained warnings"

if [[ $check -eq 1 ]]; then
  bash tests/arm64/emulated_check.sh "$build" "$sysroot"
fi
