#!/usr/bin/env python3
"""Durable submissions per second as the queue grows behind a job that holds the only device.

    bench/queue_growth.py [--build build] [--batches 12] [--size 1000] [--reads 0] [--estimated]

Starts a jouled of its own (a temp state directory, one `cpu` device with the `modelled` meter,
probing off), submits a `sleep 3600` blocker, then submits `--batches` batches of `--size`
`true` jobs one after the other over one keep-alive HTTP connection and prints each batch's
rate with jouled's own CPU time per submission (user + system, from /proc: what the shared
machine's other load does not change), its resident memory and the 1-minute load average. Every 201 comes after the job's SQLite commit, as always.
The client is this Python process (about 0.3 ms a request here): the figures are for comparing
queue lengths and commits on one machine, not for an absolute peak (bench/submit_bench.sh with
wrk measures that). With `--reads N`, the full queue is then read N times each way: a page of
`GET /v1/jobs?state=queued&limit=1000` and `GET /v1/jobs/{id}` of a job deep in the queue (how
fast the book's views are rendered). With `--estimated`, each job names a small CNN and its
training and the node has a simulated device beside `cpu` (it estimates, it runs nothing), so
every submission is estimated on both devices and stores its estimate, as a job with a model
does on a probed node. At the end, jouled's own account of its event loop (joule_loop_work_seconds
from /metrics): for each kind of work, how many, their mean, how many held the loop over 10 ms
and the bucket of the longest. Standard library only; jouled is stopped and its state removed
at the end.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from loopback import free_port  # noqa: E402  bench/loopback.py
from finished_jobs import MODEL  # noqa: E402  bench/finished_jobs.py: the small CNN its jobs name
from soak import Node  # noqa: E402  bench/soak.py: jouled started, stopped and called


def print_loop_work(metrics):
    """joule_loop_work_seconds by work: count, mean, how many over 10 ms, the longest's bucket."""
    buckets, sums = {}, {}
    for line in metrics.splitlines():
        match = re.match(r'joule_loop_work_seconds_bucket\{(.*)\} (\S+)', line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match[1]))
            bound = float("inf") if labels["le"] == "+Inf" else float(labels["le"])
            buckets.setdefault(labels["work"], []).append((bound, float(match[2])))
        match = re.match(r'joule_loop_work_seconds_sum\{work="([^"]+)"\} (\S+)', line)
        if match:
            sums[match[1]] = float(match[2])
    for work, rows in sorted(buckets.items()):
        rows.sort()
        count = rows[-1][1]
        over = count - next((n for bound, n in rows if bound >= 0.01), count)
        longest = next(bound for bound, n in rows if n >= count)
        below = max((bound for bound, n in rows if n < count), default=0.0)
        print(f"loop work {work:32s} {int(count):7d}, mean {1e3 * sums.get(work, 0.0) / max(count, 1):7.3f} ms, "
              f"{int(over)} over 10 ms, longest in ({1e3 * below:g}, {1e3 * longest:g}] ms")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--reads", type=int, default=0, help="reads of the full queue each way (default 0)")
    parser.add_argument("--estimated", action="store_true",
                        help="jobs name a model and training; a simulated device estimates them")
    args = parser.parse_args()
    estimator = '[[devices]]\nname = "sim:laptop-cpu"\n' if args.estimated else ""
    model = {"model": MODEL, "training": {"batch_size": 8, "samples_per_epoch": 64, "epochs": 1}} if args.estimated else {}

    root = tempfile.mkdtemp(prefix="joule-queue-growth-")
    os.chmod(root, 0o755)  # the jobs' accounts must reach the jobs' directory beside the state
    node = Node(args.build, root, free_port(),
                config=f"[server]\nmax_queued_jobs = {args.batches * args.size + 10}\n[probing]\nenabled = false\n"
                       '[[devices]]\nname = "cpu"\nmeter = "modelled"\n' + estimator)
    try:
        node.start()
        # One keep-alive connection for every submission (Node.call opens one per request).
        conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)

        def submit(body):
            conn.request("POST", "/v1/jobs", json.dumps(body), {"Content-Type": "application/json"})
            reply = conn.getresponse()
            data = reply.read()
            if reply.status != 201:
                sys.exit(f"POST /v1/jobs answered {reply.status}: {data[:300]!r}")
            return json.loads(data)["id"]

        def rss_mib():
            for line in open(f"/proc/{node.proc.pid}/status"):
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
            return 0.0

        def cpu_seconds():
            fields = open(f"/proc/{node.proc.pid}/stat").read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        blocker = submit({"name": "blocker", "run": {"command": ["sleep", "3600"]}})
        last = blocker
        print(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} jouled {node.jouled}, "
              f"{os.cpu_count()} CPUs, batches of {args.size}{', estimated' if args.estimated else ''}")
        for batch in range(args.batches):
            started, cpu_before = time.monotonic(), cpu_seconds()
            for i in range(args.size):
                last = submit({"name": f"q{batch}-{i}", "run": {"command": ["true"]}, **model})
            rate = args.size / (time.monotonic() - started)
            cpu_ms = 1e3 * (cpu_seconds() - cpu_before) / args.size
            print(f"queued {batch * args.size:7d} to {(batch + 1) * args.size:7d}: {rate:7.1f}/s, "
                  f"{cpu_ms:.3f} ms of jouled's CPU each, RSS {rss_mib():.0f} MiB   load {os.getloadavg()[0]:.2f}",
                  flush=True)
        for target, what in ((f"/v1/jobs?state=queued&limit=1000", "pages of 1000 queued jobs"),
                             (f"/v1/jobs/{last}", "the last queued job")):
            if args.reads <= 0:
                break
            started, cpu_before = time.monotonic(), cpu_seconds()
            for _ in range(args.reads):
                conn.request("GET", target)
                reply = conn.getresponse()
                reply.read()
                if reply.status != 200:
                    sys.exit(f"GET {target} answered {reply.status}")
            rate = args.reads / (time.monotonic() - started)
            cpu_ms = 1e3 * (cpu_seconds() - cpu_before) / args.reads
            print(f"read {what}: {rate:7.1f}/s, {cpu_ms:.3f} ms of jouled's CPU each   load {os.getloadavg()[0]:.2f}",
                  flush=True)
        conn.request("GET", "/metrics")
        print_loop_work(conn.getresponse().read().decode())
        # jouled leaves running jobs alone when it stops: the blocker is cancelled first.
        conn.request("DELETE", f"/v1/jobs/{blocker}")
        conn.getresponse().read()
        time.sleep(1)
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
