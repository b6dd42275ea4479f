#!/usr/bin/python3
"""chaos.py: a coordinator and three agents killed, hung and restarted while jobs run (issue 18).

    sudo /usr/bin/python3 bench/chaos.py --json /tmp/chaos.json    # 50 kills each: ~6 min
    sudo /usr/bin/python3 bench/chaos.py --kills 5 --jobs 40       # ~1 min

A coordinator (fixed loopback port, heartbeat 0.5 s, `lost_after_seconds` 4) and three agents,
each with one simulated device that runs jobs, all on loopback. Jobs are submitted to the
coordinator at `--rate` per second until `--jobs` are acknowledged. Each job runs for
`--job-seconds` and, every 50 ms, appends the time to a marks file named by its run's id on the
agent (`<job id>.<epoch>`): the runs' own record of when they ran.

Meanwhile, every 0.5-1.5 s, one of: an agent killed with -9 and started again after 0-8 s
(sometimes past its lease, so the coordinator places its job elsewhere and the job's runner must
fence the orphan), the coordinator killed with -9 and started again at once, or an agent hung
(SIGSTOP, a partition as its peers see it: its jobs run on but nothing renews their leases) for
2-8 s, until `--kills` kills of agents and of the coordinator each. Then everything runs until
every acknowledged job has ended.

Judged: lost (a 201 from the coordinator, then unknown to it); two runs of one job at the same
moment, by the marks (a run's span is its first to its last mark; spans of two epochs of one job
must not overlap); how the jobs ended; how many ran more than once.
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


class Daemon:
    def __init__(self, jouled, root, name, config, port=0):
        self.jouled, self.name, self.port = jouled, name, port
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir)
        self.config = os.path.join(root, name + ".toml")
        with open(self.config, "w") as f:
            f.write(config)
        self.proc = None
        self.stopped = False  # SIGSTOPped

    def start(self):
        with open(os.path.join(self.dir + ".log"), "ab") as out:
            self.proc = subprocess.Popen([self.jouled, "--config", self.config, "--state-dir", self.dir, "--listen",
                                          f"127.0.0.1:{self.port}"], stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        self.stopped = False

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def hang(self, hung):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP if hung else signal.SIGCONT)
            self.stopped = hung

    def alive(self):
        return self.proc is not None and self.proc.poll() is None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(REPO, "build"))
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--rate", type=float, default=2.0, help="submissions per second (default 2)")
    parser.add_argument("--kills", type=int, default=50, help="kills of agents, and of the coordinator, each")
    parser.add_argument("--job-seconds", type=float, default=2.0)
    parser.add_argument("--seed", type=int, help="for the kills' timing and choices (default: random, printed)")
    parser.add_argument("--json")
    args = parser.parse_args()
    seed = seeded(args.seed)

    root, marks = marked_root("joule-chaos-")
    jouled = os.path.join(root, "jouled")
    shutil.copy2(os.path.join(args.build, "daemon", "jouled"), jouled)
    port = free_port()
    coordinator = Daemon(jouled, root, "coordinator", f"""[node]
name = "coord"
[log]
level = "warn"
[cluster]
role = "coordinator"
heartbeat_seconds = 0.5
lost_after_seconds = 4
[[devices]]
name = "sim:laptop-cpu"
probes = 20
runs_jobs = false
[probing]
enabled = false
""", port)
    profiles = ["jetson-orin", "raspberry-pi-4", "server-gpu"]
    agents = [Daemon(jouled, root, f"agent-{i}", f"""[node]
