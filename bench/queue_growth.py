#!/usr/bin/env python3
"""Durable submissions per second as the queue grows behind a job that holds the only device.

    bench/queue_growth.py [--build build] [--batches 12] [--size 1000] [--reads 0]

Starts a jouled of its own (a temp state directory, one `cpu` device with the `modelled` meter,
probing off), submits a `sleep 3600` blocker, then submits `--batches` batches of `--size`
`true` jobs one after the other over one keep-alive HTTP connection and prints each batch's
rate with jouled's own CPU time per submission (user + system, from /proc: what the shared
machine's other load does not change) and the 1-minute load average. Every 201 comes after the job's SQLite commit, as always.
The client is this Python process (about 0.3 ms a request here): the figures are for comparing
queue lengths and commits on one machine, not for an absolute peak (bench/submit_bench.sh with
wrk measures that). With `--reads N`, the full queue is then read N times each way: a page of
`GET /v1/jobs?state=queued&limit=1000` and `GET /v1/jobs/{id}` of a job deep in the queue (how
fast the book's views are rendered). Standard library only; jouled is stopped and its state
removed at the end.
"""
import argparse
import http.client
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from loopback import free_port  # noqa: E402  bench/loopback.py
from soak import Node  # noqa: E402  bench/soak.py: jouled started, stopped and called


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--reads", type=int, default=0, help="reads of the full queue each way (default 0)")
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="joule-queue-growth-")
    os.chmod(root, 0o755)  # the jobs' accounts must reach the jobs' directory beside the state
    node = Node(args.build, root, free_port(),
                config=f"[server]\nmax_queued_jobs = {args.batches * args.size + 10}\n[probing]\nenabled = false\n"
                       '[[devices]]\nname = "cpu"\nmeter = "modelled"\n')
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

        def cpu_seconds():
            fields = open(f"/proc/{node.proc.pid}/stat").read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        blocker = submit({"name": "blocker", "run": {"command": ["sleep", "3600"]}})
        last = blocker
        print(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} jouled {node.jouled}, "
              f"{os.cpu_count()} CPUs, batches of {args.size}")
        for batch in range(args.batches):
            started, cpu_before = time.monotonic(), cpu_seconds()
            for i in range(args.size):
                last = submit({"name": f"q{batch}-{i}", "run": {"command": ["true"]}})
            rate = args.size / (time.monotonic() - started)
            cpu_ms = 1e3 * (cpu_seconds() - cpu_before) / args.size
            print(f"queued {batch * args.size:7d} to {(batch + 1) * args.size:7d}: {rate:7.1f}/s, "
                  f"{cpu_ms:.3f} ms of jouled's CPU each   load {os.getloadavg()[0]:.2f}", flush=True)
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
        # jouled leaves running jobs alone when it stops: the blocker is cancelled first.
        conn.request("DELETE", f"/v1/jobs/{blocker}")
        conn.getresponse().read()
        time.sleep(1)
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
