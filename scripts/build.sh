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
# JOULE_DEBUG_INFO=0 leaves out debug information (-g): about a quarter less compile time, for
# CI; the default puts CMake's own RelWithDebInfo flags back, so a later plain build has it again.
if [ "${JOULE_DEBUG_INFO:-1}" = 0 ]; then
  cmake_args=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG" "${cmake_args[@]}")
else
  cmake_args=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g -DNDEBUG" "${cmake_args[@]}")
fi
# JOULE_BUILD_BENCH=0 leaves bench/'s programs out (no test runs them; CI's suite does not need
# them: about 100 s of a 2-core build); the default builds them, so a later plain build has them again.
if [ "${JOULE_BUILD_BENCH:-1}" = 0 ]; then
  cmake_args=("-DJOULE_BUILD_BENCH=OFF" "${cmake_args[@]}")
else
  cmake_args=("-DJOULE_BUILD_BENCH=ON" "${cmake_args[@]}")
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cmake_args[@]}" >/dev/null
if [ ${#targets[@]} -eq 0 ]; then
  cmake --build build -j "$(nproc)"
else
  cmake --build build -j "$(nproc)" --target "${targets[@]}"
fi
