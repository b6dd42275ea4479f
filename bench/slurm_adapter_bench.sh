#!/usr/bin/env bash
# The Slurm adapter against plain sbatch on one single-host Slurm (scripts/slurm-up.sh), in
# one run: submit time, submit -> RUNNING, submit -> the job's command started.
#
#   bench/slurm_adapter_bench.sh [BUILD_DIR] [ROUNDS]     (defaults: build, 10; needs root)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/.." && pwd)
build=${1:-$top/build}
rounds=${2:-10}
binary="$build/bench/slurm_adapter_bench"
[ -x "$binary" ] || { echo "build it first: ninja -C $build slurm_adapter_bench" >&2; exit 1; }

run_dir=$(mktemp -d /tmp/joule-slurm-bench-XXXXXX)
trap '"$top/scripts/slurm-down.sh" "$run_dir"; rm -rf "$run_dir"' EXIT
"$top/scripts/slurm-up.sh" "$run_dir"
export SLURM_CONF="$run_dir/slurm.conf"
# One job first: the scheduler's first pass after slurmctld starts is not what is measured.
sbatch --wait --partition=joule --output=/dev/null --wrap=true >/dev/null
"$binary" "$rounds"
