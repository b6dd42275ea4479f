#!/usr/bin/env python3
"""cluster_agents.py: one real coordinator jouled and N real jouled agents on loopback.

Starts the coordinator and the agents (each its own state dir, port 0, one simulated device of
jetson-orin, raspberry-pi-4, server-gpu or laptop-cpu in turn, probing off, 40 simulated probes),
waits until GET /v1/nodes shows every agent ready with its model at the coordinator, samples the
idle coordinator, submits --single jobs one at a time (each after the previous one ended: latency
without a queue), then --jobs training jobs (an MLP spec, so min-energy placement uses the agents'
estimates) from --submitters keep-alive connections as fast as answers come back, waits for every
job to end, and reports:

  * placement and completion throughput (jobs placed / ended per second, from the coordinator's
    own event times),
  * submit->placed, submit->running (the agent's start time) and submit->ended-as-recorded
    latencies, and the HTTP submit call's latency (p50/p90/p99/max),
  * the coordinator's CPU seconds and RSS (/proc/PID/stat and status) idle and during the run,
    the agents' CPU, and other processes' CPU (the machine is shared),
  * where the jobs went (per profile).

Prints a table and writes --json. Every process it started is stopped on every exit (Ctrl-C and
the --limit watchdog included): the jouleds with TERM then KILL, then any job process still
carrying this run's marker in its environment (BENCH_RUN_MARKER, set in each job's run.env) with
KILL; the temp dir goes unless --keep. Every joule is simulated. See bench/README.md, "Cluster".
"""

import argparse
import http.client
import json
import urllib.parse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime

PROFILES = ["jetson-orin", "raspberry-pi-4", "server-gpu", "laptop-cpu"]
TICK = os.sysconf("SC_CLK_TCK")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--agents", type=int, default=50)
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--command", default="true", help="the jobs' shell command (default: true)")
    p.add_argument("--plain", action="store_true",
                   help="jobs without a model spec (no estimate anywhere) instead of the MLP training job")
    p.add_argument("--submitters", type=int, default=8, help="concurrent keep-alive submit connections")
    p.add_argument("--heartbeat", type=float, default=1.0)
    p.add_argument("--lost-after", type=float, default=30.0)
    p.add_argument("--idle", type=float, default=10.0, help="seconds of the idle sample, agents ready, no jobs")
    p.add_argument("--jouled", default=os.path.join(os.path.dirname(__file__), "..", "build", "daemon", "jouled"))
    p.add_argument("--log-level", default="info")
    p.add_argument("--json", default="", help="write the results here")
    p.add_argument("--single", type=int, default=20,
                   help="jobs submitted one at a time, each after the previous ended, before the burst")
    p.add_argument("--wait-quiet", type=float, default=0.0,
                   help="wait up to this many seconds for other processes to use < 10%% of the CPUs first")
    p.add_argument("--limit", type=float, default=600.0, help="watchdog: stop everything after this many seconds")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, state)")
    p.add_argument("--export-models", default="",
                   help="write each profile's energy-model snapshot to DIR/<profile>.json once the agents are "
                        "ready (for cluster_nodes_bench --models DIR)")
    return p.parse_args()


# ---------------------------------------------------------------- processes