name = "agent-{i}"
[log]
level = "warn"
[cluster]
role = "agent"
coordinator = "http://127.0.0.1:{port}"
[[devices]]
name = "sim:{profiles[i]}"
probes = 20
runs_jobs = true
[probing]
enabled = false
""") for i in range(3)]

    beat = ("end=$(( $(date +%%s%%N) + %d )); f=%s/$JOULE_JOB_ID; "
            "while [ $(date +%%s%%N) -lt $end ]; do date +%%s%%N >> $f; sleep 0.05; done") % (
        int(args.job_seconds * 1e9), marks)
    acknowledged = {}
    refused = collections.Counter()
    stop = threading.Event()
    lock = threading.Lock()
    actions = collections.Counter()

    def submitter():
        n = 0
        while not stop.is_set() and len(acknowledged) < args.jobs:
            time.sleep(1.0 / args.rate)
            n += 1
            try:
                status, body = call(port, "POST", "/v1/jobs", {"name": f"chaos-{n}",
                                                              "run": {"command": ["sh", "-c", beat]}})
            except OSError as e:
                refused[type(e).__name__] += 1
                continue
            if status == 201:
                with lock:
                    acknowledged[body["id"]] = time.time()
            else:
                refused[f"HTTP {status}"] += 1

    load_start = os.getloadavg()[0]
    started = time.monotonic()
    coordinator.start()
    for agent in agents:
        agent.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            status, nodes = call(port, "GET", "/v1/nodes")
            if status == 200 and sum(n["state"] == "ready" for n in nodes["nodes"]) == 3:
                break
        except OSError:
            pass
        time.sleep(0.2)
    else:
        raise RuntimeError(f"the agents never became ready; logs in {root}")
    log(f"chaos in {root}: coordinator on {port}, 3 agents ready; load {load_start:.2f}; seed {seed}")
    submit_thread = threading.Thread(target=submitter, daemon=True)
    submit_thread.start()

    restarts = []  # (monotonic time, agent) to start again
    try:
        while actions["agent killed"] < args.kills or actions["coordinator killed"] < args.kills:
            time.sleep(random.uniform(0.5, 1.5))
            now = time.monotonic()
            for due, agent in [r for r in restarts if r[0] <= now]:
                restarts.remove((due, agent))
                if agent.stopped:
                    agent.hang(False)
                else:
                    agent.start()
            choice = random.random()
            before = sum(actions.values())
            idle = [a for a in agents if a.alive() and not a.stopped]
            if choice < 0.45 and actions["agent killed"] < args.kills and idle:
                agent = random.choice(idle)
                agent.kill()
                restarts.append((now + random.uniform(0, 8), agent))
                actions["agent killed"] += 1
            elif choice < 0.9 and actions["coordinator killed"] < args.kills:
                coordinator.kill()
                coordinator.start()
                actions["coordinator killed"] += 1
            elif idle:
                agent = random.choice(idle)
                agent.hang(True)
                restarts.append((now + random.uniform(2, 8), agent))
                actions["agent hung"] += 1
            if sum(actions.values()) != before and sum(actions.values()) % 20 == 0:
                log(f"{dict(actions)}; {len(acknowledged)} jobs acknowledged")
        for _, agent in restarts:
            if agent.stopped:
                agent.hang(False)
            elif not agent.alive():
                agent.start()
        restarts.clear()
        while submit_thread.is_alive():
            time.sleep(0.5)
        log(f"chaos over: {dict(actions)}; {len(acknowledged)} acknowledged; waiting for every job to end")
        pending = set(acknowledged)
        states, epochs = {}, {}
        deadline = time.monotonic() + 900
        last_log = time.monotonic()
        while pending and time.monotonic() < deadline:
            if time.monotonic() - last_log > 30:
                log(f"{len(pending)} jobs not ended yet")
                last_log = time.monotonic()
            for job_id in list(pending):
                try:
                    status, body = call(port, "GET", f"/v1/jobs/{job_id}", timeout=10)
                except OSError:
                    break
                if status == 404:
                    states[job_id] = ("lost", "")
                    pending.discard(job_id)
                elif status == 200 and body["state"] in TERMINAL:
                    states[job_id] = (body["state"], body.get("reason", ""))
                    pending.discard(job_id)
            if pending:
                time.sleep(1)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        for daemon in agents + [coordinator]:
            if daemon.stopped:
                daemon.hang(False)
            if daemon.alive():
                daemon.proc.terminate()
                try:
                    daemon.proc.wait(30)
                except subprocess.TimeoutExpired:
                    daemon.proc.kill()

    # The runs' own marks: per job, each epoch's span.
    spans = collections.defaultdict(dict)
    for name in os.listdir(marks):
        job_id, _, epoch = name.rpartition(".")
        times = [int(x) for x in open(os.path.join(marks, name)).read().split()]
        if times:
            spans[job_id][epoch] = (min(times), max(times))
    overlapping = []
    for job_id, runs in spans.items():
        ordered = sorted(runs.values())
        for (s1, e1), (s2, e2) in zip(ordered, ordered[1:]):
            if s2 < e1:
                overlapping.append({"job": job_id, "overlap_ms": (e1 - s2) / 1e6})
    ended = collections.Counter(state for state, _ in states.values())
    reasons = collections.Counter(reason[:90] for state, reason in states.values() if state != "succeeded")
    summary = {
        "jobs_acknowledged": len(acknowledged),
        "actions": dict(actions),
        "seconds": round(elapsed, 1),
        "not_acknowledged": dict(refused),
        "lost": ended.get("lost", 0),
        "unfinished": len(pending),
        "ended": dict(ended),
        "reasons_other_than_success": dict(reasons.most_common(10)),
        "ran_more_than_once": sum(1 for runs in spans.values() if len(runs) > 1),
        "never_ran": sum(1 for j in acknowledged if j not in spans),
        "runs_at_the_same_moment": len(overlapping),
        "overlaps": sorted(overlapping, key=lambda o: -o["overlap_ms"])[:20],
        "load": {"start": load_start, "end": os.getloadavg()[0]},
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    bad = summary["lost"] or summary["unfinished"] or overlapping
    if bad:
        log(f"kept {root} for inspection")
    else:
        shutil.rmtree(root, ignore_errors=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
