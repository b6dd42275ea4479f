#!/usr/bin/env bash
# Builds joule-worker alone against the machine's PyTorch LibTorch (CUDA; Debian's libtorch-dev is
# CPU-only), for bench/gpu/worker_on_gpu.sh and bench/gpu/check.sh. Needs PyTorch, CMake, Ninja
# and g++; the Debian header packages the worker needs (Eigen, nlohmann-json, fmt, CLI11, LBFGSpp)
# are unpacked from .gpu-carry/devdeps/*.deb (bench/gpu/pack.sh) or .devdeps/*.deb where present.
#   bench/gpu/build_worker.sh BUILD_DIR [EXTRA_TARGET...]
# Prints `export LD_LIBRARY_PATH=...` for the built worker on its last line of stdout.
set -euo pipefail
build=$(realpath -m "$1")
shift
sysroot=$build/sysroot  # kept with the build: the printed library path points into it
mkdir -p "$sysroot"
for deb in .gpu-carry/devdeps/*.deb .devdeps/*.deb; do [ -e "$deb" ] && dpkg -x "$deb" "$sysroot"; done
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
torch_lib=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
mkdir -p "$build"
started=$SECONDS
cmake -S . -B "$build" -G Ninja -DJOULE_WORKER_ONLY=ON -DJOULE_BUILD_TESTS=OFF -DJOULE_BUILD_BENCH=OFF \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$sysroot/usr;$torch_prefix" \
  -DCMAKE_CXX_FLAGS="-DFMT_HEADER_ONLY -isystem $sysroot/usr/include -isystem $sysroot/usr/include/eigen3" \
  > "$build/cmake.log" 2>&1 || { tail -40 "$build/cmake.log" >&2; exit 1; }
ninja -C "$build" joule-worker "$@" > "$build/build.log" 2>&1 || { grep -E 'error' -A5 "$build/build.log" | head -60 >&2; exit 1; }
echo "build_worker.sh: joule-worker built in $((SECONDS - started)) s" >&2
echo "export LD_LIBRARY_PATH=$sysroot/usr/lib/x86_64-linux-gnu:$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
