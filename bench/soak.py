#!/usr/bin/python3
"""soak.py: a node's jouled killed with -9 again and again under a stream of submissions (issue 18).

    sudo /usr/bin/python3 bench/soak.py --json /tmp/soak.json     # 200 kills, >= 5,000 jobs: ~15 min
    sudo /usr/bin/python3 bench/soak.py --kills 10 --jobs 300     # a short run

One jouled (state directory of its own, jobs under accounts of their own when run as root) with
two devices that run jobs: `cpu`, which also probes when idle with joule-worker, and a simulated
`sim:laptop-cpu`, which probes by its simulator. Submitters post jobs at `--rate` per second
(default 25) until `--jobs` are acknowledged (a 201); meanwhile the killer sends SIGKILL to
jouled every `--every` seconds (default 1.2) and starts it again at once, `--kills` times. Each
job is a shell command that appends "start <ns>" and "end <ns>" to a marks file of its own
(its id) with `sleep` between: the jobs' own account of when they ran, not the daemon's.

At the end one jouled runs until every acknowledged job has ended, and the run is judged:
  - lost: acknowledged (201) but unknown to jouled afterwards;
  - ran twice: a marks file with two starts; overlapping: two runs at the same moment;
  - not durable: a job the API had shown in a state that a later answer contradicts
    (succeeded or failed shown, later not terminal or another terminal state);
  - ready again: seconds from starting jouled to its first 200 from /readyz, p50/p99/max;
  - how the jobs ended (succeeded, failed with which reasons, cancelled).
"""

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

from loopback import call, free_port, marked_root, seeded  # bench/loopback.py, beside this script

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TERMINAL = ("succeeded", "failed", "cancelled")


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values, p):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100.0 * (len(ordered) - 1))))]


