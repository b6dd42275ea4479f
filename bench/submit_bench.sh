#!/usr/bin/env bash
# Submission benchmark for jouled, with Slurm's sbatch as an optional peer on the same machine.
#
#   bench/submit_bench.sh [--with-slurm] [--fresh-state-per-run] [--duration S] [--idle S] [--keep]
#                         [--queued 10000,100000]
#
# Measures (see bench/README.md for what each figure means):
#   1. durable submissions/s (POST /v1/jobs, 201 only after the SQLite commit) with wrk at
#      1, 8 and 64 connections, with p50/p99 latency and the count of non-201 answers;
#      plus one-process-per-submission with joulectl (sequential and 8 in parallel), the
#      like-for-like peer of sbatch;
#   2. GET /v1/jobs/{id} latency at 8 connections;
#   3. jouled's idle CPU and resident memory, with an empty state and after the submissions;
#      with --queued, the queue is then filled behind the blocker to each of those lengths and
#      the 1- and 8-connection POST runs repeated there (with jouled's RSS);
#   4. with --with-slurm: sequential and 8-way parallel `sbatch --hold --wrap true` against a
#      loopback single-host Slurm (munged, slurmctld, slurmd started here under a temp dir,
#      stopped at the end by PID), and the ratios jouled/sbatch.
# Bounded in time (a watchdog stops the run after --limit seconds, default 540) and every
# process it starts is stopped on exit. Needs: wrk, curl, python3; root for --with-slurm.
set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/.." && pwd)

with_slurm=0
duration=10          # seconds per throughput run
idle_seconds=20      # seconds per idle CPU sample
limit=540            # the whole run, seconds
keep=0
fresh_state=0
quotas=0             # --quotas: every owner under a queued- and running-jobs quota (issue 35)
queued_levels=""     # --queued: queue lengths to measure submissions at, after the main runs
wait_quiet=0         # seconds to wait for other processes to leave the CPUs alone, per phase
jouled=${JOULED:-$top/build/daemon/jouled}
joulectl=${JOULECTL:-$top/build/cli/joulectl}
log_level=info
slurmctld_port=${SLURM_BENCH_CTLD_PORT:-6817}
slurmd_port=${SLURM_BENCH_SLURMD_PORT:-6818}

usage() {
  sed -n '2,4p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  cat <<EOF
Options:
  --with-slurm     also install (apt-get, if missing), start and measure a loopback Slurm
  --duration S     seconds per throughput run (default $duration)
  --idle S         seconds per idle-CPU sample (default $idle_seconds)
  --limit S        stop everything after S seconds in all (default $limit)
  --jouled PATH    the daemon (default build/daemon/jouled; env JOULED)
  --joulectl PATH  the CLI (default build/cli/joulectl; env JOULECTL); missing: CLI rows skipped
  --log-level L    jouled's log level (default info, as deployed)
  --fresh-state-per-run
                   start each wrk POST run on a new jouled with an empty state (by default one
                   jouled serves every run, so later runs meet a bigger state)
  --wait-quiet S   before the jouled and the Slurm phases, wait up to S s for the machine to be
                   quiet (other processes under 10% of it); on a shared machine
  --quotas         a policy where every owner has queued- and running-jobs quotas (too high to
                   refuse anything), so each submission and pass counts them: against a run
                   without, the cost of quotas
  --queued N,N...  then fill the queue behind the blocker to each length (e.g. 10000,100000)
                   and repeat the 1- and 8-connection POST runs there
  --keep           keep the temp dir (state, logs, Slurm config) for inspection
EOF
}

while (($#)); do
  case $1 in
    --with-slurm) with_slurm=1 ;;
    --duration) duration=$2; shift ;;
    --idle) idle_seconds=$2; shift ;;
    --limit) limit=$2; shift ;;
    --jouled) jouled=$2; shift ;;
    --joulectl) joulectl=$2; shift ;;
    --log-level) log_level=$2; shift ;;
    --keep) keep=1 ;;
    --fresh-state-per-run) fresh_state=1 ;;
    --queued) queued_levels=$2; shift ;;
    --quotas) quotas=1 ;;
    --wait-quiet) wait_quiet=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

say() { printf '[%6.1fs] %s\n' "$(elapsed)" "$*" >&2; }
start_time=$EPOCHREALTIME
elapsed() { awk -v a="$start_time" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}'; }

for tool in wrk curl python3 awk; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install $tool)" >&2; exit 2; }
done
[ -x "$jouled" ] || { echo "no jouled at $jouled: build it first (ninja -C build)" >&2; exit 2; }
[ -x "$joulectl" ] || joulectl=""

# ---------------------------------------------------------------------------------------------
# Everything this script starts is recorded here and stopped by cleanup().
tmp=$(mktemp -d /tmp/joule-bench.XXXXXX)
chmod 0755 "$tmp"   # munged runs as the munge user and must reach its directory below
jouled_pid=""
blocker_pgid=""
watchdog_pid=""
munged_pid="" slurmctld_pid="" slurmd_pid=""
policy_rc_created=0
background_pids=()

