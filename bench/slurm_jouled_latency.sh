#!/usr/bin/env bash
# Submission to running through jouled onto Slurm, beside plain sbatch, in the same run.
#
#   bench/slurm_jouled_latency.sh [--rounds N] [--poll S]... [--jouled PATH] [--json FILE]
#                                 [--hold S] [--gap S] [--wait-quiet S] [--keep]
#
# Brings up the private single-host Slurm of scripts/slurm-up.sh (root; waits for the host's
# Slurm lock), then for each --poll value (jouled's [slurm] poll_seconds; default 0.3) starts a
# standalone jouled on 127.0.0.1 (a free port) with one Slurm node type "cpu" (partition joule,
# 2 slots) and alternates N times (default 20): a job submitted through jouled
# (POST /v1/jobs, devices slurm:cpu/*) and a plain `sbatch --parsable -p joule --wrap ...`.
# Each job's command is `date +%s.%N > START_FILE` (then `sleep S` with --hold S); each job ends
# before the next is submitted, after a random pause of 0..--gap s (2).
# Prints p50/p90/max of the submit call, submit -> command started, submit -> jouled says
# running, the ratio jouled/sbatch, and where jouled's time goes (its log and slurmctld's log);
# writes the results as JSON (--json; default /tmp/slurm_jouled_latency-<time>.json).
#
# Stops what it started on every exit (jouled by its pid, Slurm with scripts/slurm-down.sh) and
# removes its temp dir unless --keep. Needs python3 (stdlib) and curl.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/.." && pwd)

rounds=20
polls=()
jouled_bin=$top/build/daemon/jouled
json_out=/tmp/slurm_jouled_latency-$(date +%Y%m%d-%H%M%S).json
gap=2
hold=0
wait_quiet=0
keep=0
command_line="bench/slurm_jouled_latency.sh $*"
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --poll) polls+=("$2"); shift 2 ;;
    --jouled) jouled_bin=$2; shift 2 ;;
    --json) json_out=$2; shift 2 ;;
    --gap) gap=$2; shift 2 ;;
    --hold) hold=$2; shift 2 ;;
    --wait-quiet) wait_quiet=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
[ ${#polls[@]} -gt 0 ] || polls=(0.3)
[ -x "$jouled_bin" ] || { echo "no jouled at $jouled_bin (ninja -C build jouled)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "needs root (scripts/slurm-up.sh)" >&2; exit 77; }

say() { echo "slurm_jouled_latency: $*" >&2; }

run_dir=$(mktemp -d /tmp/joule-slurm-latency-XXXXXX)
chmod 0755 "$run_dir"  # munged (as munge) must reach RUN_DIR/slurm/munge
jouled_pid=
measure_pid=
stop_jouled() {
  [ -n "$jouled_pid" ] || return 0
  if kill -TERM "$jouled_pid" 2>/dev/null; then
    for ((i = 0; i < 100; i++)); do kill -0 "$jouled_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$jouled_pid" 2>/dev/null || true
  fi
  wait "$jouled_pid" 2>/dev/null || true
  jouled_pid=
}
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  if [ -n "$measure_pid" ]; then kill "$measure_pid" 2>/dev/null || true; fi
  stop_jouled
  "$top/scripts/slurm-down.sh" "$run_dir/slurm" >/dev/null 2>&1 || true
  if [ "$keep" = 1 ]; then say "kept $run_dir"; else rm -rf "$run_dir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits (up to S seconds) until the machine is under 25 % busy over 3 s: others' builds disturb.
wait_for_quiet() {
  local limit=$1 waited=0 busy
  while [ "$waited" -lt "$limit" ]; do
    busy=$(python3 - <<'EOF'
import time
def t():
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(f), f[3] + f[4]
a = t(); time.sleep(3); b = t()
print(int(100 * (1 - (b[1] - a[1]) / max(1, b[0] - a[0]))))
EOF
)
    [ "$busy" -lt 25 ] && return 0
    say "machine ${busy}% busy; waiting for quiet ($waited/$limit s)"
    waited=$((waited + 3))
  done
  say "still busy after $limit s; measuring anyway (see 'machine % busy')"
}

# A copy: a build that relinks build/daemon/jouled meanwhile changes nothing in this run.
cp "$jouled_bin" "$run_dir/jouled"
jouled_version=$("$run_dir/jouled" --version)

# Waits for quiet before taking the host's Slurm lock, then again before each later phase.
[ "$wait_quiet" -gt 0 ] && wait_for_quiet "$wait_quiet"
"$top/scripts/slurm-up.sh" "$run_dir/slurm"
export SLURM_CONF=$run_dir/slurm/slurm.conf
slurm_version=$(sbatch --version)
# One job first: the scheduler's first pass after slurmctld starts is not what is measured.
sbatch --wait --partition=joule --output=/dev/null --wrap=true >/dev/null

parts=()
log_args=()
for poll in "${polls[@]}"; do
  label=poll$poll
  dir=$run_dir/$label
  mkdir -p "$dir/state" "$dir/work"
  chmod 0777 "$dir/work"
  cat >"$dir/jouled.toml" <<EOF
[probing]
enabled = false

[[devices]]
name = "sim:laptop-cpu"
probes = 40

[slurm]
conf = "$SLURM_CONF"
workdir = "$dir/work"
poll_seconds = $poll

[[slurm.node_types]]
name = "cpu"
partition = "joule"
slots = 2
model = "sim:laptop-cpu"
probes = 40
EOF
  [ "$wait_quiet" -gt 0 ] && [ ${#parts[@]} -gt 0 ] && wait_for_quiet "$wait_quiet"
  # Port 0: jouled picks a free port and logs it ("listening on http://127.0.0.1:PORT").
  "$run_dir/jouled" --config "$dir/jouled.toml" --state-dir "$dir/state" --listen 127.0.0.1:0 \
    </dev/null >"$dir/jouled.log" 2>&1 &
  jouled_pid=$!
  port=
  for ((i = 0; i < 300; i++)); do
    port=$(grep -oE 'listening on http://127\.0\.0\.1:[0-9]+' "$dir/jouled.log" 2>/dev/null |
      grep -oE '[0-9]+$' || true)
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
    kill -0 "$jouled_pid" 2>/dev/null || { cat "$dir/jouled.log" >&2; say "jouled exited"; exit 1; }
    sleep 0.1
  done
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null || { tail "$dir/jouled.log" >&2; say "jouled not ready"; exit 1; }
  say "jouled (poll_seconds = $poll) ready on 127.0.0.1:$port; $rounds rounds each way"
  # In the background and waited for, so that a TERM to this script is handled at once.
  python3 "$here/slurm_jouled_latency.py" measure --port "$port" --workdir "$dir/work" --rounds "$rounds" \
    --label "$label" --poll-seconds "$poll" --gap "$gap" --hold "$hold" --out "$dir/rounds.json" &
  measure_pid=$!
  wait "$measure_pid"
  measure_pid=
  stop_jouled
  parts+=("$dir/rounds.json")
  log_args+=(--jouled-log "$label=$dir/jouled.log")
  if grep -E ' (warning|error|critical): ' "$dir/jouled.log" | grep -v 'joule-worker not found'; then
    say "jouled warned (above)"
  fi
done

rc=0
python3 "$here/slurm_jouled_latency.py" report --json "$json_out" "${log_args[@]}" \
  --slurmctld-log "$run_dir/slurm/slurmctld.log" --command "$command_line" \
  --slurm-version "$slurm_version" --jouled-version "$jouled_version" "${parts[@]}" || rc=$?
exit $rc
