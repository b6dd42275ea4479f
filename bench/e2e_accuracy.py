#!/usr/bin/python3
"""e2e_accuracy.py: estimates of real PyTorch training jobs run through jouled, from an empty state.

    /usr/bin/python3 bench/e2e_accuracy.py --json /tmp/e2e.json          # ~45 min: 600 s probing, 18 jobs
    /usr/bin/python3 bench/e2e_accuracy.py --quick                        # ~5 min smoke test
    /usr/bin/python3 bench/e2e_accuracy.py --calibrate                    # seconds per step, to size the jobs

Run with Debian's /usr/bin/python3 (python3-torch): the networks are traced with joule.spec here
and trained by the jobs. What it does, in order (bench/README.md, "End-to-end accuracy"):

  1. copies build/daemon/jouled and build/worker/joule-worker into a temp dir and starts that
     jouled on 127.0.0.1:0 with an empty state dir, one real `cpu` device (meter auto: the
     `modelled` meter where there is no RAPL, and the report says which, from GET /v1/devices)
     with `threads = T`, background probing enabled, and a clean environment (no OMP_*/MKL_*/
     OPENBLAS_* of ours: the jobs' thread count comes from jouled);
  2. POST /v1/probes once: --probe-seconds (600) on cpu, naming every network x batch of the
     benchmark as the workload, and waits for the run to end and the model to hold its samples
     (--more-probing S: further requested runs until every job would have an estimate or S more
     seconds are spent; beyond the issue's 10 minutes, and reported so);
  3. runs every network x batch as a real job through jouled, one after the other (each
     submitted when the previous one has ended): `/usr/bin/python3 bench/e2e/train.py --net N
     --batch-size B --epochs E --samples S`, its `training` block saying exactly that, with the
     spec traced from the same nn.Module; records the estimate the 201 answer carried (made at
     submit; after 5 finished jobs jouled corrects it, `raw_joules` keeping the model's figure),
     the metered energy and its source, the job's own timings and CPU (its E2E_RESULT line);
     right after each job, measures the same network x batch with `joule-worker measure
     --threads T` (joules/step x the job's steps): "the estimate against the worker's own
     measurement", apart from "against the real job";
  4. reads GET /v1/devices (model samples per kind, the outcome calibration: rows, leave-one-out
     error before/after correction, 2-sigma coverage before/after), stops jouled;
  5. prints a table and summaries per set: "tuning" networks may inform the estimator's design,
     "held-out" ones never (bench/e2e/nets.py declares which), and writes everything to --json.

Every exit (the end, an error, Ctrl-C, SIGTERM, the --limit watchdog) cancels the jobs, stops
jouled, kills what is left of its jobs and probes, and removes the temp dir (unless --keep).
"""

import argparse
import collections
import hashlib
import json
import math
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
E2E = os.path.join(HERE, "e2e")
TRAIN = os.path.join(E2E, "train.py")
PYTHON_PACKAGE = os.path.join(REPO, "python")
LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
ENDED = ("succeeded", "failed", "cancelled")
QUICK_NETWORKS = ("lenet", "mlp", "resnet")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jouled", default=os.path.join(REPO, "build", "daemon", "jouled"))
    p.add_argument("--worker", default=os.path.join(REPO, "build", "worker", "joule-worker"))
    p.add_argument("--python", default="/usr/bin/python3", help="the jobs' interpreter (needs torch)")
    p.add_argument("--threads", type=int, default=2, help="[[devices]] threads of cpu: probes, jobs, measure")
    p.add_argument("--probe-seconds", type=float, default=None, help="the requested probe run (600; at most 600)")
    p.add_argument("--more-probing", type=float, default=0.0,
                   help="after the probe run, request further runs (600 s each, this many seconds in all) until "
                        "every job would have an estimate; beyond the issue's 10 minutes, and reported so")
    p.add_argument("--networks", default="", help="comma-separated subset of bench/e2e/nets.py (default all)")
    p.add_argument("--batches", default=None, help="comma-separated batch sizes (16,64)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every job's steps (nets.STEPS)")
    p.add_argument("--job-timeout", type=float, default=300.0, help="a job running longer is cancelled")
    p.add_argument("--no-measure", action="store_true", help="skip the joule-worker measurements")
    p.add_argument("--reference", default="lenet:16",
                   help="NETWORK:BATCH measured with joule-worker measure after every job, interleaved with the jobs: "
                        "the machine's own noise (the same reference measured again and again) beside every error; "
                        "'' for none")
    p.add_argument("--measure-min-reading", type=float, default=0.5,
                   help="joule-worker measure --min-reading-seconds (5 readings, median)")
    p.add_argument("--wait-quiet", type=float, default=0.0,
                   help="wait up to this many seconds for the machine to be under 25 %% busy first")
    p.add_argument("--analyse", metavar="JSON",
                   help="analyse and report a run saved with --json again (no jouled, no jobs)")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke test: 60 s of probing, {', '.join(QUICK_NETWORKS)} at batch 16, 10-s jobs")
    p.add_argument("--limit", type=float, default=3000.0, help="watchdog: stop everything after this many seconds")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (config, logs, SQLite state, specs)")
    p.add_argument("--json", default="", help="write every figure here")
    p.add_argument("--calibrate", action="store_true",
                   help="only time each network x batch at --threads in a fresh process and print job sizes")
    p.add_argument("--target-seconds", type=float, default=None,
                   help="training seconds of every job, from a timing of each network x batch at the start "
                        "(and for --calibrate: 30); default: --lengths")
    p.add_argument("--lengths", default="20,35,55",
                   help="training seconds per job, taken in turn (network i at batch j gets length i + j): jobs "
                        "of one length cannot tell a per-job start-up from a per-step scale, so jouled's "
                        "overhead line needs several")
    p.add_argument("--fixed-steps", action="store_true",
                   help="job sizes from bench/e2e/nets.py STEPS (x --scale) instead of a timing at the start")
    p.add_argument("--quiet-wait", type=float, default=300.0,
                   help="--calibrate: wait up to this long for a quiet machine before each timing")
    args = p.parse_args(argv)
    if args.quick:
        args.probe_seconds = 60.0 if args.probe_seconds is None else args.probe_seconds
        args.networks = args.networks or ",".join(QUICK_NETWORKS)
        args.batches = args.batches or "16"
        args.target_seconds = 10.0 if args.target_seconds is None else args.target_seconds
        if args.scale == 1.0 and args.fixed_steps:
            args.scale = 1.0 / 3.0
    args.probe_seconds = 600.0 if args.probe_seconds is None else args.probe_seconds
    args.batches = args.batches or "16,64"
    if args.target_seconds is not None:
        args.lengths = [args.target_seconds]
    else:
        try:
            args.lengths = [float(x) for x in args.lengths.split(",") if x.strip()]
        except ValueError:
            p.error(f"--lengths: {args.lengths!r} is not a comma-separated list of seconds")
        if not args.lengths or min(args.lengths) <= 0:
            p.error("--lengths needs at least one length above 0 s")
        args.target_seconds = 30.0 if args.calibrate else None
    if not 0 < args.probe_seconds <= 600:
        p.error("--probe-seconds must be in (0, 600]")
    return args


