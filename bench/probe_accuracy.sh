#!/usr/bin/env bash
# Accuracy of jouled's probe-learnt energy model on the real `cpu` device (issue 4).
#
#   bench/probe_accuracy.sh [--quick] [--seconds N] [--out FILE] [--additivity B] [--keep]
#
# 1. starts a fresh jouled (temp state dir, 127.0.0.1:0, [probing] enabled = false, threads = 1)
#    and waits for /readyz;
# 2. asks for ONE probe run on `cpu` of --seconds (600; --quick: 120) naming the held-out
#    networks (examples/models/*.json) at batch 16, 32 and 64 as `models`: the planner learns
#    their layer configurations (and variations of them) from 1-4-layer probe networks; no
#    whole held-out network is ever trained during probing;
# 3. when the run is over and the model refitted, takes POST /v1/estimate of every network x
#    batch (GP estimate ± std and the FLOPs baseline, per step), stops jouled, then measures
#    every network x batch whole with `joule-worker measure` (fresh process per reading
#    block, interleaved across networks, readings of >= 0.2 s);
# 4. prints the table and summary (MAPE of GP and FLOPs, worst error, ratio, 2-sigma share,
#    probing seconds, load) and diagnostics, and writes everything to --out as JSON.
# Joules come from whatever meter the worker picks; on a machine without RAPL that is the
# `modelled` meter (process CPU time x 12 W + wall x 10 W), i.e. a model of energy.
# Every process it starts is stopped on exit (Ctrl-C included). Needs python3 (stdlib only).
set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/.." && pwd)

seconds=""
quick=0
out=""
rounds=""
repetitions=""
min_reading=0.2
models_dir=$top/examples/models
batches="16,32,64"
keep=0
jouled=${JOULED:-$top/build/daemon/jouled}
worker=${JOULE_WORKER:-$top/build/worker/joule-worker}
limit=""
additivity_batch=""

usage() {
  sed -n '2,4p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  cat <<EOF
Options:
  --seconds N       length of the probe run (default 600; --quick: 120)
  --quick           a trial: 120 s of probing, 2 measurement rounds of 3 readings
  --out FILE        JSON of everything (default: \$TMPDIR/probe_accuracy-DATE.json)
  --rounds R        fresh measure processes per network x batch, interleaved (default 3; quick 2)
  --repetitions N   readings per measure process (default 5; quick 3)
  --min-reading S   seconds a measured reading must last at least (default $min_reading)
  --models DIR      held-out model specs (default examples/models)
  --batches LIST    batch sizes, comma-separated (default $batches)
  --jouled PATH     the daemon (default build/daemon/jouled; env JOULED)
  --worker PATH     joule-worker (default build/worker/joule-worker; env JOULE_WORKER)
  --limit S         stop everything after S seconds (default: probe seconds + 1800)
  --additivity B    afterwards, probe every layer of each network exactly as it sits at batch B
                    (no planner, no GP; one joule-worker probe process per layer, daemon settings),
                    sum them and compare with the whole network: the method's floor (~4 min at 32)
  --keep            keep the temp dir (jouled state with every probe sample, logs)
EOF
}

while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift ;;
    --quick) quick=1 ;;
    --out) out=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --repetitions) repetitions=$2; shift ;;
    --min-reading) min_reading=$2; shift ;;
    --models) models_dir=$2; shift ;;
    --batches) batches=$2; shift ;;
    --jouled) jouled=$2; shift ;;
    --worker) worker=$2; shift ;;
    --limit) limit=$2; shift ;;
    --keep) keep=1 ;;
    --additivity) additivity_batch=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

if ((quick)); then
  seconds=${seconds:-120}
  rounds=${rounds:-2}
  repetitions=${repetitions:-3}
fi
seconds=${seconds:-600}
rounds=${rounds:-3}
repetitions=${repetitions:-5}
limit=${limit:-$(awk -v s="$seconds" 'BEGIN{printf "%d", s + 1800}')}
[[ -n $out ]] || out=${TMPDIR:-/tmp}/probe_accuracy-$(date +%Y%m%d-%H%M%S).json

for tool in python3 curl awk; do
  command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 2; }
done
for exe in "$jouled" "$worker"; do
  [[ -x $exe ]] || { echo "$exe is missing: cmake --build build --target jouled joule-worker -j1" >&2; exit 2; }
