#!/usr/bin/env python3
"""How many probes a requested probe run gets done with one plan per joule-worker process and
with several ([probing] plans_per_run), on this machine's `cpu` device.

  bench/probe_batch.py [--jouled PATH] [--seconds 60] [--batches 1,4] [--repeats 2]

For each repeat and each plans_per_run in turn (interleaved, so load drifts hit both alike): a
fresh jouled (temp state dir, 127.0.0.1:0, background probing off), one POST /v1/probes of
--seconds on cpu, then the run's probes, probe seconds and metered joules from GET /v1/probes/ID
and the worker processes started (counted from jouled's probe directories). Prints one row per
run and the ratio of probes per minute against the first --batches value. The joules are the
worker's meter's (on a machine without RAPL, `modelled`: a model of energy, not a measurement).
Needs python3 (stdlib only).
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def api(url, method="GET", body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read() or b"null")


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def one_run(jouled, plans_per_run, seconds):
    tmp = tempfile.mkdtemp(prefix="joule-probe-batch-")
    os.chmod(tmp, 0o755)  # the jobs' directory beside the state must be reachable by their accounts
    config = os.path.join(tmp, "jouled.toml")
    with open(config, "w") as f:
        f.write(f"[probing]\nenabled = false\nthreads = 1\nplans_per_run = {plans_per_run}\n")
    log_path = os.path.join(tmp, "jouled.log")
    log = open(log_path, "w")
    daemon = subprocess.Popen([jouled, "--config", config, "--state-dir", os.path.join(tmp, "state"),
                               "--listen", "127.0.0.1:0"], stdout=log, stderr=subprocess.STDOUT)
    try:
        port = None
        for _ in range(300):
            with open(log_path) as f:
                found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", f.read())
            if found:
                port = found.group(1)
                break
            time.sleep(0.1)
        if not port:
            with open(log_path) as f:
                raise SystemExit(f"jouled did not say where it listens; its log:\n{f.read()[-3000:]}")
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                api(base + "/readyz")
                break
            except Exception:
                time.sleep(0.1)
        load_before = loadavg()
        started = api(base + "/v1/probes", "POST", {"device": "cpu", "seconds": seconds})
        run_id = started["id"]
        workers = set()
        probes_dir = os.path.join(tmp, "state", "probes")
        while True:
            if os.path.isdir(probes_dir):
                workers.update(d for d in os.listdir(probes_dir) if not d.startswith("env-"))
            run = api(f"{base}/v1/probes/{run_id}")
            if run["state"] != "running":
                break
            time.sleep(0.2)
        return {"plans_per_run": plans_per_run, "probes": run["probes"], "failed": run["failed"],
                "probe_seconds": run["probe_seconds"], "joules": run["energy"]["joules"],
                "source": run["energy"]["source"], "workers": len(workers),
                "wall_seconds": (run["finished_ms"] - run["started_ms"]) / 1000.0,
                "load_before": load_before, "load_after": loadavg()}
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jouled", default=os.environ.get("JOULED", os.path.join(TOP, "build/daemon/jouled")))
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    print(f"{'plans/run':>9} {'probes':>6} {'failed':>6} {'workers':>7} {'probe s':>8} {'wall s':>7} "
          f"{'probes/min':>10} {'joules':>9}  source    load before -> after")
    for _ in range(args.repeats):
        for batch in batches:
            row = one_run(args.jouled, batch, args.seconds)
            row["per_minute"] = 60.0 * row["probes"] / row["wall_seconds"]
            rows.append(row)
            print(f"{batch:>9} {row['probes']:>6} {row['failed']:>6} {row['workers']:>7} {row['probe_seconds']:>8.1f} "
                  f"{row['wall_seconds']:>7.1f} {row['per_minute']:>10.1f} {row['joules']:>9.1f}  {row['source']:<9} "
                  f"{row['load_before']} -> {row['load_after']}", flush=True)
    base = statistics.median(r["per_minute"] for r in rows if r["plans_per_run"] == batches[0])
    for batch in batches[1:]:
        value = statistics.median(r["per_minute"] for r in rows if r["plans_per_run"] == batch)
        print(f"probes per minute, plans_per_run {batch} / {batches[0]}: {value / base:.2f} "
              f"(medians of {args.repeats} runs each)")


if __name__ == "__main__":
    sys.exit(main())