stop_pid() {  # stop_pid PID NAME [GRACE_SECONDS]: TERM, wait, then KILL; only that process
  local pid=$1 name=$2 grace=${3:-10} i
  [ -n "$pid" ] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < grace * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return 0; }
    sleep 0.1
  done
  say "$name (pid $pid) did not stop within ${grace}s of TERM; sending KILL"
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return 0
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local pid
  local live; live=" $(jobs -p | tr '\n' ' ') "
  t_cleanup=$EPOCHREALTIME
  # Only PIDs that are still this shell's running jobs: a finished one's PID may belong to
  # someone else by now.
  for pid in "${background_pids[@]}"; do [[ $live == *" $pid "* ]] && kill -TERM "$pid" 2>/dev/null; done
  # As stop_jouled, without asking jouled anything.
  if [ -n "$blocker_pgid" ]; then kill -KILL -- "-$blocker_pgid" 2>/dev/null; sleep 0.5; fi
  stop_pid "$jouled_pid" jouled
  stop_pid "$slurmd_pid" slurmd
  stop_pid "$slurmctld_pid" slurmctld
  stop_pid "$munged_pid" munged
  if ((policy_rc_created)); then rm -f /usr/sbin/policy-rc.d; fi
  [ -n "$watchdog_pid" ] && kill -TERM "$watchdog_pid" 2>/dev/null
  if ((keep)); then echo "kept: $tmp" >&2; else rm -rf "$tmp"; fi
  say "cleaned up in $(awk -v a="$t_cleanup" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b - a}') s"
  exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "stopped (time limit or TERM)"; exit 143' TERM

# Run copies of the binaries: a rebuild during the run (ninja replaces the files) must not
# change what is measured half-way.
mkdir -p "$tmp/bin"
jouled_source=$jouled
cp "$jouled" "$tmp/bin/jouled" && jouled=$tmp/bin/jouled
jouled_sha=$(sha256sum "$jouled" | cut -c1-12)
if [ -n "$joulectl" ]; then cp "$joulectl" "$tmp/bin/joulectl" && joulectl=$tmp/bin/joulectl; fi

# The watchdog: the whole run is bounded even if something hangs.
(
  trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
  sleep "$limit" & sleeper=$!
  wait "$sleeper" || exit 0
  echo "submit_bench: time limit of ${limit}s reached; stopping" >&2
  kill -TERM $$
) &
watchdog_pid=$!

# ---------------------------------------------------------------------------------------------
# Helpers

clk_tck=$(getconf CLK_TCK)
cpu_ticks() {  # utime+stime of one process, in clock ticks (fields 14 and 15 of /proc/PID/stat)
  sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'
}
status_kib() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }

# busy and total jiffies of the whole machine (all CPUs), from /proc/stat
machine_jiffies() { awk '$1 == "cpu" {t = 0; for (i = 2; i <= 9; i++) t += $i; print t - $5 - $6, t}' /proc/stat; }

# CPU ticks of everything this benchmark runs: this shell with its reaped children
# (cutime/cstime: wrk, the CLI loops, sbatch) plus the daemons it started that still run.
our_ticks() {
  local t p
  t=$(sed 's/^.*) //' "/proc/$$/stat" | awk '{print $12 + $13 + $14 + $15}')
  for p in $jouled_pid $munged_pid $slurmctld_pid $slurmd_pid; do
    [ -r "/proc/$p/stat" ] && t=$((t + $(cpu_ticks "$p")))
  done
  echo "$t"
}

# window_start / window_others: how much of the machine (% of all CPUs) processes other than
# this benchmark's used in between: other people's builds and tests make a run unreliable.
window_start() { win_m0=$(machine_jiffies); win_o0=$(our_ticks); }
window_others() {
  local m1 o1
  m1=$(machine_jiffies); o1=$(our_ticks)
  awk -v m0="$win_m0" -v m1="$m1" -v o0="$win_o0" -v o1="$o1" 'BEGIN{split(m0, x, " "); split(m1, y, " ")
    v = 100 * ((y[1] - x[1]) - (o1 - o0)) / (y[2] - x[2]); if (v < 0) v = 0; printf "%.0f", v}'
}

# idle_sample PID...: CPU % of one core over idle_seconds, and VmRSS/VmHWM at the end, summed
# over the PIDs; and how much of the machine other processes used meanwhile (% of all CPUs).
# Prints "cpu_pct rss_kib hwm_kib others_pct".
idle_sample() {
  local pids=("$@") t0 t1 w0 w1 p
  sleep 2  # let start-up or the last requests settle
  window_start
  t0=0; for p in "${pids[@]}"; do t0=$((t0 + $(cpu_ticks "$p"))); done
  w0=$EPOCHREALTIME
  sleep "$idle_seconds"
  t1=0; for p in "${pids[@]}"; do t1=$((t1 + $(cpu_ticks "$p"))); done
  w1=$EPOCHREALTIME
  local others; others=$(window_others)
  local rss=0 hwm=0
  for p in "${pids[@]}"; do
    rss=$((rss + $(status_kib "$p" VmRSS))); hwm=$((hwm + $(status_kib "$p" VmHWM)))
  done
  awk -v d=$((t1 - t0)) -v hz="$clk_tck" -v a="$w0" -v b="$w1" -v r="$rss" -v h="$hwm" -v o="$others" \
    'BEGIN{printf "%.2f %d %d %s\n", 100 * d / hz / (b - a), r, h, o}'
}