done
ls "$models_dir"/*.json >/dev/null 2>&1 || { echo "no model specs in $models_dir" >&2; exit 2; }

start_time=$EPOCHREALTIME
elapsed() { awk -v a="$start_time" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}'; }
say() { printf '[%6.1fs] %s\n' "$(elapsed)" "$*" >&2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/probe_accuracy.XXXXXX")
jouled_pid=""
py_pid=""
watchdog_pid=""

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [[ -n $watchdog_pid ]] && kill "$watchdog_pid" 2>/dev/null && wait "$watchdog_pid" 2>/dev/null
  if [[ -n $py_pid ]] && kill -0 "$py_pid" 2>/dev/null; then
    kill -TERM "$py_pid" 2>/dev/null; wait "$py_pid" 2>/dev/null
  fi
  if [[ -n $jouled_pid ]] && kill -0 "$jouled_pid" 2>/dev/null; then
    kill -TERM "$jouled_pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$jouled_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$jouled_pid" 2>/dev/null
    wait "$jouled_pid" 2>/dev/null
  fi
  if ((keep)); then
    say "kept $tmp (state: $tmp/state, jouled log: $tmp/jouled.log)"
  else
    rm -rf "$tmp"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM

# Private copies: others may rebuild build/ during the run, and the probes and the whole-model
# measurements must come from the same joule-worker (jouled's job runner is jouled itself).
mkdir -p "$tmp/bin"
source_jouled=$jouled
source_worker=$worker
cp "$jouled" "$tmp/bin/jouled" && cp "$worker" "$tmp/bin/joule-worker" || { say "cannot copy the binaries"; exit 1; }
say "binaries: jouled $(sha256sum "$tmp/bin/jouled" | cut -c1-12) ($(date -r "$jouled" +%FT%T)), joule-worker $(sha256sum "$tmp/bin/joule-worker" | cut -c1-12) ($(date -r "$worker" +%FT%T))"
jouled=$tmp/bin/jouled
worker=$tmp/bin/joule-worker

cat >"$tmp/jouled.toml" <<EOF
# probe_accuracy.sh: only the requested run probes
[probing]
enabled = false
threads = 1
worker = "$worker"
EOF

say "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$jouled" --config "$tmp/jouled.toml" --state-dir "$tmp/state" --listen 127.0.0.1:0 >"$tmp/jouled.log" 2>&1 &
jouled_pid=$!

port=""
for _ in $(seq 200); do
  port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$tmp/jouled.log" 2>/dev/null | head -1 | sed 's/.*://')
  [[ -n $port ]] && break
  kill -0 "$jouled_pid" 2>/dev/null || { cat "$tmp/jouled.log" >&2; say "jouled exited"; exit 1; }
  sleep 0.1
done
[[ -n $port ]] || { cat "$tmp/jouled.log" >&2; say "jouled did not say where it listens"; exit 1; }
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$port/readyz" >/dev/null || { say "jouled not ready"; exit 1; }
say "jouled $jouled_pid ready on 127.0.0.1:$port (state $tmp/state)"

# The watchdog: one plain process (stopped by its PID on exit); if it ends first, so does the run.
sleep "$limit" </dev/null >/dev/null 2>&1 &
watchdog_pid=$!

# Runs one python step under the --limit watchdog; sets rc to its exit status.
run_step() {
  python3 "$here/probe_accuracy.py" "$@" &
  py_pid=$!
  wait -n "$py_pid" "$watchdog_pid"
  rc=$?
  if kill -0 "$py_pid" 2>/dev/null; then
    say "--limit $limit s reached: stopping"
    exit 124
  fi
  py_pid=""
}

run_step run --jouled-bin "$jouled" --source-jouled "$source_jouled" \
  --source-worker "$source_worker" --url "http://127.0.0.1:$port" --jouled-pid "$jouled_pid" --state-dir "$tmp/state" \
  --jouled-log "$tmp/jouled.log" --worker "$worker" --models "$models_dir" --batches "$batches" \
  --seconds "$seconds" --rounds "$rounds" --repetitions "$repetitions" --min-reading "$min_reading" \
  --out "$out" $( ((quick)) && echo --quick )
say "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
((rc == 0)) && say "wrote $out"
if ((rc == 0)) && [[ -n $additivity_batch ]]; then
  run_step additivity "$out" --worker "$worker" --batch "$additivity_batch" --out "${out%.json}-additivity.json"
  ((rc == 0)) && say "wrote ${out%.json}-additivity.json"
fi
exit "$rc"
