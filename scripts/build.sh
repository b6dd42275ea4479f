#!/usr/bin/env bash
# Configures and builds Joule into build/ (Ninja, RelWithDebInfo).
#
#   scripts/build.sh                  everything: the programs, the test suite, the benchmarks
#   scripts/build.sh TARGET...        only these targets and what they need, e.g. the programs
#                                     scripts/setup.sh runs: jouled joulectl joule-worker
#   scripts/build.sh -DOPTION=VALUE   arguments starting with -D go to CMake
set -euo pipefail
cd "$(dirname "$0")/.."
cmake_args=()
targets=()
for arg in "$@"; do
  case $arg in
    -D*) cmake_args+=("$arg") ;;
    *) targets+=("$arg") ;;
  esac
done
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cmake_args[@]}" >/dev/null
if [ ${#targets[@]} -eq 0 ]; then
  cmake --build build -j "$(nproc)"
else
  cmake --build build -j "$(nproc)" --target "${targets[@]}"
fi