# percentiles FILE: "p50 p99 count" of the numbers in FILE (one a line), nearest-rank.
percentiles() {
  sort -n "$1" | awk '{v[NR] = $1} END {
    if (NR == 0) { print "- - 0"; exit }
    i50 = int(0.50 * NR + 0.999999); i99 = int(0.99 * NR + 0.999999)
    if (i50 < 1) i50 = 1; if (i99 < 1) i99 = 1
    printf "%.1f %.1f %d\n", v[i50], v[i99], NR }'
}

now_us() { local t=${EPOCHREALTIME/[.,]/}; echo "$t"; }

# cli_loop OUTFILE DEADLINE_US CMD...: runs CMD until the deadline (microseconds since the epoch);
# one line per call to OUTFILE: "rc latency_us". No forks besides CMD itself.
cli_loop() {
  local out=$1 deadline=$2 a b rc; shift 2
  while :; do
    a=${EPOCHREALTIME/[.,]/}
    ((a < deadline)) || break
    "$@" >/dev/null 2>>"$out.err"; rc=$?
    b=${EPOCHREALTIME/[.,]/}
    printf '%d %d\n' "$rc" $((b - a)) >>"$out"
  done
}

# cli_bench NAME PARALLEL CMD...: runs PARALLEL cli_loops for $duration s. Runs in the main shell
# (its loops are known to cleanup) and leaves "ok_per_s p50_ms p99_ms ok failed seconds" in
# $tmp/NAME.result.
cli_bench() {
  local name=$1 parallel=$2 i; shift 2
  local w0 w1 pids=()
  w0=$(now_us)
  rm -f "$tmp/$name".*
  for ((i = 0; i < parallel; i++)); do
    cli_loop "$tmp/$name.$i" $((w0 + duration * 1000000)) "$@" &
    pids+=($!); background_pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
  background_pids=()
  w1=$(now_us)
  cat "$tmp/$name".[0-9] >"$tmp/$name.all" 2>/dev/null
  awk '$1 == 0 {printf "%.3f\n", $2 / 1000}' "$tmp/$name.all" >"$tmp/$name.ok"
  local ok failed p50 p99
  ok=$(awk '$1 == 0' "$tmp/$name.all" | wc -l)
  failed=$(awk '$1 != 0' "$tmp/$name.all" | wc -l)
  read -r p50 p99 _ < <(percentiles "$tmp/$name.ok")
  awk -v ok="$ok" -v f="$failed" -v us=$((w1 - w0)) -v p50="$p50" -v p99="$p99" \
    'BEGIN{printf "%.1f %s %s %d %d %.1f\n", ok / (us / 1e6), p50, p99, ok, f, us / 1e6}' >"$tmp/$name.result"
  if ((failed)); then
    say "$name: $failed calls failed; first errors:"
    cat "$tmp/$name".[0-9].err 2>/dev/null | head -3 >&2
  fi
}

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $2"; }  # field KEY "RESULT k=v ..."

rows=()        # the final table: "label|rate|p50|p99|bad|others|note"
noisy_limit=10 # others' CPU use (% of the machine) above which a run is flagged
add_row() {
  rows+=("$1")
  local label others
  label=${1%%|*}; others=$(cut -d'|' -f6 <<<"$1")
  flag_noisy "$label" "$others"
}
# wait_quiet_now PHASE: waits (up to --wait-quiet s) until other processes use at most
# noisy_limit % of the machine over 3 s.
wait_quiet_now() {
  ((wait_quiet > 0)) || return 0
  local deadline=$((SECONDS + wait_quiet)) others
  while :; do
    window_start; sleep 3; others=$(window_others)
    if ((others <= noisy_limit)); then say "machine quiet enough (others ${others}%)"; return 0; fi
    if ((SECONDS >= deadline)); then
      say "machine still busy after ${wait_quiet}s (others ${others}%); going on"
      notes+=("$1: started while other processes used ${others}% of the machine (waited ${wait_quiet}s)")
      return 0
    fi
    say "other processes use ${others}% of the machine; waiting"
  done
}
flag_noisy() {  # flag_noisy LABEL OTHERS_PERCENT
  if [[ $2 =~ ^[0-9]+$ ]] && (($2 > noisy_limit)); then
    notes+=("$1: other processes used $2% of the machine meanwhile: treat the figure as disturbed")
  fi
}
commands=()    # the command lines used
notes=()       # surprises found during the run

# ---------------------------------------------------------------------------------------------
# jouled

cat >"$tmp/jouled.toml" <<EOF
[server]
max_queued_jobs = 10000000
listen = "127.0.0.1:0"
EOF
if ((quotas)); then
  mkdir -p "$tmp/policies"
  cat >"$tmp/policies/60-tenancy.toml" <<EOF