def log(message):
    print(f"[e2e {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------- the machine

def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def cpu_ticks():
    """(busy, total) jiffies of the whole machine from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
    return busy, busy + v[3] + v[4]


def proc_cpu_seconds(pid):
    """utime+stime+cutime+cstime of a process in seconds, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(fields[i]) for i in (11, 12, 13, 14)) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Window:
    """Load and CPU of the machine over one phase."""

    def __init__(self, name):
        self.name = name
        self.t0 = time.time()
        self.load0 = loadavg()
        self.busy0, self.total0 = cpu_ticks()

    def close(self, **extra):
        busy, total = cpu_ticks()
        hz = os.sysconf("SC_CLK_TCK")
        wall = time.time() - self.t0
        out = {"phase": self.name, "seconds": round(wall, 1), "loadavg_start": self.load0, "loadavg_end": loadavg(),
               "busy_cpus": round((busy - self.busy0) / hz / max(wall, 1e-9), 2), "cpus": os.cpu_count()}
        out.update(extra)
        return out


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def wait_quiet(seconds):
    """Waits until the machine is under 25 % busy over 5 s, at most `seconds`; the last share."""
    start = time.time()
    said = 0.0
    while True:
        b0, _ = cpu_ticks()
        time.sleep(5)
        b1, _ = cpu_ticks()
        share = (b1 - b0) / os.sysconf("SC_CLK_TCK") / 5 / os.cpu_count()
        waited = time.time() - start
        if share < 0.25 or waited >= seconds:
            log(f"machine {100 * share:.0f} % busy after {waited:.0f} s"
                + (" (gave up waiting)" if share >= 0.25 else ""))
            return share
        if waited - said >= 60 or not said:
            said = waited
            log(f"machine {100 * share:.0f} % busy; waiting (up to {seconds:.0f} s)")


