#!/usr/bin/env bash
# The whole test suite: installs what the tests need, builds, runs every test with CTest.
# Unit tests take under a second; the integration tests start real jouled processes, a real
# Prometheus server and real jobs on loopback (about a minute on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
cd build
ctest --output-on-failure -j "$(nproc)" "$@"