[tenancy]
max_queued_jobs_per_owner = 10000000
max_running_jobs_per_owner = 1000
EOF
  printf '[policy]\ndirectory = "%s"\n' "$tmp/policies" >>"$tmp/jouled.toml"
fi
daemon_count=0
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
say "machine: $(nproc) CPUs, $(uname -r), load average $load_start; jouled $("$jouled" --version 2>&1 | head -1)"

# start_jouled: a new jouled with an empty state dir; sets jouled_pid, url, port_file.
start_jouled() {
  daemon_count=$((daemon_count + 1))
  port_file=$tmp/jouled$daemon_count.stderr
  jouled_cmd=("$jouled" --config "$tmp/jouled.toml" --state-dir "$tmp/state$daemon_count" --listen 127.0.0.1:0 --log-level "$log_level")
  say "starting: ${jouled_cmd[*]}"
  "${jouled_cmd[@]}" 2>"$port_file" >/dev/null &
  jouled_pid=$!
  local port="" i
  for ((i = 0; i < 100; i++)); do
    port=$(sed -n 's#.*listening on http://127\.0\.0\.1:\([0-9]*\).*#\1#p' "$port_file" | head -1)
    [ -n "$port" ] && break
    kill -0 "$jouled_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    echo "jouled did not start; its log:" >&2; cat "$port_file" >&2; exit 1
  fi
  url=http://127.0.0.1:$port
  curl -fsS "$url/healthz" >/dev/null || { echo "jouled: /healthz failed" >&2; exit 1; }
  say "jouled pid $jouled_pid on $url"
}

# start_blocker: a job that keeps the single "cpu" device busy, so every benchmark job stays
# queued; sets blocker (its id) and blocker_pgid (its process group, to kill it by id).
start_blocker() {
  local i
  blocker=$(curl -fsS -X POST -H 'Content-Type: application/json' \
    -d '{"name":"blocker","run":{"command":["sleep","3600"]},"priority":0}' "$url/v1/jobs" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])') || { echo "blocker submit failed" >&2; exit 1; }
  for ((i = 0; i < 50; i++)); do
    blocker_pgid=$(curl -fsS "$url/v1/jobs/$blocker" | python3 -c '
import json, re, sys
job = json.load(sys.stdin)
for e in job["events"]:
    m = re.search(r"started as process group (\d+)", e["message"])
    if m: print(m.group(1))')
    [ -n "$blocker_pgid" ] && break
    sleep 0.1
  done
  [ -n "$blocker_pgid" ] || { echo "the blocker job did not start" >&2; exit 1; }
  say "blocker $blocker runs as process group $blocker_pgid"
}

# stop_jouled: KILL the blocker's group (its runner ignores TERM; jobs outlive jouled by design),
# let jouled reap it and record the end, then TERM jouled. Checks its log first.
stop_jouled() {
  local i state problems
  if [ -n "$blocker_pgid" ]; then
    kill -KILL -- "-$blocker_pgid" 2>/dev/null; blocker_pgid=""
    for ((i = 0; i < 50; i++)); do
      state=$(curl -fsS "$url/v1/jobs/$blocker" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
      [ "$state" = running ] || break
      sleep 0.1
    done
  fi
  problems=$(grep -cE ' (warn|error|critical): ' "$port_file")
  if ((problems)); then
    notes+=("jouled #$daemon_count logged $problems warn/error lines, e.g.: $(grep -E ' (warn|error|critical): ' "$port_file" | head -2 | tr '\n' ' ')")
  fi
  kill -0 "$jouled_pid" 2>/dev/null || notes+=("jouled #$daemon_count exited during the run: $(tail -2 "$port_file" | tr '\n' ' ')")
  stop_pid "$jouled_pid" jouled; jouled_pid=""
}

jobs_total() { curl -fsS "$url/v1/jobs?limit=1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"])'; }

wait_quiet_now "jouled phase"
start_jouled
commands+=("jouled: ${jouled_cmd[*]}  (config: [server] max_queued_jobs = 10000000$( ((quotas)) && echo "; policies.d [tenancy] max_queued_jobs_per_owner = 10000000, max_running_jobs_per_owner = 1000"); copy of $jouled_source, sha256 $jouled_sha...)")
say "idle sample with an empty state (${idle_seconds}s)"
read -r idle0_cpu idle0_rss _ idle0_busy < <(idle_sample "$jouled_pid")
flag_noisy "jouled idle sample, empty state" "$idle0_busy"
start_blocker

job_body='{"name":"b","run":{"command":["true"]},"priority":0}'
printf '%s\n' "$job_body" >"$tmp/job.json"

# One process and one connection per submission: the like-for-like peer of sbatch.
if [ -n "$joulectl" ]; then
  for par in 1 8; do
    before=$(jobs_total)
    say "joulectl submit, $par in parallel, ${duration}s (jobs stored before: $before)"
    window_start
    cli_bench "joulectl$par" "$par" "$joulectl" --server "$url" submit "$tmp/job.json"
    others=$(window_others)
    read -r rate p50 p99 ok failed secs <"$tmp/joulectl$par.result"
    after=$(jobs_total)
    add_row "jouled via joulectl, $par submitter(s)|$rate|$p50|$p99|$failed|$others|$ok ok in ${secs}s; jobs stored $before -> $after"
    eval "cli_rate_$par=$rate"
    if ((after - before != ok)); then
      notes+=("joulectl x$par: $ok successful submits but the job count grew by $((after - before))")
    fi
  done
  commands+=("joulectl: $joulectl --server $url submit job.json   (job.json: $job_body), in a loop for ${duration}s, 1 and 8 loops")