def readable_by_others(path):
    """Problems that keep another account from reading `path` (o+x on every directory above it)."""
    problems = []
    path = os.path.abspath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts)):
        d = os.sep.join(parts[:i]) or os.sep
        if not os.stat(d).st_mode & 0o001:
            problems.append(f"{d} is not o+x")
    if not os.stat(path).st_mode & 0o004:
        problems.append(f"{path} is not o+r")
    return problems


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def git(*args):
    try:
        return subprocess.run(["git", "-C", REPO] + list(args), capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# ---------------------------------------------------------------- jouled

class ApiError(Exception):
    pass


class Session:
    """The temp dir, the jouled copy, its children; cleanup() is safe to call twice and from any thread."""

    def __init__(self, args):
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="joule-e2e-")
        os.chmod(self.dir, 0o755)  # jobs run as accounts of their own: their dirs are under this one
        self.marker = uuid.uuid4().hex
        self.bin = os.path.join(self.dir, "bin")
        os.makedirs(self.bin)
        self.jouled = os.path.join(self.bin, "jouled")
        self.worker = os.path.join(self.bin, "joule-worker")
        shutil.copy2(args.jouled, self.jouled)
        shutil.copy2(args.worker, self.worker)
        self.state = os.path.join(self.dir, "state")
        self.workdir = os.path.join(self.dir, "work")
        os.makedirs(self.workdir)
        os.chmod(self.workdir, 0o755)
        self.specs = os.path.join(self.dir, "specs")
        os.makedirs(self.specs)
        self.log_path = os.path.join(self.dir, "jouled.log")
        self.config = os.path.join(self.dir, "jouled.toml")
        self.proc = None
        self.port = None
        self.child = None  # a joule-worker measure running now
        self.job_ids = []
        self.lock = threading.RLock()
        self.cleaned = False

    def write_config(self):
        text = "\n".join([
            "[log]", 'level = "info"',
            "[[devices]]", 'name = "cpu"', 'meter = "auto"', f"threads = {self.args.threads}",
            # The runtime probe measures the interpreter the jobs run (their start-up, Python's per-step work).
            "[probing]", "enabled = true", f'worker = "{self.worker}"', f'python = "{self.args.python}"',
            "[jobs]", 'run_as = "per-job"',
        ]) + "\n"
        with open(self.config, "w") as f:
            f.write(text)
        return text

    def start(self):
        env = {k: v for k, v in os.environ.items()
               if not (k.startswith("OMP_") or k.startswith("MKL_") or k.startswith("OPENBLAS_")
                       or k.startswith("JOULE_") or k == "PYTHONPATH")}
        with self.lock:
            log_file = open(self.log_path, "wb")
            self.proc = subprocess.Popen([self.jouled, "--state-dir", self.state, "--listen", "127.0.0.1:0",
                                          "--config", self.config], stdout=log_file, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env)
            log_file.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = LISTENING.search(self.read_log())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        if not self.port:
            raise RuntimeError(f"jouled did not start (exit {self.proc.poll()}):\n{self.read_log()[-3000:]}")
        while time.monotonic() < deadline:
            try:
                self.call("GET", "/readyz")
                return
            except (ApiError, OSError):
                time.sleep(0.2)
        raise RuntimeError("jouled never became ready")

    def read_log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def call(self, method, path, body=None, timeout=60, raw=False):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                text = reply.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            raise ApiError(f"{method} {path}: HTTP {e.code}: {e.read().decode('utf-8', 'replace')[:2000]}")
        if raw:
            return text
        try:
            return json.loads(text)
        except ValueError:
            return text

    def cpu_device(self):
        for device in self.call("GET", "/v1/devices")["devices"]:
            if device["name"] == "cpu":
                return device
        raise RuntimeError("jouled has no cpu device")

    def stored_samples(self):
        """Probe samples in jouled's SQLite state that a model keeps (positive joules and seconds)."""
        try:
            db = sqlite3.connect(f"file:{os.path.join(self.state, 'jouled.db')}?mode=ro", uri=True, timeout=10)
            try:
                # Networks measured whole are rows too, but not layer samples of the model.
                return db.execute("select count(*) from probe_samples where device = 'cpu' and joules_per_step > 0 "
                                  "and seconds_per_step > 0 and layer_key != 'whole-network'").fetchone()[0]
            finally:
                db.close()
        except sqlite3.Error:
            return None

    def probe_samples(self):
        """Every probe sample jouled stored (kept or not), in order, with its target."""
        out = []
        try:
            db = sqlite3.connect(f"file:{os.path.join(self.state, 'jouled.db')}?mode=ro", uri=True, timeout=10)
            try:
                for row in db.execute("select id, at_ms, layer_key, joules_per_step, seconds_per_step, source, detail "
                                      "from probe_samples where device = 'cpu' order by id"):
                    target = (json.loads(row[6]) or {}).get("target") or {}
                    out.append({"id": row[0], "at_ms": row[1], "key": row[2], "joules_per_step": row[3],
                                "seconds_per_step": row[4], "source": row[5], "batch": target.get("batch_size"),
                                "input_shape": target.get("input_shape"), "layer": target.get("layer")})
            finally:
                db.close()
        except (sqlite3.Error, ValueError):
            pass
        return out

    def our_pids(self):
        """Processes of this run: jobs (E2E_RUN=marker in their environment) and the worker copy."""
        needle = ("E2E_RUN=" + self.marker).encode()
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                if os.readlink(f"/proc/{entry}/exe").startswith(self.bin + os.sep):
                    out.append(int(entry))
                    continue
            except OSError:
                pass
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read():
                        out.append(int(entry))
            except OSError:
                pass
        return out

    def stop_jouled(self):
        with self.lock:
            if self.proc and self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()

    def cleanup(self):
        with self.lock:
            if self.cleaned:
                return
            self.cleaned = True
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
            self.child.wait()
        if self.proc and self.proc.poll() is None:
            for job_id in self.job_ids:  # cancel what still runs (TERM, then KILL after the grace)
                try:
                    job = self.call("GET", f"/v1/jobs/{job_id}", timeout=5)
                    if job.get("state") not in ENDED:
                        self.call("DELETE", f"/v1/jobs/{job_id}", timeout=5)
                except Exception:  # noqa: BLE001 - stopping anyway
                    pass
        self.stop_jouled()
        for _ in range(2):
            pids = self.our_pids()
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if not pids:
                break
            time.sleep(0.5)
        if self.args.keep:
            log(f"kept {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------- networks and jobs

def load_nets():
    sys.path.insert(0, E2E)
    sys.path.insert(0, PYTHON_PACKAGE)
    import nets  # noqa: E402
    return nets


def plan(args, nets, timings=None):
    names = [n.strip() for n in args.networks.split(",") if n.strip()] or list(nets.NETWORKS)
    unknown = [n for n in names if n not in nets.NETWORKS]
    if unknown:
        raise SystemExit(f"unknown networks {unknown}; bench/e2e/nets.py has {sorted(nets.NETWORKS)}")
    if args.fixed_steps and any(n not in nets.STEPS for n in names):
        raise SystemExit(f"--fixed-steps: bench/e2e/nets.py STEPS has no sizes for "
                         f"{[n for n in names if n not in nets.STEPS]} (time them with --calibrate)")
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    rows = []
    # Every network at the first batch, then every network at the next: the outcome
    # calibration (which starts after 5 finished jobs) sees a mix of networks, not one at a time.
    for j, b in enumerate(batches):
        for i, name in enumerate(names):
            length = args.lengths[(i + j) % len(args.lengths)]
            if timings:
                # `length` seconds of training at the seconds per step timed just before
                steps = length / timings[name][b]
            elif name not in nets.STEPS:
                continue  # sized once timed (the plan before the timing only names the jobs)
            else:
                known = nets.STEPS[name]
                nearest = min(known, key=lambda k: abs(k - b))
                steps = known.get(b) or max(1, known[nearest] * nearest // b)  # the nearest batch's samples
            per_epoch = max(1, round(steps * args.scale / args.epochs))
            rows.append({"network": name, "set": nets.NETWORKS[name][2], "batch": b, "epochs": args.epochs,
                         "steps_per_epoch": per_epoch, "samples_per_epoch": per_epoch * b,
                         "steps": per_epoch * args.epochs,
                         "timed_seconds_per_step": timings[name][b] if timings else None,
                         "target_seconds": length if timings else None})
    return names, batches, rows


def specs_of(names, nets):
    import joule
    out = {}
    for name in names:
        model = nets.build(name)
        inputs, _ = nets.batch(name, 2)
        out[name] = joule.spec(model, inputs, name=name)
    return out


def training_of(row):
    return {"batch_size": row["batch"], "epochs": row["epochs"], "samples_per_epoch": row["samples_per_epoch"],
            "optimizer": "sgd"}


def wait_for_model(session, limit=300):
    """After a run ends, jouled refits: wait until the model it serves holds every kept sample."""
    deadline = time.time() + limit
    while time.time() < deadline:
        model = session.cpu_device().get("model", {})
        kept = session.stored_samples()
        if model.get("state") == "ready" and kept is not None and model.get("samples", 0) >= kept:
            return True
        time.sleep(1)
    log(f"WARNING: the model did not catch up with the stored samples in {limit} s")
    return False


def probe_run(session, seconds, models):
    """POST /v1/probes for `seconds` naming `models`; waits for the run's end and the refit."""
    run = session.call("POST", "/v1/probes", {"device": "cpu", "seconds": seconds, "models": models})
    log(f"probe run {run['id']}: {seconds:.0f} s on cpu, {len(models)} network x batch entries named")
    last = time.time()
    while True:
        time.sleep(2)
        run = session.call("GET", f"/v1/probes/{run['id']}")
        if run["state"] != "running":
            break
        if time.time() - last >= 60:
            last = time.time()
            log(f"  {run['probes']} probes, {run['probe_seconds']:.0f} s in probes, {run['failed']} failed; "
                f"load {loadavg()}")
    log(f"probe run {run['state']}: {run['message']}; {run['probes']} probes in {run['probe_seconds']:.1f} s")
    wait_for_model(session)
    return run


def missing_estimates(session, rows, specs):
    """The network/batch pairs POST /v1/estimate has no estimate for on cpu yet."""
    out = []
    for r in rows:
        answer = session.call("POST", "/v1/estimate", {"model": specs[r["network"]], "training": training_of(r),
                                                       "devices": ["cpu"]})
        est = cpu_estimate(answer.get("estimates"))
        if not est or est.get("status") != "ok":
            out.append(f"{r['network']}/{r['batch']}")
    return out


def cpu_estimate(estimates):
    if isinstance(estimates, list):
        for e in estimates:
            if e.get("device") == "cpu":
                return e
    return None


def run_job(session, args, row, spec):
    job = {"name": f"e2e-{row['network']}-b{row['batch']}", "model": spec, "training": training_of(row),
           "run": {"command": [args.python, TRAIN, "--net", row["network"], "--batch-size", str(row["batch"]),
                               "--epochs", str(row["epochs"]), "--samples", str(row["samples_per_epoch"])],
                   "workdir": session.workdir, "env": {"E2E_RUN": session.marker}},
           "constraints": {"devices": ["cpu"]}}
    row["command"] = job["run"]["command"]
    load0 = loadavg()
    busy0, _ = cpu_ticks()
    t0 = time.time()
    created = session.call("POST", "/v1/jobs", job)
    job_id = created["id"]
    session.job_ids.append(job_id)
    row["job_id"] = job_id
    row["estimate_at_submit"] = cpu_estimate(created.get("estimate"))
    timed_out = False
    while True:
        time.sleep(1.0)
        current = session.call("GET", f"/v1/jobs/{job_id}")
        if current["state"] in ENDED:
            break
        if time.time() - t0 > args.job_timeout and not timed_out:
            log(f"  {row['network']} b{row['batch']}: over --job-timeout {args.job_timeout:.0f} s; cancelling")
            session.call("DELETE", f"/v1/jobs/{job_id}")
            timed_out = True
    busy1, _ = cpu_ticks()
    wall = time.time() - t0
    row["state"] = current["state"]
    row["reason"] = current.get("reason")
    row["exit_code"] = current.get("exit_code")
    row["job_seconds"] = current.get("seconds")
    row["energy"] = current.get("energy")
    row["estimate_at_end"] = cpu_estimate(current.get("estimate"))
    row["estimate_error_by_jouled"] = current.get("estimate_error")
    row["load_start"], row["load_end"] = load0, loadavg()
    row["machine_busy_cpus"] = round((busy1 - busy0) / os.sysconf("SC_CLK_TCK") / max(wall, 1e-9), 2)
    row["timed_out"] = timed_out
    try:
        stdout = session.call("GET", f"/v1/jobs/{job_id}/log?stream=stdout&tail_bytes=65536", raw=True)
    except ApiError as e:
        stdout = ""
        row["log_error"] = str(e)
    row["result"] = None
    for line in stdout.splitlines():
        if line.startswith("E2E_RESULT "):
            try:
                row["result"] = json.loads(line[len("E2E_RESULT "):])
            except ValueError:
                pass
    if current["state"] != "succeeded":
        try:
            row["stderr_tail"] = session.call("GET", f"/v1/jobs/{job_id}/log?stream=stderr&tail_bytes=4000", raw=True)
        except ApiError:
            row["stderr_tail"] = ""
    row["calibration_after"] = session.cpu_device().get("model", {}).get("calibration")
    return row


def worker_measure(session, args, row, spec_path):
    cmd = [session.worker, "measure", "--model", spec_path, "--batch-size", str(row["batch"]), "--optimizer", "sgd",
           "--threads", str(args.threads), "--warmup", "5", "--steps", "5", "--repetitions", "5",
           "--min-reading-seconds", str(args.measure_min_reading), "--json"]
    env = {k: v for k, v in os.environ.items() if not (k.startswith("OMP_") or k.startswith("OPENBLAS_"))}
    env.update(OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads), E2E_RUN=session.marker)
    t0 = time.time()
    session.child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = session.child.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        session.child.kill()
        out, err = session.child.communicate()
    code = session.child.returncode
    session.child = None
    if code != 0:
        return {"command": cmd, "error": f"exit {code}: {err.strip()[-1000:]}"}
    result = json.loads(out)
    net = result["networks"][0]
    return {"command": cmd, "wall_seconds": round(time.time() - t0, 2), "joules_per_step": net["joules_per_step"],
            "seconds_per_step": net["seconds_per_step"], "joules_spread": net.get("joules_spread"),
            "steps_per_reading": net.get("steps_per_repetition"), "source": result.get("meter_source"),
            "threads": (result.get("environment") or {}).get("threads"), "raw": result}


# ---------------------------------------------------------------- statistics

def rel(estimate, truth):
    if estimate is None or truth is None or truth <= 0:
        return None
    return (estimate - truth) / truth


def inside(mean, std, truth):
    if mean is None or std is None or truth is None:
        return None
    return abs(mean - truth) <= 2.0 * std


def figure(estimate, key):
    if not estimate or estimate.get("status") != "ok":
        return None, None
    value = estimate.get(key)
    if not isinstance(value, dict):
        return None, None
    return value.get("mean"), value.get("std")


def analyse_row(row, modelled_watts):
    est = row.get("estimate_at_submit")
    ok = bool(est) and est.get("status") == "ok"
    row["estimate_status"] = "ok" if ok else (est or {}).get("status", "none")
    raw_mean, raw_std = figure(est, "raw_joules") if ok and est.get("raw_joules") else figure(est, "joules")
    served_mean, served_std = figure(est, "joules")
    baseline = (est.get("baseline") or {}).get("joules") if ok else None
    metered = (row.get("energy") or {}).get("joules") if row.get("state") == "succeeded" else None
    row["raw"] = {"mean": raw_mean, "std": raw_std}
    row["served"] = {"mean": served_mean, "std": served_std, "calibrated": bool(ok and est.get("raw_joules")),
                     "calibration": est.get("calibration") if ok else None,
                     "overhead": est.get("overhead") if ok else None}
    row["baseline_joules"] = baseline
    row["metered_joules"] = metered
    row["metered_source"] = (row.get("energy") or {}).get("source")
    row["error_raw"] = rel(raw_mean, metered)
    # The runtime lines (the interpreter's start-up and its per-step work beyond LibTorch, which
    # jouled measures per device with `joule-worker runtime`): part of the raw estimate of a
    # Python job. The estimate without them is what the layers alone say (issue 30's baseline).
    runtime = (est or {}).get("runtime") if ok else None
    runtime_joules = None
    if runtime and raw_mean is not None:
        runtime_joules = runtime["start_joules"]["mean"] + (est.get("steps") or 0) * runtime["step_joules"]["mean"]
    row["runtime_joules"] = runtime_joules
    row["runtime_kinds_read"] = (runtime or {}).get("kinds_read")
    layers_mean = raw_mean - runtime_joules if runtime_joules is not None else raw_mean
    row["error_raw_without_runtime"] = rel(layers_mean, metered)
    # A network measured whole on the device (or scaled by its family's whole-to-layers gap) is
    # estimated from that: its layers' own sum is kept beside it (the estimate's `whole`).
    whole = (est or {}).get("whole") if ok else None
    row["whole_basis"] = whole.get("basis") if whole else None
    row["family"] = whole.get("family") if whole else None
    if whole and raw_mean is not None:
        steps = est.get("steps") or 0
        layers_step = whole["layers_joules_per_step"]
        row["layers_joules_per_step"] = layers_step
        row["whole_joules_ratio"] = whole["joules_ratio"]
        row["raw_without_whole"] = raw_mean - steps * layers_step * (whole["joules_ratio"] - 1.0)
        row["error_raw_without_whole"] = rel(row["raw_without_whole"], metered)
    row["error_served"] = rel(served_mean, metered)
    row["error_flops"] = rel(baseline, metered)
    row["in_2sigma_raw"] = inside(raw_mean, raw_std, metered)
    row["in_2sigma_served"] = inside(served_mean, served_std, metered)
    if ok and est.get("seconds"):
        row["estimated_seconds"] = est["seconds"].get("mean")
    res = row.get("result") or {}
    # What the modelled meter would have read had nothing but this job's process run:
    # idle W x the job's seconds + W per busy core x the process's own CPU seconds.
    if metered is not None and res.get("cpu_seconds_total") is not None and row.get("job_seconds"):
        own = modelled_watts[0] * row["job_seconds"] + modelled_watts[1] * res["cpu_seconds_total"]
        row["own_process_joules"] = own
        row["others_share"] = max(0.0, metered - own) / metered
        row["error_raw_vs_own"] = rel(raw_mean, own)
        row["error_flops_vs_own"] = rel(baseline, own)
        row["in_2sigma_raw_vs_own"] = inside(raw_mean, raw_std, own)
    if res.get("seconds_to_first_step") is not None and row.get("job_seconds"):
        row["startup_share"] = res["seconds_to_first_step"] / row["job_seconds"]
    m = row.get("measure") or {}
    if m.get("joules_per_step"):
        steps = row["steps"]
        worker_joules = m["joules_per_step"] * steps
        row["worker_joules"] = worker_joules
        # joule-worker measures training steps only, and so does the raw estimate (the model's own):
        # the job overhead line learnt from finished jobs (process start, imports; issue 14) is in
        # the served figure only, and recorded beside it.
        overhead = ((est or {}).get("overhead") or {}).get("joules") if ok else None
        row["estimate_overhead_joules"] = overhead
        # The worker trains in LibTorch: the raw estimate's runtime lines are not in what it measures.
        steps_mean = layers_mean
        row["error_raw_vs_worker"] = rel(steps_mean, worker_joules)
        row["error_flops_vs_worker"] = rel(baseline, worker_joules)
        row["in_2sigma_raw_vs_worker"] = inside(steps_mean, raw_std, worker_joules)
        if metered is not None:
            row["job_over_worker"] = metered / worker_joules
        if res.get("training_seconds") and m.get("seconds_per_step"):
            row["job_step_seconds_over_worker"] = res["training_seconds"] / steps / m["seconds_per_step"]
    return row


def family_gap_leave_one_out(rows):
    """Each network measured whole, estimated instead as one not measured would be: its layers'
    sum scaled by the mean log whole-to-layers ratio of the OTHER networks of its family measured
    in the same run (the rule jouled applies from 2 such networks on); nothing where there are
    fewer than 2 others."""
    measured = [r for r in rows if r.get("whole_basis") == "measured" and r.get("whole_joules_ratio")]
    for r in measured:
        others = [math.log(o["whole_joules_ratio"]) for o in measured
                  if o["family"] == r["family"] and o["network"] != r["network"]]
        if len(others) < 2:
            continue
        ratio = math.exp(statistics.fmean(others))
        steps = (r.get("estimate_at_submit") or {}).get("steps") or 0
        loo = r["raw_without_whole"] + steps * r["layers_joules_per_step"] * (ratio - 1.0)
        r["family_gap_loo"] = {"ratio": ratio, "others": len(others), "joules": loo}
        r["error_family_gap_loo"] = rel(loo, r.get("metered_joules"))
        if r.get("worker_joules"):
            runtime = r.get("runtime_joules") or 0.0
            r["error_family_gap_loo_vs_worker"] = rel(loo - runtime, r["worker_joules"])
            r["error_raw_without_whole_vs_worker"] = rel(r["raw_without_whole"] - runtime, r["worker_joules"])


def summary(rows, error_key, flops_key, cover_key):
    errs = [(r, r.get(error_key)) for r in rows if r.get(error_key) is not None]
    if not errs:
        return {"n": 0}
    flops = [abs(r[flops_key]) for r, _ in errs if r.get(flops_key) is not None]
    covered = [r.get(cover_key) for r, _ in errs if r.get(cover_key) is not None]
    worst_row, worst = max(errs, key=lambda x: abs(x[1]))
    mape = statistics.fmean(abs(e) for _, e in errs)
    flops_mape = statistics.fmean(flops) if flops else None
    return {"n": len(errs), "mape": mape, "median_abs": statistics.median(abs(e) for _, e in errs),
            "mean_signed": statistics.fmean(e for _, e in errs),
            "worst": {"network": worst_row["network"], "batch": worst_row["batch"], "error": worst},
            "under_20_percent": sum(abs(e) < 0.20 for _, e in errs),
            "coverage_2sigma": (sum(covered) / len(covered)) if covered else None,
            "flops_mape": flops_mape, "flops_over_mape": (flops_mape / mape) if flops_mape and mape else None}


def summaries(rows):
    family_gap_leave_one_out(rows)
    out = {}
    for label, subset in (("tuning", [r for r in rows if r["set"] == "tuning"]),
                          ("held-out", [r for r in rows if r["set"] == "held-out"]), ("all", rows)):
        served = [r for r in subset if r["served"]["calibrated"]]
        out[label] = {
            "vs_real_jobs": summary(subset, "error_raw", "error_flops", "in_2sigma_raw"),
            "vs_real_jobs_without_runtime": summary(subset, "error_raw_without_runtime", "error_flops",
                                                    "in_2sigma_raw"),
            "vs_worker_measure": summary(subset, "error_raw_vs_worker", "error_flops_vs_worker",
                                         "in_2sigma_raw_vs_worker"),
            # Issue 30's whole networks: the same estimates from their layers' sum alone, and each
            # measured network estimated from its family's other measured networks instead.
            "vs_real_jobs_without_whole": summary(subset, "error_raw_without_whole", "error_flops", "in_2sigma_raw"),
            "vs_real_jobs_family_gap_loo": summary(subset, "error_family_gap_loo", "error_flops", "in_2sigma_raw"),
            "vs_worker_without_whole": summary(subset, "error_raw_without_whole_vs_worker", "error_flops_vs_worker",
                                               "in_2sigma_raw_vs_worker"),
            "vs_worker_family_gap_loo": summary(subset, "error_family_gap_loo_vs_worker", "error_flops_vs_worker",
                                                "in_2sigma_raw_vs_worker"),
            # The job's own process as the modelled meter would read it alone (idle W x its seconds
            # + W per busy core x its CPU seconds): the real job without the other load on the node.
            "vs_job_own_process": summary(subset, "error_raw_vs_own", "error_flops_vs_own", "in_2sigma_raw_vs_own"),
            # The estimates as jouled served them at submit: corrected by the jobs that had ended
            # before (only those submitted after 5 jobs had ended), against the same jobs raw.
            "served_calibrated_at_submit": summary(served, "error_served", "error_flops", "in_2sigma_served"),
            "same_jobs_raw": summary(served, "error_raw", "error_flops", "in_2sigma_raw"),
        }
    return out


def pct(x, digits=1):
    return "-" if x is None else f"{100.0 * x:+.{digits}f}%"


def apct(x, digits=1):
    return "-" if x is None else f"{100.0 * x:.{digits}f}%"


def num(x, fmt="{:.0f}"):
    return "-" if x is None else fmt.format(x)


def report(data):
    p = print
    p("")
    p(f"End-to-end accuracy of real PyTorch jobs through jouled -- joules from the `{data['meter_source']}` meter"
      + ("" if data["meter_measured"] else " (CPU seconds x W per busy core + wall seconds x idle W: "
                                           "a MODEL of energy, not a measurement)"))
    p(f"machine: {data['machine']['cpu_model']}, {data['machine']['cpus']} CPUs; threads T = {data['threads']}; "
      f"jouled {data['jouled']['version']} (sha256 {data['jouled']['sha256'][:12]}, built "
      f"{data['jouled']['built_utc']} UTC), git HEAD {data['git_head']}")
    for i, pr in enumerate(data.get("probe_runs_requested") or [data.get("probe_run") or {}]):
        p(f"probe run {pr.get('id')}{' (--more-probing)' if i else ''}: requested "
          f"{pr.get('requested_seconds') or data['probe_seconds']:.0f} s -> {pr.get('state')} ({pr.get('message')}); "
          f"{pr.get('probes')} probes, {pr.get('failed')} failed, {num(pr.get('probe_seconds'), '{:.1f}')} s in probes")
    if data.get("missing_after_first_run") is not None:
        p(f"after the first run ({data['probe_seconds']:.0f} s) no estimate for "
          f"{len(data['missing_after_first_run'])} of {len(data['rows'])} network x batch"
          + (f"; after {data.get('probe_seconds_total', 0):.0f} s of probing in all, "
             f"{len(data.get('missing_at_jobs') or [])}" if len(data.get("probe_runs_requested") or []) > 1 else ""))
    p(f"model when the jobs started: v{data['model_after_probing'].get('version')} with "
      f"{data['model_after_probing'].get('samples')} samples")
    scopes = sorted({(r.get("energy") or {}).get("scope") for r in data["rows"] if r.get("energy")} - {None})
    p(f"jobs' energy scope (GET /v1/jobs/ID energy.scope): {'; '.join(scopes) or '-'}")
    samples = data.get("probe_samples") or []
    if samples:
        kept = [x for x in samples if x["joules_per_step"] > 0 and x["seconds_per_step"] > 0]
        gaps = [(b["at_ms"] - a["at_ms"]) / 1000 for a, b in zip(samples, samples[1:])]
        p(f"probe samples stored: {len(samples)}, kept (positive joules and seconds) {len(kept)}; seconds between "
          f"samples median {statistics.median(gaps) if gaps else 0:.1f}, max {max(gaps) if gaps else 0:.1f}; batches "
          + ", ".join(f"{b}: {n}" for b, n in sorted(collections.Counter(x['batch'] for x in samples).items(),
                                                    key=lambda kv: str(kv[0]))))
    n_est = sum(1 for r in data["rows"] if r.get("estimate_status") == "ok")
    p(f"jobs with an estimate at submit: {n_est} of {len(data['rows'])}"
      + ("" if n_est == len(data["rows"]) else " (the others: " + "; ".join(sorted({
          f"{r['network']}: {r.get('estimate_status')}" for r in data["rows"] if r.get("estimate_status") != "ok"}))
         + ")"))
    for w in data["phases"]:
        p(f"  phase {w['phase']:<8} {w['seconds']:>7.1f} s, load {w['loadavg_start'][0]:.2f} -> "
          f"{w['loadavg_end'][0]:.2f}, machine busy {w['busy_cpus']:.2f} of {w['cpus']} CPUs")
    p("")
    hdr = (f"{'network':<12}{'set':<9}{'B':>3}{'steps':>6}{'job s':>7}{'est s':>7}{'metered J':>10}"
           f"{'raw est J ± std':>18}{'err':>8}{'2σ':>4}{'FLOPs':>8}{'served':>8}{'worker J':>10}{'vs wkr':>8}"
           f"{'job/wkr':>8}{'others':>7}{'start':>6}{'thr':>4}{'whole':>7}")
    p(hdr)
    for r in data["rows"]:
        res = r.get("result") or {}
        p(f"{r['network']:<12}{r['set']:<9}{r['batch']:>3}{r['steps']:>6}{num(r.get('job_seconds'), '{:.1f}'):>7}"
          f"{num(r.get('estimated_seconds'), '{:.1f}'):>7}{num(r.get('metered_joules')):>10}"
          f"{(num(r['raw']['mean']) + ' ± ' + num(r['raw']['std'])) if r['raw']['mean'] is not None else r['estimate_status']:>18}"
          f"{pct(r.get('error_raw'), 0):>8}{({True: 'in', False: 'out'}).get(r.get('in_2sigma_raw'), '-'):>4}"
          f"{pct(r.get('error_flops'), 0):>8}{pct(r.get('error_served'), 0) if r['served']['calibrated'] else '':>8}"
          f"{num(r.get('worker_joules')):>10}{pct(r.get('error_raw_vs_worker'), 0):>8}"
          f"{num(r.get('job_over_worker'), '{:.2f}'):>8}{apct(r.get('others_share'), 0):>7}"
          f"{apct(r.get('startup_share'), 0):>6}{num(res.get('torch_threads'), '{}'):>4}"
          f"{({'measured': 'meas', 'family-gap': 'gap'}).get(r.get('whole_basis'), '-'):>7}"
          + ("" if r.get("state") == "succeeded" else f"  {r.get('state')}: {r.get('reason')}"))
    p("")
    p("err: (raw estimate - metered) / metered; 2σ: metered within the raw estimate's mean ± 2 std; FLOPs: the "
      "FLOPs baseline's error; served: the estimate as served at submit, corrected by earlier jobs (after 5); "
      "worker J: joule-worker measure J/step x steps; vs wkr: raw estimate against it; job/wkr: metered / worker J; "
      "others: share of the metered joules beyond idle W x the job's seconds + W/core x its own CPU seconds (0 where jouled "
      "meters the job's process group alone); start: "
      "share of the job's seconds before its first step; thr: torch's thread count in the job; whole: the "
      "estimate's basis beyond its layers' sum (meas: the network measured whole on the device; gap: its family's "
      "whole-to-layers ratio)")
    p("")
    p(f"{'summary':<34}{'set':<9}{'n':>3}{'MAPE':>8}{'median':>8}{'signed':>8}{'worst':>24}{'<20%':>6}{'2σ cov':>8}"
      f"{'FLOPs':>8}{'F/MAPE':>7}")
    for what, key in (("vs real jobs (raw)", "vs_real_jobs"),
                      ("  the same, without runtime lines", "vs_real_jobs_without_runtime"),
                      ("  the same, layers' sum only", "vs_real_jobs_without_whole"),
                      ("  family gap, leave-one-out", "vs_real_jobs_family_gap_loo"),
                      ("vs joule-worker measure (raw)", "vs_worker_measure"),
                      ("  the same, layers' sum only", "vs_worker_without_whole"),
                      ("  family gap, leave-one-out", "vs_worker_family_gap_loo"),
                      ("vs the job's own process (raw)", "vs_job_own_process"),
                      ("served at submit (calibrated)", "served_calibrated_at_submit"),
                      ("  the same jobs, raw", "same_jobs_raw")):
        for label in ("tuning", "held-out", "all"):
            s = data["summaries"][label].get(key) or {}
            if not s.get("n"):
                p(f"{what:<34}{label:<9}{0:>3}")
                continue
            worst = f"{s['worst']['network']}/{s['worst']['batch']} {pct(s['worst']['error'], 0)}"
            p(f"{what:<34}{label:<9}{s['n']:>3}{apct(s['mape']):>8}{apct(s['median_abs']):>8}{pct(s['mean_signed']):>8}"
              f"{worst:>24}{s['under_20_percent']:>6}{apct(s['coverage_2sigma'], 0):>8}{apct(s['flops_mape']):>8}"
              f"{num(s['flops_over_mape'], '{:.2f}'):>7}")
    ref = data.get("reference") or {}
    readings = [r["joules_per_step"] for r in ref.get("readings", [])]
    if len(readings) >= 2:
        median = statistics.median(readings)
        p("")
        p(f"the machine's own noise: {ref['network']}/{ref['batch']} measured by joule-worker after each of "
          f"{len(readings)} jobs: {median:.4g} J/step median, spread (max - min) / median "
          f"{apct((max(readings) - min(readings)) / median)}, CV {apct(statistics.pstdev(readings) / statistics.fmean(readings))}"
          f", first to last {pct(readings[-1] / readings[0] - 1.0)}; an error below the spread cannot be told from "
          f"the machine's drift")
    cal = data.get("calibration_final") or {}
    p("")
    p(f"PRE outcome calibration (GET /v1/devices, cpu): rows {cal.get('rows')}, correction {cal.get('correction')}, "
      f"error raw {apct(cal.get('error_raw'))}, corrected (leave-one-out) "
      f"{apct(cal.get('error_corrected_leave_one_out'))}, 2σ coverage raw {apct(cal.get('coverage_2sigma_raw'), 0)}, "
      f"calibrated (leave-one-out) {apct(cal.get('coverage_2sigma_calibrated_leave_one_out'), 0)}, sigma x"
      f"{num(cal.get('sigma_scale'), '{:.2f}')}; work mix used: {cal.get('uses_work_mix', 'n/a')}")
    overhead = (cal.get("overhead") or {})
    line = overhead.get("joules") or {}
    seconds = overhead.get("seconds") or {}
    if line:
        p(f"job overhead learnt from the jobs: {num(line.get('per_job'), '{:.1f}')} J per job + "
          f"{num(line.get('per_epoch'), '{:.1f}')} J per epoch (steps x{num(line.get('steps_scale'), '{:.2f}')}, "
          f"separable: {line.get('separable')}); "
          f"{num(seconds.get('per_job'), '{:.2f}')} s per job, seconds corrected: {overhead.get('seconds_applied')} "
          f"(error raw {apct(overhead.get('seconds_error_raw'))}, corrected "
          f"{apct(overhead.get('seconds_error_corrected_leave_one_out'))})")
    m = data.get("model_final") or {}
    p(f"model at the end: v{m.get('version')}, {m.get('samples')} samples; per kind: "
      + ", ".join(f"{k} {v}" for k, v in sorted((m.get("layers") or {}).items())))
    python = (m.get("runtimes") or {}).get("python")
    if python:
        start, step = python.get("start") or {}, python.get("step") or {}
        p(f"runtime probe ({python.get('interpreter')}, {python.get('version')}, {python.get('source')}): start-up "
          f"{num(start.get('seconds'), '{:.2f}')} s, {num(start.get('joules'), '{:.1f}')} J; per step beyond LibTorch "
          f"{num(1e6 * step.get('seconds_base', 0), '{:.0f}')} µs + {num(1e6 * step.get('seconds_per_module', 0), '{:.1f}')}"
          f" µs per module, ±{apct(step.get('sigma'), 0)}, {python.get('runs')} run(s) pooled")
        kinds = python.get("kinds") or {}
        if kinds:
            p("  layer kinds read on their own networks, per layer beyond the line: " + ", ".join(
                f"{k} {num(1e6 * v.get('seconds_per_layer', 0), '{:.0f}')} µs" for k, v in sorted(kinds.items())))
    else:
        p("runtime probe: none in the model (" + str(((m.get("probing") or {}).get("runtime") or {})) + ")")
    whole = (m.get("probing") or {}).get("whole_networks") or {}
    measured_rows = [r for r in data["rows"] if r.get("whole_joules_ratio") and r.get("whole_basis") == "measured"]
    campaign = (m.get("probing") or {}).get("campaign")
    if campaign:
        # A campaign re-learns the model from nothing (a drift: jobs' metered joules fell outside
        # their estimates' 2σ band); the networks measured whole go with the model they belong to.
        p(f"re-probing at the end: campaign '{campaign}', {(m.get('probing') or {}).get('samples_learning', 0)} "
          f"samples learnt so far (the estimates still come from the model it replaces)")
    p(f"networks measured whole at the end: {whole.get('measured', 0)}; jobs estimated from a whole measurement at "
      f"submit: {len(measured_rows)}, from a family gap: "
      f"{sum(1 for r in data['rows'] if r.get('whole_basis') == 'family-gap')}; whole / layers' sum per job: "
      + ", ".join(f"{r['network']}/{r['batch']} {r['whole_joules_ratio']:.2f}" for r in measured_rows))
    if whole.get("gaps"):
        p("family gaps (whole / layers' sum, joules): " + "; ".join(
            f"{family} x{g['joules_ratio']:.2f} ±{apct(g['joules_log_std'], 0)} from {g['networks']}"
            for family, g in sorted(whole["gaps"].items())))
    runs = data.get("probe_runs") or []
    if len(runs) > 1:
        p("probe runs: " + "; ".join(f"{r.get('reason')} {r.get('state')} {r.get('probes')} probes "
                                       f"{num(r.get('probe_seconds'), '{:.0f}')} s" for r in runs))


# ---------------------------------------------------------------- calibrate

TIMING = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import torch, torch.nn as nn, nets
name, seconds = sys.argv[2], float(sys.argv[3])
for b in sys.argv[4:]:
    b = int(b)
    m = nets.build(name); x, y = nets.batch(name, b)
    opt = torch.optim.SGD(m.parameters(), lr=0.01); lf = nn.CrossEntropyLoss()
    def step():
        opt.zero_grad(); l = lf(m(x), y); l.backward(); opt.step(); l.item()
    for _ in range(3): step()
    t = time.monotonic(); n = 0
    while time.monotonic() - t < seconds: step(); n += 1
    print(b, (time.monotonic() - t) / n, torch.get_num_threads(), flush=True)
"""


def time_steps(args, name, batches, seconds):
    """{batch: seconds per training step} of one network in a fresh /usr/bin/python3 at --threads
    (what train.py does per step, on one fixed batch), and the machine's busy CPUs meanwhile."""
    env = {k: v for k, v in os.environ.items() if not (k.startswith("OMP_") or k.startswith("OPENBLAS_"))}
    # As jouled runs the jobs (threads and the probes' malloc thresholds, README "Allocator").
    env.update(OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads), MALLOC_MMAP_THRESHOLD_="33554432",
               MALLOC_TRIM_THRESHOLD_="1073741824", MALLOC_MMAP_MAX_="0")
    t0, (busy0, _) = time.time(), cpu_ticks()
    out = subprocess.run([args.python, "-c", TIMING, E2E, name, str(seconds)] + [str(b) for b in batches],
                         capture_output=True, text=True, env=env, timeout=600)
    busy1, _ = cpu_ticks()
    if out.returncode != 0:
        raise RuntimeError(f"timing {name} failed: {out.stderr.strip()[-2000:]}")
    result = {}
    for line in out.stdout.splitlines():
        b, sps, threads = line.split()
        result[int(b)] = float(sps)
    busy = (busy1 - busy0) / os.sysconf("SC_CLK_TCK") / max(time.time() - t0, 1e-9)
    return result, busy, int(threads)


