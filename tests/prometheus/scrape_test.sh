#!/usr/bin/env bash
# A real Prometheus server scrapes a real jouled; promtool lints the exposition.
#
#   bash tests/prometheus/scrape_test.sh /path/to/jouled
#
# 1. starts jouled on 127.0.0.1:0 with a temp state dir, runs one short job to success;
# 2. `promtool check metrics` on GET /metrics must exit 0 and print nothing;
# 3. starts `prometheus` on a free loopback port, scraping jouled every second;
# 4. polls Prometheus' query API until the joule series arrive with sane values.
# Exit 0 and one summary line on success; otherwise a FAIL line, the daemon and server
# log tails on stderr, and a non-zero status. Every process started here is stopped
# by the EXIT trap, including job process groups that jouled leaves running on purpose
# when it drains.
#
# Tools: curl, python3, promtool, prometheus (Debian: apt-get install prometheus).
# Override their paths with PROMETHEUS=... PROMTOOL=... if needed.
set -euo pipefail

readonly JOULED=${1:-}
readonly PROMETHEUS=${PROMETHEUS:-prometheus}
readonly PROMTOOL=${PROMTOOL:-promtool}

# Time limits, in seconds: generous for a slow, loaded 2-core CI machine, yet the worst
# case (every wait and every 10 s curl timing out) stays under ctest's TIMEOUT of 180,
# so the EXIT trap gets to run. A passing run takes about 8 s.
readonly START_TIMEOUT=10   # jouled prints its "listening on" line
readonly JOB_TIMEOUT=30     # the job reaches "succeeded"
readonly PROM_READY_TIMEOUT=20
readonly QUERY_TIMEOUT=30   # Prometheus has scraped the expected series
readonly JOB_NAME=joule     # Prometheus scrape job name

TMP=""
JOULED_PID=""
PROM_PID=""
QUERY_PID=""
JOULED_LOG=""
PROM_LOG=""

log_tail() { # FILE LABEL
  if [[ -n $1 && -s $1 ]]; then
    echo "--- last lines of $2 ($1) ---" >&2
    tail -n 25 "$1" >&2 || true
  fi
}

fail() {
  echo "FAIL prometheus_scrape: $*" >&2
  log_tail "$JOULED_LOG" "jouled log"
  log_tail "$PROM_LOG" "prometheus log"
  [[ -n $TMP ]] && log_tail "$TMP/curl.err" "curl errors"
  exit 1
}