else
  notes+=("no joulectl binary: the one-process-per-submission jouled rows were skipped")
fi

# submitted_sampler OUTFILE: once a second, "time_us joule_jobs_submitted_total" from /metrics,
# to show how the submission rate changes within a run. Stops with TERM (and its sleep with it).
submitted_sampler() {
  local s v
  trap 'kill "$s" 2>/dev/null; exit 0' TERM
  while :; do
    v=$(curl -fsS --max-time 2 "$url/metrics" | awk '$1 == "joule_jobs_submitted_total" {print $2}')
    echo "${EPOCHREALTIME/[.,]/} ${v:-}" >>"$1"
    sleep 1 & s=$!
    wait "$s"
  done
}
timelines=()   # "label: rate rate rate ..." per POST run

# wrk: keep-alive connections, no process per request.
wrk_run() {  # wrk_run LABEL CONNECTIONS SECONDS MODE [JOB_ID]
  local label=$1 conns=$2 secs=$3 mode=$4 id=${5:-} threads out before after result
  threads=$((conns < 2 ? conns : 2))
  before=$(jobs_total)
  say "wrk $mode, $conns connection(s), ${secs}s (jobs stored before: $before)"
  local sampler="" samples=$tmp/samples.$RANDOM
  if [ "$mode" = post ]; then
    submitted_sampler "$samples" &
    sampler=$!; background_pids+=("$sampler")
  fi
  window_start
  out=$(BENCH_MODE=$mode BENCH_JOB_ID=$id BENCH_PATH=${bench_path:-} BENCH_BODY=$job_body \
    wrk -t"$threads" -c"$conns" -d"${secs}s" --timeout 10s -s "$here/submit.lua" "$url" 2>&1)
  local others; others=$(window_others)
  if [ -n "$sampler" ]; then
    kill -TERM "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    background_pids=()
    timelines+=("$label: $(awk 'NF == 2 {if (n++) printf "%.0f ", ($2 - v) / (($1 - t) / 1e6); t = $1; v = $2}' "$samples")")
  fi
  after=$(jobs_total)
  result=$(grep '^RESULT' <<<"$out")
  if [ -z "$result" ]; then
    notes+=("wrk $label produced no RESULT line: $(tail -3 <<<"$out" | tr '\n' ' ')")
    add_row "$label|-|-|-|-|$others|wrk failed"
    return
  fi
  local rps p50 p99 bad reqs statuses errs
  rps=$(field rps "$result"); reqs=$(field requests "$result"); bad=$(field unexpected "$result")
  statuses=$(field statuses "$result")
  p50=$(awk -v u="$(field p50_us "$result")" 'BEGIN{printf "%.2f", u / 1000}')
  p99=$(awk -v u="$(field p99_us "$result")" 'BEGIN{printf "%.2f", u / 1000}')
  errs=$(( $(field connect_errors "$result") + $(field read_errors "$result") + $(field write_errors "$result") + $(field timeouts "$result") ))
  local note="$reqs answers ($statuses); socket errors/timeouts $errs"
  if [ "$mode" = post ]; then
    note+="; jobs stored $before -> $after"
    local stored=$((after - before)) created
    created=$(sed -n 's/.*201:\([0-9]*\).*/\1/p' <<<"$statuses"); created=${created:-0}
    # Requests still in flight when wrk stops may be committed without being counted.
    if ((stored < created || stored > created + conns)); then
      notes+=("$label: wrk counted $created x 201 but the job count grew by $stored")
    fi
  fi
  ((bad > 0 || errs > 0)) && notes+=("$label: $bad unexpected statuses, $errs socket errors/timeouts; $(grep '^UNEXPECTED_SAMPLE' <<<"$out" | head -1)")
  add_row "$label|$rps|$p50|$p99|$((bad + errs))|$others|$note"
  last_rps=$rps
}

for conns in 1 8 64; do
  if ((fresh_state)); then stop_jouled; start_jouled; start_blocker; fi
  wrk_run "jouled POST, wrk $conns conn" "$conns" "$duration" post
  eval "wrk_rps_$conns=$last_rps"
done
commands+=("wrk (POST): BENCH_MODE=post wrk -t{1,2,2} -c{1,8,64} -d${duration}s --timeout 10s -s bench/submit.lua $url   (body: $job_body)")