def calibrate(args):
    """Prints seconds per step of every network x batch and the nets.STEPS table they give."""
    nets = load_nets()
    names, batches, _ = plan(args, nets)
    print(f"load {loadavg()}; {args.threads} threads; steps for {args.target_seconds:.0f} s of training")
    table = {}
    hz = os.sysconf("SC_CLK_TCK")
    for name in names:
        # A quiet machine first (under 0.1 CPU busy over 3 s, waiting at most --quiet-wait s): with
        # T threads on 2 CPUs, one other busy process slows a step by up to 15x (see the README).
        waited = time.time()
        while time.time() - waited < args.quiet_wait:
            b0, _ = cpu_ticks()
            time.sleep(3)
            b1, _ = cpu_ticks()
            if (b1 - b0) / hz / 3 < 0.1:
                break
        timing, busy, threads = time_steps(args, name, batches, 3.0)
        for b, sps in timing.items():
            steps = max(args.epochs, int(round(args.target_seconds / sps / args.epochs)) * args.epochs)
            table.setdefault(name, {})[b] = steps
            print(f"{name:<12} {b:>3}: {1000 * sps:8.2f} ms/step ({threads} threads) -> {steps} steps", flush=True)
        print(f"{'':<12} machine {busy:.2f} CPUs busy while timing (ours included), waited "
              f"{max(0.0, time.time() - waited - 3 - 3.0 * len(batches)):.0f} s for quiet", flush=True)
    print(f"load {loadavg()}")
    print("STEPS = {\n" + "".join(f'    "{n}": {json.dumps(v).replace(chr(34), "")},\n' for n, v in table.items()) + "}")
    return 0


