#!/usr/bin/env bash
# First run on a fresh Debian 12 machine: installs the dependencies (Debian packages only),
# builds, starts jouled on its embedded defaults (no config file) and runs a sample training
# job end to end through joulectl, printing its id, state, seconds, joules and meter source.
# jouled is left running afterwards; the script says how to stop it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

./scripts/install-deps.sh
# Only the programs this script runs; ./scripts/test.sh builds the test suite and benchmarks.
./scripts/build.sh jouled joulectl joule-worker

server=http://127.0.0.1:8571
jouled=build/daemon/jouled
joulectl="build/cli/joulectl --server $server"

# A jouled this script started earlier is replaced by the one just built.
if [ -f build/jouled-demo.pid ] && kill -0 "$(cat build/jouled-demo.pid)" 2>/dev/null; then
  kill "$(cat build/jouled-demo.pid)"
  for _ in $(seq 50); do kill -0 "$(cat build/jouled-demo.pid)" 2>/dev/null || break; sleep 0.1; done
fi
if curl -fsS "$server/healthz" >/dev/null 2>&1; then
  echo "== a jouled is already answering on $server; using it"
else
  echo "== starting jouled on its embedded defaults (no config file): $jouled"
  setsid "$jouled" >build/jouled-demo.log 2>&1 </dev/null &
  echo $! >build/jouled-demo.pid
  for _ in $(seq 100); do
    curl -fsS "$server/readyz" >/dev/null 2>&1 && break
    kill -0 "$(cat build/jouled-demo.pid)" 2>/dev/null || { cat build/jouled-demo.log; exit 1; }
    sleep 0.1
  done
  curl -fsS "$server/readyz" >/dev/null || { echo "jouled did not become ready"; cat build/jouled-demo.log; exit 1; }
  sed -n 's/^.*info: //p' build/jouled-demo.log | head -n 4 | sed 's/^/   jouled: /'
fi

echo "== devices of this node"
$joulectl devices

echo "== submitting examples/hello-job.json and waiting for it"
# Jobs run under accounts of their own and cannot enter a checkout in a private home or
# temporary directory (/root, mktemp -d): where the examples are out of their reach, the
# sample runs from a copy that they can read.
examples=$root/examples
if [ "$(id -u)" -eq 0 ] && ! setpriv --reuid=65534 --regid=65534 --clear-groups test -r "$examples/hello-training.py" 2>/dev/null; then
  examples=/var/tmp/joule-examples
  install -d -m 0755 "$examples"
  install -m 0644 "$root/examples/hello-training.py" "$examples/"
  echo "   (from a copy in $examples: jobs cannot read $root)"
fi
sed "s|@EXAMPLES@|$examples|" examples/hello-job.json >build/hello-job.json
status=0
$joulectl submit --wait build/hello-job.json || status=$?

echo "== its output (joulectl logs ID)"
id=$($joulectl --json jobs --limit 1000000 | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][-1]["id"])')
$joulectl logs "$id" | tail -n 3

echo
if [ -f build/jouled-demo.pid ] && kill -0 "$(cat build/jouled-demo.pid)" 2>/dev/null; then
  echo "jouled keeps running at $server (pid $(cat build/jouled-demo.pid), log build/jouled-demo.log)."
  echo "After 60 s of idleness it probes the CPU with build/worker/joule-worker to learn its energy model"
  echo "(joulectl devices shows it; [probing] enabled = false in a config turns that off)."
  echo "Try: build/cli/joulectl jobs | build/cli/joulectl devices | build/cli/joulectl probes | curl -s $server/metrics"
  echo "     build/cli/joulectl probe --device cpu --seconds 60 --model examples/models/lenet5.json --wait"
  echo "Stop it with: kill $(cat build/jouled-demo.pid)"
fi
exit $status