class Node:
    """jouled on a fixed port, killed and started again (bench/finished_jobs.py uses it too, with
    a configuration of its own)."""

    def __init__(self, build, root, port, config=None, jouled=None):
        self.jouled = jouled or os.path.join(build, "daemon", "jouled")
        self.worker = os.path.join(build, "worker", "joule-worker")
        self.state = os.path.join(root, "state")
        self.port = port
        self.config = os.path.join(root, "jouled.toml")
        self.log_path = os.path.join(root, "jouled.log")
        with open(self.config, "w") as f:
            f.write(config if config is not None else
                    "[log]\nlevel = \"warn\"\n"
                    "[[devices]]\nname = \"cpu\"\nthreads = 1\n"
                    "[[devices]]\nname = \"sim:laptop-cpu\"\nruns_jobs = true\nprobes = 60\n"
                    f"[probing]\nenabled = true\nidle_seconds = 2\nworker = \"{self.worker}\"\n")
        self.proc = None
        self.lock = threading.Lock()

    def start(self):
        """Starts jouled; seconds until /readyz answers 200."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "MKL_", "OPENBLAS_", "JOULE_"))}
        started = time.monotonic()
        with self.lock, open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen([self.jouled, "--state-dir", self.state, "--listen",
                                          f"127.0.0.1:{self.port}", "--config", self.config],
                                         stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        while time.monotonic() - started < 60:
            try:
                status, _ = self.call("GET", "/readyz", timeout=2)
                if status == 200:
                    return time.monotonic() - started
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"jouled exited {self.proc.returncode}; the end of {self.log_path}:\n"
                                   + self.log_tail())
            time.sleep(0.01)
        raise RuntimeError("jouled was not ready within 60 s")

    def log_tail(self, lines=15):
        """The last lines jouled wrote (the temp dir may be gone by the time anyone looks)."""
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError as e:
            return f"(unreadable: {e})"

    def kill(self):
        with self.lock:
            if self.proc and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait()

    def stop(self):
        with self.lock:
            if self.proc and self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()

    def call(self, method, path, body=None, timeout=10):
        return call(self.port, method, path, body, timeout)


def probe_samples(node):
    """Each device's model samples at the end: what its probes learnt across every restart."""
    _, body = node.call("GET", "/v1/devices")
    return {d["name"]: (d.get("model") or {}).get("samples") for d in body["devices"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(REPO, "build"))
    parser.add_argument("--jobs", type=int, default=5000, help="acknowledged jobs to reach (default 5000)")
    parser.add_argument("--rate", type=float, default=25.0, help="submissions per second (default 25)")
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--every", type=float, default=1.2, help="seconds between kills (default 1.2)")
    parser.add_argument("--job-seconds", type=float, default=0.05, help="each job's sleep (default 0.05)")
    parser.add_argument("--seed", type=int, help="for the kills' timing and choices (default: random, printed)")
    parser.add_argument("--json")
    args = parser.parse_args()
    seed = seeded(args.seed)

    root, marks = marked_root("joule-soak-")
    node = Node(args.build, root, free_port())
    acknowledged = {}  # id -> submit time
    shown_terminal = {}  # id -> the terminal state the API once showed
    contradictions = []
    refused = collections.Counter()
    ready = []
    stop = threading.Event()
    submitted_done = threading.Event()
    submitted_at = []
    adopted = requeued = 0
    lock = threading.Lock()
    load_start = os.getloadavg()[0]

    command = ("d=%s; echo \"start $(date +%%s%%N)\" >> \"$d/$JOULE_JOB_ID\"; sleep %g; "
               "echo \"end $(date +%%s%%N)\" >> \"$d/$JOULE_JOB_ID\"") % (marks, args.job_seconds)

    def submitter():
        n = 0
        next_at = time.monotonic()
        while not stop.is_set():
            with lock:
                if len(acknowledged) >= args.jobs:
                    break
            next_at += 1.0 / args.rate
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            n += 1
            try:
                status, body = node.call("POST", "/v1/jobs", {"name": f"soak-{n}", "run": {"command": ["sh", "-c", command]}},
                                         timeout=5)
            except OSError as e:
                refused[type(e).__name__] += 1
                continue
            if status == 201:
                with lock:
                    acknowledged[body["id"]] = time.time()
            else:
                refused[f"HTTP {status}"] += 1
        submitted_at.append(time.monotonic())
        submitted_done.set()

    def watcher():
        # Reads jobs as a client would and remembers the terminal states it was shown.
        while not stop.is_set():
            with lock:
                ids = random.sample(list(acknowledged), min(20, len(acknowledged)))
            for job_id in ids:
                try:
                    status, body = node.call("GET", f"/v1/jobs/{job_id}", timeout=5)
                except OSError:
                    continue
                if status != 200:
                    continue
                state = body["state"]
                with lock:
                    earlier = shown_terminal.get(job_id)
                    if earlier and earlier != state:
                        contradictions.append({"id": job_id, "shown": earlier, "later": state})
                    if state in TERMINAL and not earlier:
                        shown_terminal[job_id] = state
            time.sleep(0.05)

    log(f"soak in {root}: {args.jobs} jobs at {args.rate}/s, {args.kills} kills every {args.every} s; "
        f"load {load_start:.2f}; seed {seed}")
    started = time.monotonic()
    ready.append(node.start())
    threads = [threading.Thread(target=submitter, daemon=True), threading.Thread(target=watcher, daemon=True)]
    for t in threads:
        t.start()
    kills = 0
    try:
        while kills < args.kills:
            time.sleep(args.every * random.uniform(0.5, 1.5))
            node.kill()
            kills += 1
            ready.append(node.start())
            if kills % 20 == 0:
                with lock:
                    count = len(acknowledged)
                log(f"{kills} kills, {count} jobs acknowledged; ready again p99 {percentile(ready, 99):.2f} s")
        submitted_done.wait()
        log(f"{kills} kills done; {len(acknowledged)} acknowledged; waiting for every job to end")
        deadline = time.monotonic() + 3600
        pending = set(acknowledged)
        states = {}
        while pending and time.monotonic() < deadline:
            for job_id in list(pending)[:500]:
                status, body = node.call("GET", f"/v1/jobs/{job_id}", timeout=10)
                if status == 404:
                    states[job_id] = ("lost", "")
                    pending.discard(job_id)
                elif status == 200 and body["state"] in TERMINAL:
                    states[job_id] = (body["state"], body.get("reason", ""))
                    pending.discard(job_id)
                    messages = [e["message"] for e in body.get("events", [])]
                    adopted += any("adopted process group" in m for m in messages)
                    requeued += any(m.startswith("queued again") for m in messages)
            if pending:
                time.sleep(1)
        stop.set()
        elapsed = time.monotonic() - started
        probe_runs = probe_samples(node)
    finally:
        stop.set()
        node.stop()

    ran_twice, overlapping, never_ran = [], [], []
    for job_id in acknowledged:
        path = os.path.join(marks, job_id)
        lines = open(path).read().split("\n") if os.path.exists(path) else []
        starts = [int(x.split()[1]) for x in lines if x.startswith("start ")]
        ends = [int(x.split()[1]) for x in lines if x.startswith("end ")]
        if not starts:
            never_ran.append(job_id)
        if len(starts) > 1:
            ran_twice.append(job_id)
            runs = sorted(zip(starts, ends + [None] * (len(starts) - len(ends))))
            for (s1, e1), (s2, _) in zip(runs, runs[1:]):
                if e1 is None or s2 < e1:
                    overlapping.append(job_id)
    ended = collections.Counter(state for state, _ in states.values())
    reasons = collections.Counter(reason[:80] for state, reason in states.values() if state != "succeeded")
    never_ran_succeeded = [j for j in never_ran if states.get(j, ("", ""))[0] == "succeeded"]
    summary = {
        "jobs_acknowledged": len(acknowledged),
        "kills": kills,
        "seconds": round(elapsed, 1),
        "submissions_per_second": round(len(acknowledged) / (submitted_at[0] - started), 1),
        "adopted_after_a_kill": adopted,
        "queued_again_after_a_kill": requeued,
        "model_samples_at_the_end": probe_runs,
        "not_acknowledged": dict(refused),
        "lost": ended.get("lost", 0),
        "unfinished": len(pending),
        "ran_twice": len(ran_twice),
        "ran_twice_overlapping": len(set(overlapping)),
        "never_ran": len(never_ran),
        "never_ran_but_succeeded": len(never_ran_succeeded),
        "shown_then_contradicted": contradictions[:20],
        "ended": dict(ended),
        "reasons_other_than_success": dict(reasons.most_common(10)),
        "ready_again_seconds": {"p50": percentile(ready, 50), "p99": percentile(ready, 99), "max": max(ready)},
        "load": {"start": load_start, "end": os.getloadavg()[0]},
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    if not (summary["lost"] or summary["unfinished"] or overlapping or contradictions):
        shutil.rmtree(root, ignore_errors=True)
    else:
        log(f"kept {root} for inspection")
    ok = not (summary["lost"] or summary["unfinished"] or overlapping or contradictions or ran_twice)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
