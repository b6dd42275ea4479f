#!/usr/bin/env bash
# Runs the Slurm adapter's real-Slurm tests: brings up a private single-host Slurm
# (scripts/slurm-up.sh) in a temp dir, runs the gtest binary against it with SLURM_CONF set,
# and tears it down on any exit (scripts/slurm-down.sh). Exit 77 (skip) when Slurm cannot run
# here. KEEP_SLURM_DIR=1 keeps the run dir (logs, state) for a look afterwards.
#
# Usage: tests/slurm/run.sh path/to/joule_slurm_tests [gtest args...]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
scripts="$here/../../scripts"
[ $# -ge 1 ] || { echo "usage: $0 JOULE_SLURM_TESTS [gtest args]" >&2; exit 2; }
binary=$1
shift

run_dir=$(mktemp -d /tmp/joule-slurm-XXXXXX)
cleanup() {
  "$scripts/slurm-down.sh" "$run_dir" || true
  if [ "${KEEP_SLURM_DIR:-0}" = 1 ]; then
    echo "run.sh: kept $run_dir" >&2
  else
    rm -rf "$run_dir"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rc=0
# Another build tree's Slurm test holds the host's Slurm: wait for it, but skip before ctest's
# TIMEOUT (300 s) would kill this run.
export JOULE_SLURM_LOCK_WAIT=${JOULE_SLURM_LOCK_WAIT:-180}
"$scripts/slurm-up.sh" "$run_dir" || rc=$?
if [ $rc -eq 77 ]; then
  echo "run.sh: SKIP: Slurm cannot start here (see above)" >&2
  exit 77
elif [ $rc -ne 0 ]; then
  echo "run.sh: slurm-up.sh failed ($rc)" >&2
  exit $rc
fi

export SLURM_CONF="$run_dir/slurm.conf"
export JOULE_SLURM_RUN_DIR="$run_dir"
"$binary" "$@"