get_id=$(curl -fsS "$url/v1/jobs?state=queued&limit=1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["id"])')
wrk_run "jouled GET /v1/jobs/{id}, wrk 8 conn" 8 "$duration" get "$get_id"
commands+=("wrk (GET): BENCH_MODE=get BENCH_JOB_ID=<a queued job> wrk -t2 -c8 -d${duration}s --timeout 10s -s bench/submit.lua $url")
# The last job in the queue (its answer carries its position, which once cost a walk of the
# queue), and one page of the queue (100 jobs, each with its position).
last_id=$(curl -fsS "$url/v1/jobs?state=queued&limit=1&order=newest" | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["id"])')
wrk_run "jouled GET /v1/jobs/{id} of the last queued job, wrk 8 conn" 8 "$duration" get "$last_id"
bench_path="/v1/jobs?state=queued&limit=100"
wrk_run "jouled GET /v1/jobs?state=queued&limit=100, wrk 8 conn" 8 "$duration" get
bench_path=""
commands+=("wrk (GET, listing): BENCH_MODE=get BENCH_PATH='/v1/jobs?state=queued&limit=100' wrk -t2 -c8 -d${duration}s --timeout 10s -s bench/submit.lua $url")

# The same 1-connection run again, now that the state holds many more jobs.
repeat_secs=$(( duration < 5 ? duration : 5 ))
n_now=$(jobs_total)
wrk_run "jouled POST, wrk 1 conn, again at $n_now jobs" 1 "$repeat_secs" post
repeat_rps=$last_rps
repeat_jobs=$n_now

# fill_queue_to N: submits the benchmark's job over one keep-alive connection until N jobs are
# stored (the blocker is one of them), as fast as jouled commits them.
fill_queue_to() {
  python3 - "$url" "$1" "$job_body" <<'PY'
import http.client, json, sys, urllib.parse
url, target, body = urllib.parse.urlparse(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
conn.request("GET", "/v1/jobs?limit=1")
total = json.loads(conn.getresponse().read())["total"]
for _ in range(max(0, target - total)):
    conn.request("POST", "/v1/jobs", body, {"Content-Type": "application/json"})
    reply = conn.getresponse()
    reply.read()
    if reply.status != 201:
        sys.exit(f"filling the queue: POST /v1/jobs answered {reply.status}")
PY
}
for level in ${queued_levels//,/ }; do
  say "filling the queue to $level jobs"
  fill_queue_to "$level" || { notes+=("the queue could not be filled to $level jobs"); break; }
  for conns in 1 8; do
    wrk_run "jouled POST, wrk $conns conn, at $(( $(jobs_total) - 1 )) queued ($(( $(status_kib "$jouled_pid" VmRSS) / 1024 )) MiB RSS)" \
      "$conns" "$repeat_secs" post
  done
done
[ -n "$queued_levels" ] && commands+=("queue filled to ${queued_levels} jobs behind the blocker (one keep-alive connection), then the wrk POST runs at 1 and 8 connections for ${repeat_secs}s each")

say "idle sample after the submissions (${idle_seconds}s)"
read -r idle1_cpu idle1_rss idle1_hwm idle1_busy < <(idle_sample "$jouled_pid")
flag_noisy "jouled idle sample, after the submissions" "$idle1_busy"
final_jobs=$(jobs_total)
db_kib=$(du -sk "$tmp/state$daemon_count" | cut -f1)
# Stop the blocker, then jouled, before the peer, so the two never share the CPUs.
stop_jouled

# ---------------------------------------------------------------------------------------------
# Slurm peer

slurm_status="skipped: run with --with-slurm to measure sbatch on this machine (installs slurm-wlm and munge)"
slurm_idle=""
if ((with_slurm)); then
  slurm_status=""
  slurm_dir=$tmp/slurm
  slurm_fail() { slurm_status="not measured: $*"; say "$slurm_status"; }

  slurm_setup() {
    if [ "$(id -u)" != 0 ]; then slurm_fail "needs root"; return 1; fi
    if ! command -v sbatch >/dev/null || ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
       ! command -v munged >/dev/null; then
      say "installing slurm-wlm and munge (apt-get; services kept from starting by policy-rc.d)"
      if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d && policy_rc_created=1
      fi
      local apt_log=$tmp/apt.log
      if ! DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q slurm-wlm munge >"$apt_log" 2>&1; then
        DEBIAN_FRONTEND=noninteractive timeout 120 apt-get update -q >>"$apt_log" 2>&1
        DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q slurm-wlm munge >>"$apt_log" 2>&1 ||
          { slurm_fail "apt-get install slurm-wlm munge failed: $(tail -2 "$apt_log" | tr '\n' ' ')"; return 1; }
      fi
      if ((policy_rc_created)); then rm -f /usr/sbin/policy-rc.d; policy_rc_created=0; fi
    fi
    for port in "$slurmctld_port" "$slurmd_port"; do
      if ss -Htln "sport = :$port" | grep -q .; then
        slurm_fail "port $port is already in use (another Slurm?); set SLURM_BENCH_CTLD_PORT / SLURM_BENCH_SLURMD_PORT"
        return 1
      fi
    done

    mkdir -p "$slurm_dir"/{state,spool,work,munge}
    # munged refuses to run as root with root-owned dirs; it runs as munge with its own key,
    # socket, seed and log here (nothing of /etc/munge or /run/munge is used).
    chown munge:munge "$slurm_dir/munge"; chmod 0755 "$slurm_dir/munge"
    dd if=/dev/urandom of="$slurm_dir/munge/munge.key" bs=1024 count=1 status=none
    chown munge:munge "$slurm_dir/munge/munge.key"; chmod 0400 "$slurm_dir/munge/munge.key"
    local sock=$slurm_dir/munge/munge.socket
    munged_cmd=(setpriv --reuid=munge --regid=munge --init-groups -- munged --foreground
      --socket="$sock" --key-file="$slurm_dir/munge/munge.key" --pid-file="$slurm_dir/munge/munged.pid"
      --log-file="$slurm_dir/munge/munged.log" --seed-file="$slurm_dir/munge/munged.seed")
    "${munged_cmd[@]}" >"$slurm_dir/munged.out" 2>&1 &
    munged_pid=$!   # setpriv execs munged: this is munged's PID
    local i
    for ((i = 0; i < 50; i++)); do [ -S "$sock" ] && break; sleep 0.1; done
    if [ ! -S "$sock" ]; then slurm_fail "munged did not start: $(tail -3 "$slurm_dir/munged.out" "$slurm_dir/munge/munged.log" 2>/dev/null | tr '\n' ' ')"; return 1; fi

    local real_mem
    real_mem=$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -1)
    real_mem=$(( ${real_mem:-1280} - 256 ))
    export SLURM_CONF=$slurm_dir/slurm.conf
    cat >"$SLURM_CONF" <<EOF
ClusterName=bench
SlurmctldHost=localhost
SlurmctldPort=$slurmctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$slurm_dir/state
SlurmdSpoolDir=$slurm_dir/spool
SlurmctldPidFile=$slurm_dir/slurmctld.pid
SlurmdPidFile=$slurm_dir/slurmd.pid
SlurmctldLogFile=$slurm_dir/slurmctld.log
SlurmdLogFile=$slurm_dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$slurm_dir/jobcomp.txt
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
MaxJobCount=1000000
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$real_mem State=UNKNOWN
PartitionName=bench Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    slurmctld_cmd=(slurmctld -D -f "$SLURM_CONF")
    slurmd_cmd=(slurmd -D -N localhost -f "$SLURM_CONF")
    "${slurmctld_cmd[@]}" >"$slurm_dir/slurmctld.out" 2>&1 &
    slurmctld_pid=$!
    for ((i = 0; i < 150; i++)); do
      timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP' && break
      kill -0 "$slurmctld_pid" 2>/dev/null || break
      sleep 0.2
    done
    if ! timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP'; then
      slurm_fail "slurmctld did not come up: $(tail -3 "$slurm_dir/slurmctld.log" "$slurm_dir/slurmctld.out" 2>/dev/null | tr '\n' ' ')"
      return 1
    fi
    "${slurmd_cmd[@]}" >"$slurm_dir/slurmd.out" 2>&1 &
    slurmd_pid=$!
    local state=""
    for ((i = 0; i < 150; i++)); do
      state=$(timeout 5 sinfo -h -n localhost -o %T 2>/dev/null | head -1)
      [ "$state" = idle ] && break
      kill -0 "$slurmd_pid" 2>/dev/null || break
      sleep 0.2
    done
    if [ "$state" != idle ]; then
      slurm_fail "the node did not become idle (state '$state'): $(tail -3 "$slurm_dir/slurmd.log" "$slurm_dir/slurmd.out" 2>/dev/null | tr '\n' ' ')"
      return 1
    fi
    say "Slurm up: munged $munged_pid, slurmctld $slurmctld_pid, slurmd $slurmd_pid ($(sbatch --version))"
    return 0
  }

  if slurm_setup; then
    wait_quiet_now "Slurm phase"
    cd "$slurm_dir/work" || exit 1
    say "idle sample of slurmctld+slurmd after start-up (${idle_seconds}s)"
    read -r s0_cpu s0_rss _ s0_busy < <(idle_sample "$slurmctld_pid" "$slurmd_pid")
    flag_noisy "Slurm idle sample after start-up" "$s0_busy"
    sbatch_cmd=(timeout 15 sbatch --hold --wrap 'true')
    for par in 1 8; do
      say "sbatch --hold --wrap true, $par in parallel, ${duration}s"
      window_start
      cli_bench "sbatch$par" "$par" "${sbatch_cmd[@]}"
      others=$(window_others)
      read -r rate p50 p99 ok failed secs <"$tmp/sbatch$par.result"
      add_row "Slurm sbatch --hold, $par submitter(s)|$rate|$p50|$p99|$failed|$others|$ok ok in ${secs}s"
      eval "sbatch_rate_$par=$rate"
      ((failed)) && notes+=("sbatch x$par: $failed failed, e.g. $(cat "$tmp"/sbatch$par.[0-9].err | head -1)")
    done
    held=$(squeue -h -t PD -o %i 2>/dev/null | wc -l)
    say "Slurm holds $held pending jobs"
    say "idle sample of slurmctld+slurmd after the submissions (${idle_seconds}s)"
    read -r s1_cpu s1_rss s1_hwm s1_busy < <(idle_sample "$slurmctld_pid" "$slurmd_pid")
    flag_noisy "Slurm idle sample after the submissions" "$s1_busy"
    slurm_idle="slurmctld+slurmd idle: after start-up ${s0_cpu}% of one core, VmRSS ${s0_rss} KiB (others ${s0_busy}%); after the submissions ($held held jobs) ${s1_cpu}% of one core, VmRSS ${s1_rss} KiB, VmHWM ${s1_hwm} KiB (others ${s1_busy}%)"
    commands+=("munged: ${munged_cmd[*]}")
    commands+=("slurmctld: ${slurmctld_cmd[*]}   slurmd: ${slurmd_cmd[*]}   (slurm.conf with the settings of scripts/slurm-up.sh; ports $slurmctld_port/$slurmd_port)")
    commands+=("sbatch: SLURM_CONF=$SLURM_CONF sbatch --hold --wrap 'true', in a loop for ${duration}s, 1 and 8 loops (each call under timeout 15)")
    cd "$top" || true
    stop_pid "$slurmd_pid" slurmd; slurmd_pid=""
    stop_pid "$slurmctld_pid" slurmctld 30; slurmctld_pid=""
    stop_pid "$munged_pid" munged; munged_pid=""
    slurm_status="measured"
  fi
fi

# ---------------------------------------------------------------------------------------------
# Report

ratio() { awk -v a="${1:-}" -v b="${2:-}" 'BEGIN{ if (a == "" || b == "" || b + 0 == 0) print "-"; else printf "%.1fx", a / b }'; }

{
  echo
  echo "== Joule submission benchmark  ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, $(uname -r), git $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo '?'))"
  echo
  printf '%-46s %10s %9s %9s %5s %7s  %s\n' "run" "ok/s" "p50 ms" "p99 ms" "bad" "others" "notes"
  printf '%-46s %10s %9s %9s %5s %7s  %s\n' "---" "----" "------" "------" "---" "------" "-----"
  for row in "${rows[@]}"; do
    IFS='|' read -r a b c d e f g <<<"$row"
    printf '%-46s %10s %9s %9s %5s %6s%%  %s\n' "$a" "$b" "$c" "$d" "$e" "$f" "$g"
  done
  echo
  echo "Submissions per second, second by second (from jouled's joule_jobs_submitted_total):"
  for t in "${timelines[@]}"; do echo "  $t"; done
  echo
  if ((fresh_state)); then
    echo "Each wrk POST run started on a new jouled with an empty state (--fresh-state-per-run)."
  else
    echo "One jouled served every run in this order, so each run starts with the jobs of the runs above"
    echo "(see \"jobs stored\"); --fresh-state-per-run gives each wrk POST run an empty state."
  fi
  echo "wrk 1 conn POST: $(ratio "${repeat_rps:-}" "${wrk_rps_1:-}") the first run's rate when repeated with $repeat_jobs jobs stored."
  echo "bad = answers other than 201 (200 for GET), failed CLI calls, socket errors and timeouts."
  echo "others = CPU used by processes outside this benchmark during the run, in % of all $(nproc) CPUs."
  echo "jouled's 201 is sent after the job's SQLite commit (WAL, synchronous=FULL)."
  echo
  printf 'jouled idle, empty state:       %6s%% of one core over %ss, VmRSS %d KiB  (others: %s%%)\n' \
    "$idle0_cpu" "$idle_seconds" "$idle0_rss" "$idle0_busy"
  printf 'jouled idle, after submissions: %6s%% of one core over %ss, VmRSS %d KiB (VmHWM %d KiB), %s jobs, state dir %d KiB  (others: %s%%)\n' \
    "$idle1_cpu" "$idle_seconds" "$idle1_rss" "$idle1_hwm" "$final_jobs" "$db_kib" "$idle1_busy"
  echo "load average at the start: $load_start; at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "Peer: Slurm: $slurm_status"
  if [ "$slurm_status" = measured ]; then
    echo "$slurm_idle"
    echo "ratio jouled/sbatch, sequential:  wrk 1 conn $(ratio "${wrk_rps_1:-}" "${sbatch_rate_1:-}"),  joulectl $(ratio "${cli_rate_1:-}" "${sbatch_rate_1:-}")"
    echo "ratio jouled/sbatch, 8 parallel:  wrk 8 conn $(ratio "${wrk_rps_8:-}" "${sbatch_rate_8:-}"),  joulectl x8 $(ratio "${cli_rate_8:-}" "${sbatch_rate_8:-}")"
    echo "Not like for like in durability: sbatch returns its job id before slurmctld has saved the job"
    echo "(state is written at most every 5 s; acknowledged jobs can be lost on a controller crash, see"
    echo "docs/design.md, \"Exactly once\"), while jouled's 201 comes after an fsync'd commit. The joulectl rows"
    echo "match sbatch in shape (one process and one connection per submission); the wrk rows do not."
  fi
  echo
  echo "Command lines:"
  for c in "${commands[@]}"; do echo "  $c"; done
  if ((${#notes[@]})); then
    echo
    echo "Surprises:"
    for n in "${notes[@]}"; do echo "  - $n"; done
  fi
  echo
  echo "whole run: $(elapsed) s"
}