# ---------------------------------------------------------------- main

SESSION = None


def on_signal(signum, frame):
    raise SystemExit(128 + signum)


def watchdog(limit):
    print(f"watchdog: --limit {limit:.0f} s passed; stopping everything", file=sys.stderr, flush=True)
    if SESSION is not None:
        try:
            SESSION.cleanup()
        except Exception as e:  # noqa: BLE001
            print(f"watchdog: {e}", file=sys.stderr)
    os._exit(3)


def main():
    global SESSION
    args = parse_args()
    if args.calibrate:
        return calibrate(args)
    if args.analyse:
        with open(args.analyse) as f:
            data = json.load(f)
        watts = data.get("modelled_watts") or {}
        watts = (watts.get("idle", 10.0), watts.get("per_busy_core", 12.0))
        for row in data["rows"]:
            analyse_row(row, watts)
        data["summaries"] = summaries(data["rows"])
        report(data)
        return 0
    for path, what in ((args.jouled, "jouled"), (args.worker, "joule-worker"), (args.python, "the jobs' python")):
        if not os.path.exists(path):
            print(f"no {what} at {path}", file=sys.stderr)
            return 2
    problems = [p for path in (TRAIN, os.path.join(E2E, "nets.py"), os.path.join(PYTHON_PACKAGE, "joule", "__init__.py"))
                for p in readable_by_others(path)]
    if problems:
        print("jobs run under accounts of their own and cannot read the benchmark: " + "; ".join(problems),
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    timer = threading.Timer(args.limit, watchdog, (args.limit,))
    timer.daemon = True
    timer.start()
    started = time.time()
    nets = load_nets()
    names, batches, rows = plan(args, nets)
    data = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "argv": sys.argv,
            "threads": args.threads, "probe_seconds": args.probe_seconds, "epochs": args.epochs, "scale": args.scale,
            "quick": args.quick, "networks": {n: nets.NETWORKS[n][2] for n in names}, "batches": batches,
            "machine": {"cpu_model": cpu_model(), "cpus": os.cpu_count()}, "git_head": git("log", "-1", "--format=%h %s"),
            # What else the build tree held: the binaries may be built from uncommitted sources.
            "git_uncommitted": [l for l in git("status", "--short", "--untracked-files=no").splitlines()],
            "phases": [], "rows": rows, "target_seconds": None if args.fixed_steps else args.lengths,
            "steps_from": "nets.STEPS" if args.fixed_steps else "timing at start"}
    try:
        if args.wait_quiet > 0:
            data["quiet_share_at_start"] = wait_quiet(args.wait_quiet)
        if not args.fixed_steps:
            # Job sizes from the speed of the moment: --target-seconds of training each (2 s of
            # timing per network x batch in a fresh python at T threads, before jouled starts).
            window = Window("timing")
            timings, busy_by_net = {}, {}
            for name in names:
                timings[name], busy_by_net[name], _ = time_steps(args, name, batches, 2.0)
                log(f"timed {name}: " + ", ".join(f"b{b} {1000 * t:.1f} ms/step" for b, t in timings[name].items())
                    + f" (machine {busy_by_net[name]:.2f} CPUs busy)")
            names, batches, rows = plan(args, nets, timings)
            data["rows"] = rows
            data["phases"].append(window.close(busy_cpus_by_network=busy_by_net))
        SESSION = session = Session(args)
        data["config"] = session.write_config()
        data["jouled"] = {"copied_from": os.path.abspath(args.jouled), "sha256": sha256(session.jouled),
                          "built_utc": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(os.path.getmtime(args.jouled))),
                          "version": subprocess.run([session.jouled, "--version"], capture_output=True,
                                                    text=True).stdout.strip()}
        data["worker"] = {"copied_from": os.path.abspath(args.worker), "sha256": sha256(session.worker),
                          "built_utc": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(os.path.getmtime(args.worker)))}
        log(f"tracing {len(names)} networks with joule.spec; temp dir {session.dir}")
        reference = None
        if args.reference and not args.no_measure:
            ref_name, ref_batch = args.reference.split(":")
            reference = {"network": ref_name, "batch": int(ref_batch), "readings": []}
            data["reference"] = reference
        specs = specs_of(sorted(set(names) | ({reference["network"]} if reference else set())), nets)
        for name, spec in specs.items():
            with open(os.path.join(session.specs, f"{name}.json"), "w") as f:
                json.dump(spec, f)
        data["specs"] = specs
        session.start()
        effective = re.search(r"effective config: (\{.*\})", session.read_log())
        data["effective_config"] = json.loads(effective.group(1)) if effective else None
        device = session.cpu_device()
        data["device"] = device
        meter = device.get("meter") or {}
        data["meter_source"] = meter.get("source") if isinstance(meter, dict) else device.get("source")
        data["meter_source"] = data["meter_source"] or device.get("source") or "?"
        data["meter_measured"] = bool(meter.get("measured") if isinstance(meter, dict) else device.get("measured"))
        log(f"jouled {data['jouled']['version']} on 127.0.0.1:{session.port}, pid {session.proc.pid}; cpu meter "
            f"`{data['meter_source']}` ({'a measurement' if data['meter_measured'] else 'NOT a measurement'}); "
            f"load {loadavg()}")

        # -- 2. one requested probe run, the benchmark's networks as the workload
        window = Window("probing")
        models = [{"model": specs[r["network"]], "training": training_of(r)} for r in rows]
        run = probe_run(session, args.probe_seconds, models)
        data["probe_run"] = run
        data["probe_runs_requested"] = [run]
        data["missing_after_first_run"] = missing_estimates(session, rows, specs)
        # --more-probing: further requested runs (the same workload) until every job would have
        # an estimate, or the extra seconds are spent. Beyond the 10 minutes: the report
        # says how much probing the estimates took.
        extra_end = time.time() + args.more_probing
        while data["missing_after_first_run"] and args.more_probing > 0:
            missing = missing_estimates(session, rows, specs)
            left = extra_end - time.time()
            if not missing or left < 30:
                break
            log(f"no estimate yet for {', '.join(missing)}: probing {min(600.0, left):.0f} s more (--more-probing)")
            data["probe_runs_requested"].append(probe_run(session, min(600.0, left), models))
        data["missing_at_jobs"] = missing_estimates(session, rows, specs)
        data["probe_seconds_total"] = sum(r.get("probe_seconds") or 0.0 for r in data["probe_runs_requested"])
        data["model_after_probing"] = session.cpu_device().get("model", {})
        data["phases"].append(window.close(probe_cpu_seconds=proc_cpu_seconds(session.proc.pid)))

        # -- 3. the real jobs, one after the other
        window = Window("jobs")
        for i, row in enumerate(rows):
            log(f"job {i + 1}/{len(rows)}: {row['network']} ({row['set']}) batch {row['batch']}, {row['epochs']} x "
                f"{row['samples_per_epoch']} samples = {row['steps']} steps; load {loadavg()}")
            run_job(session, args, row, specs[row["network"]])
            est = row.get("estimate_at_submit") or {}
            res = row.get("result") or {}
            log(f"  {row['state']} in {num(row.get('job_seconds'), '{:.1f}')} s ({res.get('torch_threads')} torch "
                f"threads, first step after {num(res.get('seconds_to_first_step'), '{:.1f}')} s): metered "
                f"{num((row.get('energy') or {}).get('joules'))} J ({(row.get('energy') or {}).get('source')}), "
                f"estimate {num((est.get('joules') or {}).get('mean'))} ± {num((est.get('joules') or {}).get('std'))} J"
                + (f" (raw {num(est['raw_joules'].get('mean'))})" if est.get("raw_joules") else "")
                + ("" if est.get("status", "ok") == "ok" else f" [{est.get('status')}: {est.get('detail')}]"))
            if not args.no_measure:
                # Right after the job, so that both meet the same load on this shared machine (a
                # measure phase at the end met other load than the jobs had). The device is idle
                # meanwhile for well under [probing] idle_seconds: no background probe starts.
                busy0, t0 = cpu_ticks()[0], time.time()
                row["measure"] = worker_measure(session, args, row,
                                                os.path.join(session.specs, f"{row['network']}.json"))
                row["measure"]["machine_busy_cpus"] = round(
                    (cpu_ticks()[0] - busy0) / os.sysconf("SC_CLK_TCK") / max(time.time() - t0, 1e-9), 2)
                if reference:
                    ref = worker_measure(session, args, reference,
                                         os.path.join(session.specs, f"{reference['network']}.json"))
                    if "error" not in ref:
                        reference["readings"].append({"after_job": i + 1, "at": time.time(),
                                                      "joules_per_step": ref["joules_per_step"],
                                                      "seconds_per_step": ref["seconds_per_step"],
                                                      "joules_spread": ref.get("joules_spread")})
                m = row["measure"]
                log(f"  joule-worker measure: " + (m["error"] if "error" in m else
                    f"{m['joules_per_step']:.4g} J/step, {1000 * m['seconds_per_step']:.2f} ms/step ({m['source']}; "
                    f"the job: {1000 * res['training_seconds'] / row['steps']:.2f} ms/step)"
                    if res.get("training_seconds") else f"{m['joules_per_step']:.4g} J/step"))
        data["phases"].append(window.close())
        device = session.cpu_device()
        data["model_final"] = device.get("model", {})
        data["calibration_final"] = data["model_final"].get("calibration")
        data["probe_runs"] = session.call("GET", "/v1/probes")
        data["probe_runs"] = data["probe_runs"].get("runs", data["probe_runs"]) if isinstance(data["probe_runs"], dict) \
            else data["probe_runs"]
        try:
            metrics = session.call("GET", "/metrics", raw=True)
            data["build_info"] = [l for l in metrics.splitlines() if l.startswith("joule_build_info")]
        except ApiError:
            data["build_info"] = []
        data["jouled_warnings"] = [l for l in session.read_log().splitlines() if " warning: " in l or " error: " in l][:200]
        log(f"jobs done; calibration {data['calibration_final']}; stopping jouled")
        session.stop_jouled()
        data["probe_samples"] = session.probe_samples()

        idle = (data["effective_config"] or {}).get("devices", [{}])
        cfg_dev = next((d for d in idle if d.get("name") == "cpu"), {}) if isinstance(idle, list) else {}
        watts = (cfg_dev.get("idle_watts", 10.0), cfg_dev.get("watts_per_busy_core", 12.0))
        data["modelled_watts"] = {"idle": watts[0], "per_busy_core": watts[1]}
        for row in rows:
            analyse_row(row, watts)
        data["rows"] = rows
        data["summaries"] = summaries(rows)
        data["seconds"] = round(time.time() - started, 1)
        report(data)
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        timer.cancel()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(data, f, indent=1, default=str)
            log(f"wrote {args.json}")
        if SESSION is not None:
            SESSION.cleanup()


if __name__ == "__main__":
    sys.exit(main())
