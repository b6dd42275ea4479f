#!/usr/bin/env bash
# Joule's GP (build/bench/gp_bench) against scikit-learn (bench/gp_peer.py) on the same data;
# prints a side-by-side table with ratios. Builds nothing: run `ninja -C BUILD gp_bench` first.
#
#   bench/gp_compare.sh [--build DIR] [--restarts N] [--sizes 50,200,1000,2000] [--keep]
#
# Needs python3 with scikit-learn (Debian: apt-get install python3-sklearn); $PYTHON picks the
# interpreter, else the first of python3, /usr/bin/python3 that imports sklearn.
# One thread on both sides: OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 (OPENBLAS_CORETYPE, if
# set, is left as it is). Sizes are interleaved (ours, then sklearn, per n) so that a change in
# machine load hits both sides alike; the 1-minute load average is printed beside each size.
# With the default 3 restarts, sklearn alone takes about 7 minutes at n=2,000 on a 2-core VM.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build="$here/../build"
restarts=3
sizes=50,200,1000,2000
keep=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --restarts) restarts=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

bench_bin="$build/bench/gp_bench"
[[ -x "$bench_bin" ]] || { echo "no $bench_bin: build it with ninja -C $build gp_bench" >&2; exit 1; }
python=${PYTHON:-}
if [[ -z "$python" ]]; then
  for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import sklearn' 2>/dev/null; then python=$p; break; fi
  done
fi
[[ -n "$python" ]] || { echo "no python3 with scikit-learn (apt-get install python3-sklearn)" >&2; exit 1; }

export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
work=$(mktemp -d "${TMPDIR:-/tmp}/gp_compare.XXXXXX")
if [[ $keep -eq 0 ]]; then trap 'rm -rf "$work"' EXIT; else echo "keeping $work"; fi

echo "# $(date -u +%FT%TZ) $(uname -m), $(getconf _NPROCESSORS_ONLN) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "# OPENBLAS_NUM_THREADS=$OPENBLAS_NUM_THREADS OMP_NUM_THREADS=$OMP_NUM_THREADS OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; python: $python"
set -x
"$python" "$here/gp_peer.py" generate --out "$work" --sizes "$sizes"
{ set +x; } 2>/dev/null
for n in ${sizes//,/ }; do
  echo "# n=$n: load average before: $(cut -d' ' -f1 /proc/loadavg)"
  set -x
  "$bench_bin" --data="$work" --restarts="$restarts" --benchmark_filter="^[a-z0-9]+/$n/" \
    --benchmark_out="$work/ours_$n.json" --benchmark_out_format=json >"$work/ours_$n.txt"
  "$python" "$here/gp_peer.py" run --data "$work" --n "$n" --restarts "$restarts" --out "$work/sklearn_$n.json"
  { set +x; } 2>/dev/null
done
echo "# load average after: $(cut -d' ' -f1 /proc/loadavg)"
echo
"$python" "$here/gp_peer.py" table --data "$work" --restarts "$restarts"