class Run:
    """Everything this run started, so that every exit stops it."""

    def __init__(self, keep):
        self.dir = tempfile.mkdtemp(prefix="joule-cluster-agents-")
        # Run as root, jouled starts each job as an account of its own, which must reach the
        # jobs' directories under this one (mkdtemp makes it 0700).
        os.chmod(self.dir, 0o755)
        self.keep = keep
        self.marker = uuid.uuid4().hex
        self.procs = []  # (name, Popen)
        self.lock = threading.Lock()
        self.cleaned = False
        # The binary is copied once: a rebuild of build/ during the run changes nothing here.
        self.jouled = os.path.join(self.dir, "jouled")
        shutil.copy2(ARGS.jouled, self.jouled)

    def start_jouled(self, name, config):
        d = os.path.join(self.dir, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "jouled.toml"), "w") as f:
            f.write(config)
        log = open(os.path.join(d, "jouled.log"), "w")
        proc = subprocess.Popen(
            [self.jouled, "--config", os.path.join(d, "jouled.toml"), "--state-dir", d, "--listen", "127.0.0.1:0"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        with self.lock:
            self.procs.append((name, proc))
        return proc

    def log_of(self, name):
        try:
            with open(os.path.join(self.dir, name, "jouled.log")) as f:
                return f.read()
        except OSError:
            return ""

    def job_pids(self):
        """Processes whose environment carries this run's marker (jobs outlive jouled by design)."""
        needle = ("BENCH_RUN_MARKER=" + self.marker).encode()
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read():
                        out.append(int(entry))
            except OSError:
                pass
        return out

    def cleanup(self):
        with self.lock:
            if self.cleaned:
                return
            self.cleaned = True
            procs = list(self.procs)
        for _, proc in procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.time() + 10
        for _, proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in self.job_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            print(f"kept {self.dir}")


def port_of(run, name, timeout=30):
    pattern = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = pattern.search(run.log_of(name))
        if m:
            return int(m.group(1))
        time.sleep(0.05)
    raise RuntimeError(f"{name} did not say where it listens:\n{run.log_of(name)[-2000:]}")


def proc_sample(pid, children=False):
    """(cpu seconds, VmRSS MB, VmHWM MB) of a process (with children: of its ended children, the
    jobs an agent ran and reaped), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[13]) + int(fields[14]) if children else int(fields[11]) + int(fields[12])) / TICK
        rss = hwm = 0.0
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) / 1024
        return cpu, rss, hwm
    except (OSError, IndexError, ValueError):
        return None


def machine_cpu():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / TICK, sum(v) / TICK


class Sampler(threading.Thread):
    """CPU and RSS of the coordinator, the agents together, their jobs, this driver and everything
    else, every 0.5 s."""

    def __init__(self, coordinator_pid, agent_pids):
        super().__init__(daemon=True)
        self.coordinator = coordinator_pid
        self.agents = agent_pids
        self.rows = []
        self.stop_flag = threading.Event()

    def snapshot(self):
        c = proc_sample(self.coordinator)
        agents = sum((proc_sample(p) or (0, 0, 0))[0] for p in self.agents)
        jobs = sum((proc_sample(p, children=True) or (0, 0, 0))[0] for p in self.agents)
        driver = sum(os.times()[:2])
        busy, total = machine_cpu()
        return {"t": time.time(), "coord_cpu": c[0] if c else 0, "coord_rss": c[1] if c else 0,
                "coord_hwm": c[2] if c else 0, "agents_cpu": agents, "jobs_cpu": jobs, "driver_cpu": driver,
                "busy": busy, "total": total}

    def run(self):
        while not self.stop_flag.wait(0.5):
            self.rows.append(self.snapshot())


def window(a, b, cpus):
    """CPU use between two snapshots: seconds and % of one core for the coordinator, the agents,
    their jobs and this driver; % of all CPUs for everything else."""
    wall = b["t"] - a["t"]
    used = {k: b[k] - a[k] for k in ("coord_cpu", "agents_cpu", "jobs_cpu", "driver_cpu")}
    all_busy = b["busy"] - a["busy"]
    all_total = b["total"] - a["total"]
    others = max(0.0, all_busy - sum(used.values())) / all_total * 100 if all_total > 0 else 0
    return {"seconds": wall, "coordinator_cpu_seconds": used["coord_cpu"],
            "coordinator_cpu_percent": 100 * used["coord_cpu"] / wall,
            "agents_cpu_seconds": used["agents_cpu"], "agents_cpu_percent": 100 * used["agents_cpu"] / wall,
            "jobs_cpu_seconds": used["jobs_cpu"], "driver_cpu_seconds": used["driver_cpu"],
            "driver_cpu_percent": 100 * used["driver_cpu"] / wall,
            "others_percent_of_all": others, "cpus": cpus}


# ---------------------------------------------------------------- HTTP


def call(port, method, path, body=None, timeout=30):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        return r.status, json.loads(data) if data else None
    finally:
        conn.close()


def all_nodes(port):
    """Every node GET /v1/nodes lists, page after page (100 a page)."""
    out, path = [], "/v1/nodes"
    while True:
        _, page = call(port, "GET", path)
        out += (page or {}).get("nodes", [])
        if not page or not page.get("next"):
            return out
        path = "/v1/nodes?after=" + urllib.parse.quote(page["next"])


def training_job(name, command, marker):
    """The MLP of tests/integration/cluster_test.cpp: the Jetson Orin is far cheaper than the server GPU."""
    if ARGS.plain:
        return {"name": name, "run": {"command": ["sh", "-c", command], "env": {"BENCH_RUN_MARKER": marker}}}
    return {"name": name,
            "model": {"input": {"shape": [784]},
                      "layers": [{"type": "linear", "out_features": 256}, {"type": "relu"},
                                 {"type": "linear", "out_features": 10}],
                      "loss": "cross_entropy"},
            "training": {"batch_size": 64, "epochs": 1, "samples_per_epoch": 6400},
            "run": {"command": ["sh", "-c", command], "env": {"BENCH_RUN_MARKER": marker}}}


def rfc3339_ms(text):
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000.0


def pct(values, p):
    """Nearest-rank percentile; None when empty."""
    if not values:
        return None
    s = sorted(values)
    rank = max(1, min(len(s), int(-(-p * len(s) // 100))))
    return s[rank - 1]


def dist(values):
    return {"n": len(values), "p50": pct(values, 50), "p90": pct(values, 90), "p99": pct(values, 99),
            "max": pct(values, 100), "mean": statistics.fmean(values) if values else None}


def ms(v):
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


# ---------------------------------------------------------------- the run


def main():
    run = Run(ARGS.keep)
    watchdog = threading.Timer(ARGS.limit, lambda: (print(f"watchdog: {ARGS.limit:.0f} s are over; stopping",
                                                          file=sys.stderr), run.cleanup(), os._exit(124)))
    watchdog.daemon = True
    watchdog.start()

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        return bench(run)
    except KeyboardInterrupt as e:
        print(f"interrupted ({e}); stopping", file=sys.stderr)
        return 130
    finally:
        run.cleanup()
        watchdog.cancel()
        left = run.job_pids()
        alive = [p.pid for _, p in run.procs if p.poll() is None]
        if left or alive:
            print(f"warning: still alive after cleanup: jouleds {alive}, jobs {left}", file=sys.stderr)


def wait_quiet(limit):
    """Waits until the machine is below 10 % busy over 3 s, for at most `limit` s; returns the last busy %."""
    deadline = time.time() + limit
    while True:
        a = machine_cpu()
        time.sleep(3)
        b = machine_cpu()
        busy = 100 * (b[0] - a[0]) / max(1e-9, b[1] - a[1])
        if busy < 10 or time.time() >= deadline:
            return busy


def job_times(port, ids):
    """Each job's latencies from the coordinator's own records (read after the runs: not measured)."""
    out = {"placed": [], "running": [], "ended": [], "t_submitted": [], "t_placed": [], "t_ended": [],
           "states": {}, "where": {}, "queued_again": 0}
    for job_id in ids:
        _, job = call(port, "GET", f"/v1/jobs/{job_id}")
        out["states"][job["state"]] = out["states"].get(job["state"], 0) + 1
        submitted = rfc3339_ms(job["submitted_at"])
        out["t_submitted"].append(submitted)
        first_placed = next((e for e in job["events"] if e["state"] == "placed"), None)
        out["queued_again"] += sum(1 for e in job["events"] if "queued again" in e["message"])
        if first_placed:
            out["placed"].append(rfc3339_ms(first_placed["at"]) - submitted)
            out["t_placed"].append(rfc3339_ms(first_placed["at"]))
        if job.get("started_at"):
            out["running"].append(rfc3339_ms(job["started_at"]) - submitted)
        if job.get("finished_at"):
            out["ended"].append(rfc3339_ms(job["finished_at"]) - submitted)
            out["t_ended"].append(rfc3339_ms(job["finished_at"]))
        profile = (job.get("device") or "-").split("sim:")[-1]
        out["where"][profile] = out["where"].get(profile, 0) + 1
    return out


def export_models(run, directory):
    """Each profile's model as its first agent stored it (the snapshot an agent uploads)."""
    import sqlite3
    os.makedirs(directory, exist_ok=True)
    for i, profile in enumerate(PROFILES[:ARGS.agents]):
        db = sqlite3.connect(f"file:{os.path.join(run.dir, f'agent-{i:02d}', 'jouled.db')}?mode=ro", uri=True)
        row = db.execute("SELECT snapshot FROM model_snapshots WHERE device = ? ORDER BY version DESC LIMIT 1",
                         (f"sim:{profile}",)).fetchone()
        db.close()
        if row:
            with open(os.path.join(directory, f"{profile}.json"), "w") as f:
                f.write(row[0])
    print(f"models written to {directory}")


def bench(run):
    cpus = os.cpu_count()
    if ARGS.wait_quiet > 0:
        busy = wait_quiet(ARGS.wait_quiet)
        print(f"machine {busy:.0f} % busy before the start")
    t_start = time.time()
    coordinator = run.start_jouled("coordinator", f"""[node]
name = "coord"
[server]
max_queued_jobs = 1000000
[log]
level = "{ARGS.log_level}"
[cluster]
role = "coordinator"
heartbeat_seconds = {ARGS.heartbeat}
lost_after_seconds = {ARGS.lost_after}
[[devices]]
name = "sim:laptop-cpu"
probes = 40
runs_jobs = false
[probing]
enabled = false
""")
    port = port_of(run, "coordinator")
    print(f"coordinator: http://127.0.0.1:{port} (pid {coordinator.pid}); starting {ARGS.agents} agents")
    agents = []
    for i in range(ARGS.agents):
        profile = PROFILES[i % len(PROFILES)]
        agents.append(run.start_jouled(f"agent-{i:02d}", f"""[node]
name = "agent-{i:02d}"
[log]
level = "{ARGS.log_level}"
[cluster]
role = "agent"
coordinator = "http://127.0.0.1:{port}"
[[devices]]
name = "sim:{profile}"
probes = 40
runs_jobs = true
[probing]
enabled = false
"""))

    # Every agent ready, with its model at the coordinator.
    deadline = time.time() + 180
    ready = 0
    while time.time() < deadline:
        ready = sum(1 for n in all_nodes(port)
                    if n["state"] == "ready" and n["devices"]
                    and all(d.get("model", {}).get("state") == "ready" for d in n["devices"]))
        if ready == ARGS.agents:
            break
        for _, proc in run.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a jouled exited (code {proc.returncode}) during start-up")
        time.sleep(0.25)
    if ready != ARGS.agents:
        raise RuntimeError(f"only {ready} of {ARGS.agents} agents ready after 180 s")
    startup = time.time() - t_start
    print(f"{ARGS.agents} agents ready with models after {startup:.1f} s")
    if ARGS.export_models:
        export_models(run, ARGS.export_models)

    sampler = Sampler(coordinator.pid, [a.pid for a in agents])
    # Idle: agents long-polling, nothing to run.
    time.sleep(2)
    idle_a = sampler.snapshot()
    time.sleep(ARGS.idle)
    idle_b = sampler.snapshot()
    idle = window(idle_a, idle_b, cpus)
    idle["coordinator_rss_mb"] = idle_b["coord_rss"]
    _, nodes = call(port, "GET", "/v1/nodes")
    t0 = time.perf_counter()
    call(port, "GET", "/v1/nodes")
    nodes_ms = (time.perf_counter() - t0) * 1000
    print(f"idle: coordinator {idle['coordinator_cpu_percent']:.2f} % of one core, RSS "
          f"{idle['coordinator_rss_mb']:.1f} MB; agents {idle['agents_cpu_percent']:.1f} % together; "
          f"GET /v1/nodes {nodes_ms:.1f} ms")

    # One job at a time, each after the previous ended: latencies without a queue.
    single_ids, single_http = [], []
    for n in range(ARGS.single):
        start = time.perf_counter()
        status, body = call(port, "POST", "/v1/jobs", training_job(f"single-{n}", ARGS.command, run.marker))
        single_http.append((time.perf_counter() - start) * 1000)
        if status != 201:
            raise RuntimeError(f"single submission refused: HTTP {status}: {body}")
        single_ids.append(body["id"])
        until = time.time() + 30
        while time.time() < until and call(port, "GET", f"/v1/jobs/{body['id']}")[1]["state"] not in (
                "succeeded", "failed", "cancelled"):
            time.sleep(0.02)
    single = job_times(port, single_ids)
    time.sleep(1)

    # Submissions, as fast as answers come back.
    sampler.start()
    before = sampler.snapshot()
    submits = []  # (id, t_call_start, latency ms)
    failures = []
    lock = threading.Lock()
    counter = iter(range(ARGS.jobs))

    def submitter():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while True:
            with lock:
                n = next(counter, None)
            if n is None:
                break
            body = json.dumps(training_job(f"bench-{n}", ARGS.command, run.marker))
            start = time.perf_counter()
            try:
                conn.request("POST", "/v1/jobs", body=body, headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                with lock:
                    failures.append(str(e))
                continue
            latency = (time.perf_counter() - start) * 1000
            with lock:
                if r.status == 201:
                    submits.append((json.loads(data)["id"], start, latency))
                else:
                    failures.append(f"HTTP {r.status}: {data[:200]!r}")
        conn.close()

    t_submit0 = time.perf_counter()
    threads = [threading.Thread(target=submitter) for _ in range(ARGS.submitters)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    submit_seconds = time.perf_counter() - t_submit0
    print(f"submitted {len(submits)} jobs in {submit_seconds:.2f} s ({len(failures)} failed)")

    # Until every job has ended.
    terminal = ("succeeded", "failed", "cancelled")
    deadline = time.time() + max(120, ARGS.jobs * 2)
    ended = 0
    while time.time() < deadline:
        ended = sum(call(port, "GET", f"/v1/jobs?state={s}&limit=1")[1]["total"] for s in terminal) - len(single_ids)
        if ended >= len(submits):
            break
        time.sleep(0.2)
    after = sampler.snapshot()
    sampler.stop_flag.set()
    sampler.join()
    during = window(before, after, cpus)
    during["coordinator_rss_mb_end"] = after["coord_rss"]
    during["coordinator_rss_mb_max_sampled"] = max([r["coord_rss"] for r in sampler.rows] + [after["coord_rss"]])
    during["coordinator_vmhwm_mb"] = after["coord_hwm"]
    if ended < len(submits):
        print(f"warning: only {ended} of {len(submits)} jobs ended in time", file=sys.stderr)

    times = job_times(port, [job_id for job_id, _, _ in submits])
    placed, running, ended_lat = times["placed"], times["running"], times["ended"]
    t_submitted, t_placed, t_ended = times["t_submitted"], times["t_placed"], times["t_ended"]
    states, where, queued_again = times["states"], times["where"], times["queued_again"]

    def rate(times):
        span = (max(times) - min(t_submitted)) / 1000 if times and t_submitted else 0
        return (len(times) / span if span > 0 else None), span

    placed_rate, placed_span = rate(t_placed)
    ended_rate, ended_span = rate(t_ended)
    http_ms = [lat for _, _, lat in submits]
    result = {
        "benchmark": "cluster_agents",
        "agents": ARGS.agents, "jobs": ARGS.jobs, "command": ARGS.command, "submitters": ARGS.submitters,
        "heartbeat_seconds": ARGS.heartbeat, "lost_after_seconds": ARGS.lost_after, "cpus": cpus,
        "jouled": os.path.realpath(ARGS.jouled),
        "jouled_mtime": datetime.fromtimestamp(os.path.getmtime(ARGS.jouled)).isoformat(timespec="seconds"),
        "startup_seconds": startup,
        "idle": idle, "idle_get_nodes_ms": nodes_ms,
        "submitted": len(submits), "submit_failures": failures[:10], "submit_failure_count": len(failures),
        "submit_seconds": submit_seconds, "submits_per_second": len(submits) / submit_seconds,
        "placed_per_second": placed_rate, "placed_span_seconds": placed_span,
        "ended_per_second": ended_rate, "ended_span_seconds": ended_span,
        "submit_http_ms": dist(http_ms), "submit_to_placed_ms": dist(placed),
        "submit_to_running_ms": dist(running), "submit_to_ended_ms": dist(ended_lat),
        "states": states, "placements_by_profile": where, "queued_again": queued_again,
        "during_run": during,
        "single": {"jobs": ARGS.single, "submit_http_ms": dist(single_http),
                   "submit_to_placed_ms": dist(single["placed"]), "submit_to_running_ms": dist(single["running"]),
                   "submit_to_ended_ms": dist(single["ended"]), "states": single["states"],
                   "placements_by_profile": single["where"]},
        "timeline": [{"at": r["t"] - sampler.rows[0]["t"], "coordinator_cpu_seconds": r["coord_cpu"] - sampler.rows[0]["coord_cpu"],
                      "coordinator_rss_mb": r["coord_rss"], "agents_cpu_seconds": r["agents_cpu"] - sampler.rows[0]["agents_cpu"]}
                     for r in sampler.rows],
    }

    print()
    print(f"{ARGS.agents} agents ({', '.join(PROFILES)} in turn), {len(submits)} jobs `{ARGS.command}` "
          f"from {ARGS.submitters} connections; {cpus} CPUs")
    print()
    print("| figure | value |")
    print("|---|---:|")
    print(f"| submissions acknowledged / s (HTTP 201) | {result['submits_per_second']:.0f} |")
    print(f"| jobs placed / s (first submit → last placement, {placed_span:.1f} s) | "
          f"{placed_rate or 0:.1f} |")
    print(f"| jobs ended / s (first submit → last end recorded, {ended_span:.1f} s) | {ended_rate or 0:.1f} |")
    print(f"| coordinator CPU during the run | {during['coordinator_cpu_seconds']:.2f} s "
          f"({during['coordinator_cpu_percent']:.0f} % of one core) |")
    print(f"| coordinator RSS end / VmHWM | {during['coordinator_rss_mb_end']:.1f} / "
          f"{during['coordinator_vmhwm_mb']:.1f} MB |")
    print(f"| {ARGS.agents} agents' CPU during the run | {during['agents_cpu_seconds']:.2f} s "
          f"({during['agents_cpu_percent']:.0f} % of one core) |")
    print(f"| their jobs' CPU (reaped children) | {during['jobs_cpu_seconds']:.2f} s |")
    print(f"| this driver's CPU (submits, 201 parsing, polling) | {during['driver_cpu_seconds']:.2f} s "
          f"({during['driver_cpu_percent']:.0f} % of one core) |")
    print(f"| others (% of all CPUs) | {during['others_percent_of_all']:.1f} |")
    print(f"| coordinator idle, {ARGS.agents} agents polling | {idle['coordinator_cpu_percent']:.2f} % of one core, "
          f"{idle['coordinator_rss_mb']:.1f} MB |")
    print()
    print("| latency, ms | n | p50 | p90 | p99 | max |")
    print("|---|---:|---:|---:|---:|---:|")
    for what, source in ((f"one at a time", result["single"]), (f"burst of {len(submits)}", result)):
        for label, key in (("HTTP submit (201)", "submit_http_ms"), ("submit → placed", "submit_to_placed_ms"),
                           ("submit → running (agent's start)", "submit_to_running_ms"),
                           ("submit → ended (recorded)", "submit_to_ended_ms")):
            d = source[key]
            print(f"| {what}: {label} | {d['n']} | {ms(d['p50'])} | {ms(d['p90'])} | {ms(d['p99'])} | {ms(d['max'])} |")
    print()
    print(f"one at a time: {result['single']['states']}, by profile {result['single']['placements_by_profile']}")
    print(f"burst: {states}; placements by profile: {where}; queued again: {queued_again}")
    if during["others_percent_of_all"] > 10:
        print(f"note: other processes used {during['others_percent_of_all']:.0f} % of the CPUs: a disturbed run")
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {ARGS.json}")
    return 0 if ended >= len(submits) and not failures else 1


ARGS = parse_args()
if __name__ == "__main__":
    sys.exit(main())