stop_pid() { # PID: SIGTERM, up to 5 s to exit, then SIGKILL; reaps our own child
  local pid=$1 i
  [[ -n $pid ]] || return 0
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

kill_job_groups() {
  # jouled starts every job as its own process group and, by design, leaves running jobs
  # alone when it stops (they are adopted at its next start). Kill those groups: the ones
  # its log names, and those led by a job runner whose command line holds our state dir.
  local own_pgid pgids=() pg p cmd
  own_pgid=$(ps -o pgid= -p $$ | tr -d ' ')
  if [[ -n $JOULED_LOG && -f $JOULED_LOG ]]; then
    while read -r pg; do pgids+=("$pg"); done \
      < <(sed -n 's/.*started as process group \([0-9][0-9]*\).*/\1/p' "$JOULED_LOG")
  fi
  for p in /proc/[0-9]*; do
    cmd=$({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) || continue
    if [[ $cmd == *"$TMP/"* ]]; then
      pg=$(ps -o pgid= -p "${p#/proc/}" 2>/dev/null | tr -d ' ') || continue
      [[ -n $pg ]] && pgids+=("$pg")
    fi
  done
  for pg in "${pgids[@]+"${pgids[@]}"}"; do
    [[ $pg =~ ^[0-9]+$ && $pg -gt 1 && $pg != "$own_pgid" ]] || continue
    kill -KILL -- "-$pg" 2>/dev/null || true
  done
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  stop_pid "$QUERY_PID"
  stop_pid "$PROM_PID"
  stop_pid "$JOULED_PID"
  [[ -n $TMP ]] && kill_job_groups
  [[ -n $TMP && -d $TMP ]] && rm -rf -- "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "FAIL prometheus_scrape: interrupted (SIGINT)" >&2; exit 130' INT
trap 'echo "FAIL prometheus_scrape: interrupted (SIGTERM)" >&2; exit 143' TERM

# ---------------------------------------------------------------------------- preflight
[[ -n $JOULED ]] || fail "usage: $0 /path/to/jouled"
[[ -x $JOULED ]] || fail "jouled binary '$JOULED' is missing or not executable"
for tool in curl python3 "$PROMTOOL" "$PROMETHEUS"; do
  command -v "$tool" >/dev/null 2>&1 ||
    fail "'$tool' not found in PATH (Debian/Ubuntu: apt-get install prometheus curl python3)"
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/joule-scrape.XXXXXXXX")
# jouled puts each job's directory beside its state directory, under accounts of their own:
# the jobs must be able to enter this one.
chmod 755 "$TMP"
JOULED_LOG=$TMP/jouled.log
PROM_LOG=$TMP/prometheus.log

free_port() {
  python3 -c 'import socket
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}

# GET/POST with bounded time; the body goes to $2 and the HTTP status to stdout.
http() { # METHOD URL OUTFILE [curl args...]
  local method=$1 url=$2 out=$3
  shift 3
  curl -sS --noproxy '*' --max-time 10 -o "$out" -w '%{http_code}' -X "$method" "$@" "$url" 2>>"$TMP/curl.err" ||
    echo "000"
}

json_field() { # FILE FIELD: print a top-level string field of a JSON object, or nothing
  python3 -c 'import json, sys
try:
    v = json.load(open(sys.argv[1])).get(sys.argv[2])
except Exception:
    v = None
print(v if isinstance(v, str) else "")' "$1" "$2"
}

# --------------------------------------------------------------------------- 1. jouled
# A fresh process group is not needed: jouled is our direct child and stop_pid reaps it.
# Create the log first: the child opens it only after the fork, and we read it at once.
: >"$JOULED_LOG"
env -u NOTIFY_SOCKET "$JOULED" --state-dir "$TMP/state" --listen 127.0.0.1:0 \
  >"$JOULED_LOG" 2>&1 &
JOULED_PID=$!

JOULED_ADDR=""
deadline=$((SECONDS + START_TIMEOUT))
while ((SECONDS < deadline)); do
  line=$(grep -m 1 -o 'listening on http://127\.0\.0\.1:[0-9][0-9]*' "$JOULED_LOG" 2>/dev/null) || line=""
  JOULED_ADDR=${line#listening on http://}
  [[ -n $JOULED_ADDR ]] && break
  kill -0 "$JOULED_PID" 2>/dev/null || fail "jouled exited before listening"
  sleep 0.1
done
[[ -n $JOULED_ADDR ]] || fail "jouled printed no 'listening on http://127.0.0.1:PORT' line within ${START_TIMEOUT}s"
[[ ${JOULED_ADDR##*:} != 0 ]] || fail "jouled reported port 0 instead of the port it bound"
JOULED_URL=http://$JOULED_ADDR

code=$(http GET "$JOULED_URL/healthz" "$TMP/healthz.json")
[[ $code == 200 ]] || fail "GET /healthz answered HTTP $code: $(cat "$TMP/healthz.json" 2>/dev/null)"

code=$(http POST "$JOULED_URL/v1/jobs" "$TMP/submit.json" -H 'Content-Type: application/json' \
  --data '{"name":"prometheus-scrape-test","run":{"command":["sh","-c","sleep 1"]}}')
[[ $code == 201 ]] || fail "POST /v1/jobs answered HTTP $code: $(cat "$TMP/submit.json" 2>/dev/null)"
JOB_ID=$(json_field "$TMP/submit.json" id)
[[ $JOB_ID =~ ^[A-Za-z0-9._-]+$ ]] || fail "POST /v1/jobs returned no usable id: $(cat "$TMP/submit.json")"

state=""
deadline=$((SECONDS + JOB_TIMEOUT))
while ((SECONDS < deadline)); do
  code=$(http GET "$JOULED_URL/v1/jobs/$JOB_ID" "$TMP/job.json")
  state=$(json_field "$TMP/job.json" state)
  case $state in
    succeeded) break ;;
    failed | cancelled) fail "job $JOB_ID ended '$state': $(cat "$TMP/job.json")" ;;
  esac
  sleep 0.25
done
[[ $state == succeeded ]] ||
  fail "job $JOB_ID not succeeded after ${JOB_TIMEOUT}s (HTTP $code, state '$state'): $(cat "$TMP/job.json" 2>/dev/null)"

# ------------------------------------------------------------------------- 2. promtool
code=$(http GET "$JOULED_URL/metrics" "$TMP/metrics.txt")
[[ $code == 200 ]] || fail "GET /metrics answered HTTP $code"
# promtool 2.42 exits 0 when clean, 3 on lint problems, 1 on parse errors; it prints the
# problems. Demand exit 0 and silence.
set +e
promtool_out=$("$PROMTOOL" check metrics <"$TMP/metrics.txt" 2>&1)
promtool_rc=$?
set -e
if ((promtool_rc != 0)) || [[ -n $promtool_out ]]; then
  fail "promtool check metrics (exit $promtool_rc) complained about jouled's /metrics:
$promtool_out"
fi
for family in joule_device_energy_joules_total joule_device_power_watts joule_jobs \
  joule_jobs_submitted_total joule_job_energy_joules_total joule_http_requests_total \
  joule_http_request_duration_seconds; do
  grep -q "^# TYPE $family " "$TMP/metrics.txt" || fail "/metrics lacks the metric family '$family'"
done
families=$(grep -c '^# TYPE ' "$TMP/metrics.txt" || true)

# ----------------------------------------------------------------------- 3. Prometheus
mkdir -p "$TMP/prom-data"
cat >"$TMP/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: $JOB_NAME
    metrics_path: /metrics
    static_configs:
      - targets: ["$JOULED_ADDR"]
EOF
# promtool check config also validates the YAML before the server sees it.
"$PROMTOOL" check config "$TMP/prometheus.yml" >"$TMP/check-config.txt" 2>&1 ||
  fail "promtool check config rejected the generated config: $(cat "$TMP/check-config.txt")"

# The free port comes from a bind to port 0 that is then released; another process may
# take it before Prometheus binds, so retry with a fresh port when the bind fails.
PROM_URL=""
for attempt in 1 2 3; do
  prom_port=$(free_port) || fail "could not find a free port with python3"
  : >"$PROM_LOG"
  "$PROMETHEUS" \
    --config.file="$TMP/prometheus.yml" \
    --storage.tsdb.path="$TMP/prom-data" \
    --web.listen-address="127.0.0.1:$prom_port" \
    --log.level=warn \
    >"$PROM_LOG" 2>&1 &
  PROM_PID=$!
  ready=""
  deadline=$((SECONDS + PROM_READY_TIMEOUT))
  while ((SECONDS < deadline)); do
    if ! kill -0 "$PROM_PID" 2>/dev/null; then
      wait "$PROM_PID" 2>/dev/null || true
      PROM_PID=""
      break
    fi
    if [[ $(curl -s --noproxy '*' --max-time 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$prom_port/-/ready" 2>/dev/null) == 200 ]]; then
      ready=1
      break
    fi
    sleep 0.2
  done
  if [[ -n $ready ]]; then
    PROM_URL=http://127.0.0.1:$prom_port
    break
  fi
  if [[ -z $PROM_PID ]] && grep -qi 'address already in use' "$PROM_LOG"; then
    continue # lost the port race; try another
  fi
  [[ -n $PROM_PID ]] && fail "prometheus (attempt $attempt) not ready on 127.0.0.1:$prom_port after ${PROM_READY_TIMEOUT}s"
  fail "prometheus (attempt $attempt) exited during startup"
done
[[ -n $PROM_URL ]] || fail "prometheus could not bind a free loopback port in 3 attempts"

# ------------------------------------------------------------------- 4. query the API
# In the background and waited for, so that a SIGTERM/SIGINT to this script runs the
# cleanup at once instead of after the poll loop.
python3 - "$PROM_URL" "$JOB_NAME" "$JOULED_ADDR" "$QUERY_TIMEOUT" >"$TMP/query.out" 2>&1 <<'PY' &
import json, sys, time, urllib.error, urllib.parse, urllib.request

prom, job, target, timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])

# (label, PromQL, predicate over the float values, what the predicate demands)
checks = [
    ("up", 'up{job="%s"}' % job, lambda v: len(v) == 1 and v[0] == 1, "exactly one series, == 1"),
    ("energy", 'joule_device_energy_joules_total{source="modelled"}',
     lambda v: len(v) >= 1 and all(x > 0 for x in v), "at least one series, every value > 0"),
    ("submitted", "joule_jobs_submitted_total", lambda v: len(v) == 1 and v[0] >= 1,
     "exactly one series, >= 1"),
    ("succeeded", 'joule_jobs{state="succeeded"}', lambda v: len(v) == 1 and v[0] >= 1,
     "exactly one series, >= 1"),
    ("job_energy", 'joule_job_energy_joules_total{source="modelled"}',
     lambda v: len(v) >= 1 and sum(v) > 0, "at least one series, sum > 0"),
]

# Loopback only: ignore any http_proxy/https_proxy in the environment.
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

def query(q):
    url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
    wait = max(0.5, min(3.0, deadline - time.monotonic()))  # bounded overshoot
    try:
        with opener.open(url, timeout=wait) as r:
            raw = r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return None, "HTTP %d: %s" % (e.code, e.read().decode("utf-8", "replace")[:2000])
    except Exception as e:  # connection refused, timeout, ...
        return None, "request failed: %r" % (e,)
    try:
        answer = json.loads(raw)
    except ValueError:
        return None, "not JSON: " + raw[:2000]
    if answer.get("status") != "success":
        return None, raw[:2000]
    data = answer.get("data", {})
    if data.get("resultType") != "vector":
        return None, raw[:2000]
    return data.get("result", []), raw[:2000]

deadline = time.monotonic() + timeout
last = {}
results = {}
while True:
    pending = [c for c in checks if c[0] not in results]
    for label, q, ok, _ in pending:
        series, raw = query(q)
        last[label] = raw
        if series is None:
            continue
        try:
            values = [float(s["value"][1]) for s in series]
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        # Scraped series must carry the scrape target as their instance label.
        if series and all(s.get("metric", {}).get("instance") == target and
                          s.get("metric", {}).get("job") == job for s in series) and ok(values):
            results[label] = (series, values)
    if len(results) == len(checks):
        break
    if time.monotonic() >= deadline:
        print("Prometheus at %s did not return the expected series within %gs:" % (prom, timeout))
        for label, q, _, want in checks:
            if label not in results:
                print("  %s  (want %s, job=%r, instance=%r)\n    last answer: %s"
                      % (q, want, job, target, last.get(label, "<none>")))
        sys.exit(1)
    time.sleep(0.5)

def fmt(x):
    return ("%.2f" % x).rstrip("0").rstrip(".")

energy = ", ".join("%s=%s J" % (s["metric"].get("device", "?"), fmt(v))
                   for s, v in zip(*results["energy"]))
print("up=%s; joule_device_energy_joules_total{source=modelled}: %s; "
      "joule_jobs_submitted_total=%s; joule_jobs{state=succeeded}=%s; "
      "joule_job_energy_joules_total=%s J"
      % (fmt(results["up"][1][0]), energy, fmt(results["submitted"][1][0]),
         fmt(results["succeeded"][1][0]), fmt(sum(results["job_energy"][1]))))
PY
QUERY_PID=$!
set +e
wait "$QUERY_PID"
query_rc=$?
set -e
QUERY_PID=""
summary=$(cat "$TMP/query.out")
((query_rc == 0)) || fail "$summary"

prom_version=$("$PROMETHEUS" --version 2>&1 | sed -n '1s/^prometheus, version \([^ ]*\).*/\1/p')
echo "PASS prometheus_scrape: promtool check metrics clean ($families families);" \
  "Prometheus ${prom_version:-?} scraped jouled at $JOULED_ADDR (job $JOB_ID succeeded): $summary"
