#!/usr/bin/env python3
"""The Grafana dashboards (dashboards/) and alert rules (alerts/) against a real Prometheus.

    /usr/bin/python3 tests/prometheus/dashboards_test.py /path/to/jouled

1. promtool check rules and promtool test rules on alerts/; the dashboards' JSON and the
   provisioning files parse and hold together (datasource variable, panel ids, grid, variables);
2. starts a real cluster: a coordinator "coord" (a modelled cpu probed by joule-worker, a
   simulated laptop CPU that runs jobs, two budgets) and an agent "edge1" (a simulated Jetson
   that runs jobs), and a real Prometheus scraping both every second with alerts/ loaded;
3. a small workload: a requested probe run on the cpu until its model can estimate a job, two
   estimated jobs there (estimate error), two jobs on the agent, and a job on the laptop CPU that
   a power cap pauses and its removal resumes (throttle actions);
4. every PromQL expression of every dashboard panel, with the dashboard's variables resolved as
   Grafana would (label_values through /api/v1/series) to the test's node and devices, goes to
   /api/v1/query: it must parse and return at least one finite value. Every metric a dashboard or
   rule names must be among /api/v1/label/__name__/values. Every alert expression must evaluate
   without error, and so must every rule as Prometheus itself evaluates it (/api/v1/rules). The
   unit tests' input series must carry the label names that the live series carry.

Prints one PASS line, or FAIL lines with the daemons' and Prometheus' log tails; exit 0 or 1
(77: skipped, when joule-worker is not built). Every process it starts is stopped at exit.
Tools: prometheus and promtool (Debian: prometheus), PyYAML (python3-yaml); override the tools'
paths with PROMETHEUS=... PROMTOOL=...; VERBOSE=1 prints what each panel query returned.
"""

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

NAME = "prometheus_dashboards"
ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
RULES = ROOT / "alerts" / "joule.rules.yml"
RULE_TESTS = ROOT / "alerts" / "tests.yaml"
PROMETHEUS = os.environ.get("PROMETHEUS", "prometheus")
PROMTOOL = os.environ.get("PROMTOOL", "promtool")
VERBOSE = os.environ.get("VERBOSE") == "1"  # print every query's first values

# Grafana's own variables, as the test substitutes them: the workload's whole span is inside
# both windows, so rates and increases see every change it made.
BUILTINS = {"__rate_interval": "5m", "__range": "5m", "__interval": "5s"}
# The datasource and the dashboards' panels.
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

MLP = {"input": {"shape": [784]},
       "layers": [{"type": "linear", "out_features": 256}, {"type": "relu"}, {"type": "linear", "out_features": 10}]}
# One layer (linear@output): the cpu model can estimate it after the first few probe rounds.
LINEAR = {"input": {"shape": [784]}, "layers": [{"type": "linear", "out_features": 10}]}
TRAINING = {"batch_size": 64, "epochs": 1, "samples_per_epoch": 6400}

processes = []  # (label, Popen, log path), stopped in reverse order at exit
TMP = None
STARTED = time.monotonic()


class Failure(Exception):
    pass


def log_tails():
    for label, _, log in processes:
        try:
            lines = Path(log).read_text(errors="replace").splitlines()[-25:]
        except OSError:
            continue
        if lines:
            print(f"--- last lines of {label} ({log}) ---", file=sys.stderr)
            print("\n".join(lines), file=sys.stderr)


# ------------------------------------------------------------------------------ processes
def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(label, argv, log):
    out = open(log, "w")
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
    out.close()
    processes.append((label, proc, log))
    return proc


def stop(proc):
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def kill_leftovers():
    """jouled leaves running jobs and probes alone when it stops (it adopts them at its next
    start): kill the process groups of whatever still runs under our temp directory."""
    own = os.getpgid(0)
    groups = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if TMP and TMP + "/" in cmdline:
                groups.add(os.getpgid(int(entry.name)))
        except (OSError, ProcessLookupError):
            continue
    for group in groups:
        if group > 1 and group != own:
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:
                pass


def cleanup():
    for _, proc, _ in reversed(processes):
        stop(proc)
    if TMP:
        kill_leftovers()
        shutil.rmtree(TMP, ignore_errors=True)


def wait_for(what, check, timeout, interval=0.25):
    """Polls check() until it returns something truthy; that value, or Failure naming `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = check()
        except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
            last = e
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() >= deadline:
            raise Failure(f"{what}: not within {timeout:g} s (last: {str(last)[:1500]})")
        time.sleep(interval)


# ---------------------------------------------------------------------------------- HTTP
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only


def http(method, url, body=None, timeout=10):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with OPENER.open(request, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text


class Jouled:
    def __init__(self, label, url, proc):
        self.label, self.url, self.proc = label, url, proc

    def call(self, method, path, body=None):
        return http(method, self.url + path, body)

    def submit(self, job):
        code, answer = self.call("POST", "/v1/jobs", job)
        if code != 201:
            raise Failure(f"{self.label}: POST /v1/jobs answered {code}: {answer}")
        return answer["id"]

    def job(self, job_id):
        return self.call("GET", f"/v1/jobs/{job_id}")[1]

    def wait_state(self, job_id, states, timeout=40):
        def reached():
            job = self.job(job_id)
            if job.get("state") in ("failed", "cancelled") and job.get("state") not in states:
                raise Failure(f"{self.label}: job {job_id} ended {job.get('state')}: {json.dumps(job)[:2000]}")
            return job if job.get("state") in states else None
        return wait_for(f"{self.label}: job {job_id} in {states}", reached, timeout)


def start_jouled(label, config, port=None):
    """jouled with `config`; the port it printed in its 'listening on' line."""
    path = Path(TMP) / f"{label}.toml"
    path.write_text(config)
    log = str(Path(TMP) / f"{label}.log")
    proc = start(label, [JOULED, "--config", str(path), "--state-dir", f"{TMP}/{label}-state"], log)

    def listening():
        if proc.poll() is not None:
            raise Failure(f"{label}: jouled exited ({proc.returncode}) before listening")
        m = re.search(r"listening on (http://127\.0\.0\.1:[0-9]+)", Path(log).read_text(errors="replace"))
        return m and m.group(1)
    url = wait_for(f"{label}: jouled's 'listening on' line", listening, 15, 0.1)
    return Jouled(label, url, proc)


# ----------------------------------------------------------------------------- Prometheus
def prom_get(path, params):
    url = PROM + path + "?" + urllib.parse.urlencode(params, doseq=True)
    code, answer = http("GET", url, timeout=10)
    return code, answer


def instant(expr):
    """(result list, None) or (None, error text)."""
    code, answer = prom_get("/api/v1/query", {"query": expr})
    if code != 200 or not isinstance(answer, dict) or answer.get("status") != "success":
        return None, f"HTTP {code}: {answer}"
    data = answer["data"]
    if data["resultType"] == "scalar":
        return [{"metric": {}, "value": data["result"]}], None
    if data["resultType"] != "vector":
        return None, f"result type {data['resultType']}, not an instant vector"
    return data["result"], None


def fmt_labels(metric):
    return "{" + ",".join(f"{k}={v}" for k, v in sorted(metric.items()) if k not in ("job", "instance")) + "}"


def finite(result):
    return [s for s in result if math.isfinite(float(s["value"][1]))]


METRIC_IN_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{")
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def metric_names(expr):
    """The metrics an expression names: joule_* anywhere, `up`, and any name before a selector."""
    names = set(re.findall(r"\b(joule_[a-zA-Z0-9_:]+)", expr))
    names |= {n for n in METRIC_IN_SELECTOR.findall(expr) if n not in KEYWORDS}
    if re.search(r"(?<![\w:])up(?![\w:])", expr):
        names.add("up")
    return names


# ------------------------------------------------------------------------ 1. static checks
def run_tool(argv, cwd=None):
    result = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=60)
    return result.returncode, (result.stdout + result.stderr).strip()


def check_rules_statically():
    rc, out = run_tool([PROMTOOL, "check", "rules", str(RULES)])
    if rc != 0:
        raise Failure(f"promtool check rules {RULES} (exit {rc}):\n{out}")
    rc, out = run_tool([PROMTOOL, "test", "rules", str(RULE_TESTS)])
    if rc != 0:
        raise Failure(f"promtool test rules {RULE_TESTS} (exit {rc}):\n{out}")
    rules = yaml.safe_load(RULES.read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    for rule in alerts:
        for key in ("summary", "description"):
            if not rule.get("annotations", {}).get(key):
                raise Failure(f"alert {rule['alert']}: no {key} annotation")
        if "severity" not in rule.get("labels", {}):
            raise Failure(f"alert {rule['alert']}: no severity label")
    tested = set(re.findall(r"alertname:\s*(\S+)", RULE_TESTS.read_text()))
    untested = sorted({r["alert"] for r in alerts} - tested)
    if untested:
        raise Failure(f"alerts without a case in {RULE_TESTS.name}: {', '.join(untested)}")
    return alerts


def panels_of(board):
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows keep theirs inside


def check_dashboards_statically():
    boards = {}
    uids = set()
    for path in sorted(DASHBOARDS.glob("*.json")):
        try:
            board = json.loads(path.read_text())
        except ValueError as e:
            raise Failure(f"{path}: not JSON: {e}")
        where = path.name
        for key in ("uid", "title", "schemaVersion", "panels", "templating"):
            if key not in board:
                raise Failure(f"{where}: no {key}")
        if board["uid"] in uids:
            raise Failure(f"{where}: uid {board['uid']} is taken by another dashboard")
        uids.add(board["uid"])
        if board["schemaVersion"] < 39:
            raise Failure(f"{where}: schemaVersion {board['schemaVersion']} is older than Grafana 10.4's 39")
        variables = board["templating"]["list"]
        names = [v["name"] for v in variables]
        if len(set(names)) != len(names):
            raise Failure(f"{where}: variables named twice: {names}")
        ds = [v for v in variables if v["name"] == "datasource"]
        if not ds or ds[0]["type"] != "datasource" or ds[0]["query"] != "prometheus":
            raise Failure(f"{where}: needs a variable 'datasource' of type datasource for prometheus")
        for v in variables:
            if v["type"] == "query" and v.get("datasource") != DATASOURCE:
                raise Failure(f"{where}: variable {v['name']} does not use ${{datasource}}: {v.get('datasource')}")
        ids = set()
        cells = {}
        for panel in panels_of(board):
            title = f"{where}: panel {panel.get('id')} '{panel.get('title')}'"
            if panel.get("id") in ids or not isinstance(panel.get("id"), int):
                raise Failure(f"{title}: id missing or taken")
            ids.add(panel["id"])
            g = panel.get("gridPos", {})
            if not all(isinstance(g.get(k), int) for k in "hwxy") or g["x"] < 0 or g["x"] + g["w"] > 24:
                raise Failure(f"{title}: gridPos {g} is not within the 24-column grid")
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    if (x, y) in cells:
                        raise Failure(f"{title}: overlaps panel {cells[(x, y)]}")
                    cells[(x, y)] = panel["id"]
            if panel["type"] == "row":
                continue
            if panel.get("datasource") != DATASOURCE:
                raise Failure(f"{title}: datasource is {panel.get('datasource')}, not {DATASOURCE}")
            targets = panel.get("targets") or []
            if not targets:
                raise Failure(f"{title}: no queries")
            refs = [t.get("refId") for t in targets]
            if len(set(refs)) != len(refs) or None in refs:
                raise Failure(f"{title}: refIds missing or repeated: {refs}")
            for t in targets:
                if t.get("datasource") != DATASOURCE or not t.get("expr"):
                    raise Failure(f"{title}: query {t.get('refId')} has no expr or another datasource")
                used = set(re.findall(r"\$\{?(\w+)", t["expr"]))
                unknown = used - set(names) - set(BUILTINS)
                if unknown:
                    raise Failure(f"{title}: query {t['refId']} uses undefined variables {sorted(unknown)}")
        boards[path.name] = board
    if {"joule-node.json", "joule-cluster.json"} - set(boards):
        raise Failure(f"{DASHBOARDS}: expected joule-node.json and joule-cluster.json, found {sorted(boards)}")
    return boards


def check_provisioning():
    ds = yaml.safe_load((DASHBOARDS / "provisioning" / "datasources" / "joule.yaml").read_text())
    if ds.get("apiVersion") != 1 or not ds.get("datasources") or ds["datasources"][0].get("type") != "prometheus":
        raise Failure(f"datasource provisioning: apiVersion 1 and a prometheus datasource expected: {ds}")
    providers = yaml.safe_load((DASHBOARDS / "provisioning" / "dashboards" / "joule.yaml").read_text())
    if providers.get("apiVersion") != 1 or not providers.get("providers"):
        raise Failure(f"dashboard provisioning: apiVersion 1 and providers expected: {providers}")
    for p in providers["providers"]:
        if p.get("type") != "file" or not p.get("options", {}).get("path"):
            raise Failure(f"dashboard provider {p.get('name')}: type file with options.path expected")


# ------------------------------------------------------------------- 2. cluster, Prometheus
def coordinator_config(port, policies):
    return f"""[node]
name = "coord"
[server]
listen = "127.0.0.1:{port}"
[cluster]
role = "coordinator"
heartbeat_seconds = 0.5
lost_after_seconds = 10
[policy]
directory = "{policies}"
[meters]
interval_seconds = 0.5
[carbon]
intensity = 300
[price]
currency = "EUR"
per_kwh = 0.25
[[devices]]
name = "cpu"
meter = "modelled"
[[devices]]
name = "sim:laptop-cpu"
probes = 40
runs_jobs = true
[probing]
enabled = false
python = ""
warmup_steps = 1
steps_per_repetition = 1
repetitions = 2
refit_every = 2
"""


AGENT_CONFIG = """[node]
name = "edge1"
[server]
listen = "127.0.0.1:0"
[cluster]
role = "agent"
coordinator = "{coordinator}"
[meters]
interval_seconds = 0.5
[[devices]]
name = "sim:jetson-orin"
probes = 40
runs_jobs = true
[probing]
enabled = false
"""

BUDGETS = """[[budgets]]
name = "coord-daily"
scope = "node"
target = "coord"
joules = 10_000_000
calendar = "day"

[[budgets]]
name = "cluster-hourly"
scope = "cluster"
wh = 100
window = "1h"

[[budgets]]
name = "coord-grams"
scope = "node"
target = "coord"
kg = 100
calendar = "day"

[[budgets]]
name = "coord-money"
scope = "node"
target = "coord"
cost = 100
calendar = "day"
"""

# No machine draws less than a milliwatt: the cap is exceeded as soon as it is read.
CAP = """[[power_caps]]
name = "tiny"
scope = "device"
target = "coord/sim:laptop-cpu"
watts = 0.001
average_seconds = 2
"""


def start_cluster():
    policies = Path(TMP) / "policies"
    policies.mkdir()
    (policies / "10-budgets.toml").write_text(BUDGETS)
    for attempt in range(3):  # the free port may be taken before jouled binds it
        port = free_port()
        try:
            coord = start_jouled("coord", coordinator_config(port, policies))
            break
        except Failure:
            if "address already in use" not in Path(TMP, "coord.log").read_text(errors="replace").lower() or attempt == 2:
                raise
            processes.pop()
    agent = start_jouled("edge1", AGENT_CONFIG.format(coordinator=coord.url))

    def ready():
        nodes = coord.call("GET", "/v1/nodes")[1]["nodes"]
        return any(n["name"] == "edge1" and n["state"] == "ready" for n in nodes)
    wait_for("coordinator: agent edge1 ready", ready, 20)
    return coord, agent, policies


def start_prometheus(targets):
    global PROM
    data = Path(TMP) / "prom-data"
    config = Path(TMP) / "prometheus.yml"
    config.write_text(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - {RULES}
scrape_configs:
  - job_name: joule
    static_configs:
      - targets: {json.dumps(targets)}
""")
    rc, out = run_tool([PROMTOOL, "check", "config", str(config)])
    if rc != 0:
        raise Failure(f"promtool check config rejected the generated config:\n{out}")
    for attempt in range(3):
        port = free_port()
        log = str(Path(TMP) / "prometheus.log")
        proc = start("prometheus", [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={data}",
                                    f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], log)
        PROM = f"http://127.0.0.1:{port}"

        def up():
            if proc.poll() is not None:
                return "exited"
            with OPENER.open(PROM + "/-/ready", timeout=2) as r:
                return r.status == 200
        state = wait_for("prometheus ready", up, 20, 0.2)
        if state is True:
            return
        if "address already in use" not in Path(log).read_text(errors="replace") or attempt == 2:
            raise Failure("prometheus exited during startup")
        processes.pop()


# ------------------------------------------------------------------------------ 3. workload
def scraped(expr, timeout=15):
    """Waits until Prometheus has scraped what `expr` selects."""
    wait_for(f"Prometheus: {expr}", lambda: instant(expr)[0], timeout)


def workload(coord, agent, policies):
    """Returns the jobs it ran, by device."""
    code, run = coord.call("POST", "/v1/probes", {"device": "cpu", "seconds": 120})
    if code != 202:
        raise Failure(f"POST /v1/probes answered {code}: {run}")

    # A power cap pauses a job on the laptop CPU; dropping the cap resumes it.
    def sim_job(name, seconds):
        return {"name": name, "model": MLP, "training": TRAINING, "constraints": {"devices": ["sim:laptop-cpu"]},
                "run": {"command": ["sh", "-c", f"sleep {seconds}"]}}
    capped = coord.submit(sim_job("capped", 3))
    coord.wait_state(capped, ["running"])
    (policies / "20-cap.toml").write_text(CAP)
    coord.proc.send_signal(signal.SIGHUP)
    throttled = coord.wait_state(capped, ["throttled"], 20)
    if not (throttled.get("throttle") or {}).get("paused"):
        raise Failure(f"the capped job is throttled but not paused: {json.dumps(throttled)[:2000]}")
    (policies / "20-cap.toml").unlink()
    coord.proc.send_signal(signal.SIGHUP)

    # Two jobs on the agent, placed by the coordinator, and a second one on the laptop CPU: each
    # second job starts once Prometheus has scraped the first one's energy, so that the counters'
    # increase shows both.
    def edge_job(i):
        return coord.submit({"name": f"edge-{i}", "model": MLP, "training": TRAINING,
                             "constraints": {"devices": ["edge1/sim:jetson-orin"]},
                             "run": {"command": ["sh", "-c", "sleep 0.5"]}})
    edge = [edge_job(0)]
    for job_id in edge:
        job = coord.wait_state(job_id, ["succeeded"], 40)
        if not job["device"].startswith("edge1/"):
            raise Failure(f"job {job_id} ran on {job['device']}, not on edge1")
    scraped('joule_job_energy_joules_total{node="edge1"}')
    edge.append(edge_job(1))
    done = coord.wait_state(capped, ["succeeded"], 40)
    scraped('joule_job_energy_joules_total{node="coord", device="sim:laptop-cpu"}')
    second = coord.submit(sim_job("after-cap", 0.5))
    for job_id in edge[1:] + [second]:
        coord.wait_state(job_id, ["succeeded"], 40)

    # The cpu's model learns from the probe run until it can estimate a one-layer job; then two
    # such jobs there, a few scrapes apart, each compared with its estimate when it ends.
    def estimable():
        code, answer = coord.call("POST", "/v1/estimate", {"model": LINEAR, "training": TRAINING})
        rows = [r for r in answer.get("estimates", []) if r.get("device") == "cpu"] if code == 200 else []
        return rows and rows[0].get("status") == "ok"
    wait_for("the cpu model estimates a one-layer job (probe run)", estimable, 90, 1.0)
    cpu_jobs = []
    for i in range(2):
        job_id = coord.submit({"name": f"cpu-{i}", "model": LINEAR, "training": TRAINING,
                               "constraints": {"devices": ["cpu"]}, "run": {"command": ["sh", "-c", "sleep 0.5"]}})
        job = coord.wait_state(job_id, ["succeeded"], 40)
        estimate = [r for r in job.get("estimate") or [] if r.get("device") == "cpu"]
        if not estimate or estimate[0].get("status") != "ok" or (job.get("energy") or {}).get("source") != "modelled":
            raise Failure(f"cpu job {job_id}: no ok estimate or not modelled: {json.dumps(job)[:2000]}")
        cpu_jobs.append(job_id)
        scraped(f'joule_estimate_relative_error_count{{device="cpu"}} >= {i + 1}')
    # The error is observed when the job ends, its state once that end is committed: a scrape
    # between the two shows the last job still running. Wait for a scrape of the committed state.
    scraped(f'joule_jobs{{instance="{coord.url.split("//")[1]}", state="succeeded"}} == 6')
    events = [e["message"] for e in done.get("events", [])]
    return {"throttled": capped, "events": events, "edge": edge, "cpu": cpu_jobs}


# ------------------------------------------------------------------- 4. dashboards, rules
def label_values(definition, values):
    """Grafana's label_values(selector, label) / label_values(label) through /api/v1/series."""
    m = re.fullmatch(r"\s*label_values\((?:(.*),)?\s*(\w+)\s*\)\s*", definition)
    if not m:
        raise Failure(f"variable query {definition!r}: only label_values(...) is resolved by this test")
    selector, label = m.group(1), m.group(2)
    selector = substitute(selector, values) if selector else f'{{{label}!=""}}'
    code, answer = prom_get("/api/v1/series", {"match[]": selector, "start": time.time() - 600, "end": time.time()})
    if code != 200 or answer.get("status") != "success":
        raise Failure(f"variable query {definition!r} ({selector}): HTTP {code}: {answer}")
    return sorted({s[label] for s in answer["data"] if label in s})


def regex_escape(value):
    # Grafana escapes regex characters in values of multi-value variables for Prometheus.
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", value)


def substitute(expr, values):
    def one(m):
        name = m.group(1) or m.group(2)
        if name in BUILTINS:
            return BUILTINS[name]
        if name not in values:
            raise Failure(f"{expr!r}: variable ${name} has no value")
        return values[name]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


def resolve_variables(board, expected):
    """Each query variable in order: its values as Grafana would list them, checked against what
    the test expects; single-value variables take the expected choice, multi-value ones All."""
    values = {}
    for v in board["templating"]["list"]:
        if v["type"] != "query":
            continue
        options = label_values(v["definition"], values)
        want = expected[v["name"]]
        if v.get("multi"):
            if sorted(options) != sorted(want):
                raise Failure(f"{board['uid']}: variable {v['name']} lists {options}, expected {sorted(want)}")
            values[v["name"]] = "(" + "|".join(regex_escape(o) for o in options) + ")"
        else:
            choice, listed = want
            if sorted(options) != sorted(listed) or choice not in options:
                raise Failure(f"{board['uid']}: variable {v['name']} lists {options}, expected {sorted(listed)}")
            values[v["name"]] = choice
    return values


def check_panels(boards, expectations, known):
    """Every query of every panel: parses and returns finite data (retried while Prometheus
    catches up with the last scrapes). Their results by (dashboard uid, panel title, refId)."""
    results = {}
    pending = []
    for name, board in boards.items():
        values = resolve_variables(board, expectations[board["uid"]])
        for panel in panels_of(board):
            for t in panel.get("targets", []):
                expr = substitute(t["expr"], values)
                missing = metric_names(expr) - known
                if missing:
                    raise Failure(f"{name}: panel '{panel['title']}' names metrics jouled does not export: "
                                  f"{sorted(missing)}\n  {expr}")
                pending.append(((board["uid"], panel["title"], t["refId"]), expr))
    deadline = time.monotonic() + 20
    last = {}
    while pending:
        still = []
        for key, expr in pending:
            where = f"{key[0]}: panel '{key[1]}' query {key[2]}"
            result, error = instant(expr)
            if error and error.startswith(("HTTP 400", "HTTP 422")):  # parse, evaluation: no matter of time
                raise Failure(f"{where} does not parse or evaluate: {error}\n  {expr}")
            if result is not None and finite(result):
                if VERBOSE:
                    shown = ", ".join(f"{fmt_labels(r['metric'])}={float(r['value'][1]):.4g}" for r in finite(result)[:4])
                    print(f"{where}: {len(result)} series: {shown}")
                results[key] = result
                continue
            last[key] = error or f"{len(result)} series, none finite: {result[:3]}"
            still.append((key, expr))
        pending = still
        if pending and time.monotonic() >= deadline:
            raise Failure("panel queries without data:\n" +
                          "\n".join(f"  {k[0]}: panel '{k[1]}' query {k[2]}: {last[k]}\n    {e}" for k, e in pending))
        if pending:
            time.sleep(1)
    return results


# What the workload must show, beyond "some data": (dashboard, panel, query, the series' labels,
# a test of its value, what it means).
def positive(v):
    return v > 0


SHOWN = [
    ("joule-node", "Power per device", "A", {"device": "cpu", "source": "modelled"}, positive, "cpu power"),
    ("joule-node", "Power per device", "A", {"device": "sim:laptop-cpu", "source": "simulated"}, positive,
     "laptop CPU power"),
    ("joule-node", "Energy of finished jobs in the time range", "A", {"device": "cpu"}, positive, "cpu jobs' energy"),
    ("joule-node", "Energy of finished jobs in the time range", "A", {"device": "sim:laptop-cpu"}, positive,
     "two laptop CPU jobs' energy"),
    ("joule-node", "Grid carbon intensity", "A", {"node": "coord"}, lambda v: v == 300, "the constant 300 g/kWh"),
    ("joule-node", "Carbon of finished jobs in the time range", "A", {"device": "sim:laptop-cpu"}, positive,
     "two laptop CPU jobs' grams"),
    ("joule-node", "Cost of finished jobs in the time range", "A", {"device": "sim:laptop-cpu", "currency": "EUR"},
     positive, "two laptop CPU jobs' cost at the constant 0.25 EUR/kWh"),
    ("joule-node", "Budget used in its current window", "A", {"budget": "coord-daily"}, positive, "budget spent"),
    ("joule-node", "Budget used in its current window", "A", {"budget": "cluster-hourly"}, positive, "budget spent"),
    ("joule-node", "Budget used in its current window", "A", {"budget": "coord-grams"}, positive,
     "a budget in grams spent"),
    ("joule-node", "Budget used in its current window", "A", {"budget": "coord-money", "currency": "EUR"}, positive,
     "a budget in money spent"),
    ("joule-node", "Jobs now", "A", {"state": "succeeded"}, lambda v: v == 6, "the 6 jobs succeeded"),
    ("joule-node", "Jobs compared with their estimate in the time range", "A", {"device": "cpu"}, positive,
     "cpu jobs compared with their estimates"),
    # One sample is enough for an estimate (its kind's prior; three for its GP).
    ("joule-node", "Model samples by layer", "A", {"device": "cpu", "layer": "linear@output"}, lambda v: v >= 1,
     "probe samples of linear@output"),
    ("joule-node", "Probe outcomes in the time range", "A", {"device": "cpu", "outcome": "completed"}, positive,
     "completed probes"),
    ("joule-node", "Probe energy in the time range", "A", {"device": "cpu", "source": "modelled"}, positive,
     "probe energy"),
    ("joule-node", "Throttling actions in the time range", "A", {"action": "pause"}, positive, "the cap's pause"),
    ("joule-node", "Throttling actions in the time range", "A", {"action": "resume"}, positive, "the resume"),
    ("joule-cluster", "Agents by state", "A", {"state": "ready"}, lambda v: v == 1, "edge1 ready"),
    ("joule-cluster", "Nodes", "B", {"node": "edge1"}, lambda v: v == 1, "edge1 scraped"),
    ("joule-cluster", "Power per node", "A", {"node": "edge1"}, positive, "edge1's power"),
    ("joule-cluster", "Energy of finished jobs per node in the time range", "A",
     {"node": "edge1", "source": "simulated"}, positive, "two edge1 jobs' energy"),
    ("joule-cluster", "Throttling actions per node", "A", {"node": "coord", "action": "pause"}, positive,
     "the cap's pause"),
    ("joule-cluster", "Model samples per device", "A", {"node": "edge1", "device": "sim:jetson-orin"}, positive,
     "edge1's model"),
]


def check_shown(results):
    for uid, title, ref, labels, test, meaning in SHOWN:
        result = results.get((uid, title, ref))
        if result is None:
            raise Failure(f"{uid}: no panel '{title}' with a query {ref}")
        values = [float(r["value"][1]) for r in result if labels.items() <= r["metric"].items()]
        if len(values) != 1 or not test(values[0]):
            raise Failure(f"{uid}: panel '{title}' query {ref} should show {meaning} ({labels}): "
                          f"{[(fmt_labels(r['metric']), r['value'][1]) for r in result]}")


def check_alerts(alerts, known):
    for rule in alerts:
        missing = metric_names(rule["expr"]) - known
        if missing:
            raise Failure(f"alert {rule['alert']} names metrics jouled does not export: {sorted(missing)}")
        result, error = instant(rule["expr"])
        if result is None:
            raise Failure(f"alert {rule['alert']}: expression does not parse or evaluate: {error}")

    # Prometheus evaluates the loaded rules itself every second: each must be healthy ("unknown"
    # until its first evaluation, "err" with lastError when it fails).
    def evaluated():
        code, answer = prom_get("/api/v1/rules", {})
        rules = [r for g in answer["data"]["groups"] for r in g["rules"]]
        if len(rules) != len(alerts):
            raise Failure(f"Prometheus loaded {len(rules)} rules from {RULES}, the file has {len(alerts)}")
        failed = [f"{r['name']}: {r.get('lastError', '')}" for r in rules if r.get("health") == "err"]
        if failed:
            raise Failure("rules that Prometheus fails to evaluate:\n  " + "\n  ".join(failed))
        return rules if all(r.get("health") == "ok" for r in rules) else None
    rules = wait_for("Prometheus evaluating every rule", evaluated, 15)
    return sorted({f"{a['labels']['alertname']} {a['state']}" for r in rules for a in r.get("alerts", [])})


def check_test_series(known):
    """The unit tests' input series carry the label names of the live series (plus instance and
    job), so the rules are tested against series shaped like jouled's."""
    tests = yaml.safe_load(RULE_TESTS.read_text())
    live = {}
    for test in tests["tests"]:
        for item in test["input_series"]:
            m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}", item["series"].strip())
            if not m:
                raise Failure(f"{RULE_TESTS.name}: series {item['series']!r} is not name{{labels}}")
            name, labels = m.group(1), set(re.findall(r'(\w+)\s*=\s*"', m.group(2)))
            if name not in known:
                raise Failure(f"{RULE_TESTS.name}: series {name} is not a metric jouled exports")
            if name not in live:
                code, answer = prom_get("/api/v1/series", {"match[]": name})
                live[name] = set().union(*[set(s) for s in answer["data"]]) - {"__name__"}
            if labels != live[name]:
                raise Failure(f"{RULE_TESTS.name}: {item['series']} has labels {sorted(labels)}; "
                              f"jouled's {name} has {sorted(live[name])}")


# ---------------------------------------------------------------------------------- main
def main():
    global TMP, JOULED, yaml
    if len(sys.argv) != 2:
        raise Failure(f"usage: {sys.argv[0]} /path/to/jouled")
    JOULED = sys.argv[1]
    if not os.access(JOULED, os.X_OK):
        raise Failure(f"jouled binary {JOULED!r} is missing or not executable")
    for tool in (PROMETHEUS, PROMTOOL):
        if not shutil.which(tool):
            raise Failure(f"{tool!r} not found in PATH (Debian: apt-get install prometheus)")
    try:
        import yaml as _yaml
    except ImportError:
        raise Failure("PyYAML is missing (Debian: apt-get install python3-yaml)")
    yaml = _yaml
    here = Path(JOULED).resolve().parent
    if not any(os.access(p, os.X_OK) for p in (here / "joule-worker", here.parent / "worker" / "joule-worker")) \
            and not shutil.which("joule-worker"):
        print(f"SKIPPED {NAME}: no joule-worker beside {JOULED} or on PATH: the cpu cannot be probed, so no "
              "estimate error or probe series (build with JOULE_BUILD_WORKER)")
        return 77

    alerts = check_rules_statically()
    boards = check_dashboards_statically()
    check_provisioning()

    TMP = tempfile.mkdtemp(prefix="joule-dashboards.")
    os.chmod(TMP, 0o755)  # jobs run under accounts of their own and must enter their directories
    coord, agent, policies = start_cluster()
    start_prometheus([coord.url.split("//")[1], agent.url.split("//")[1]])
    # Counters the workload raises from 0 must be scraped at 0 first, or increase() misses it.
    scraped('count(joule_throttle_actions_total{action="pause"} == 0) == 2')
    ran = workload(coord, agent, policies)
    if not any(m.startswith("pause: power cap tiny") for m in ran["events"]):
        raise Failure(f"the capped job's events name no pause by the cap: {ran['events']}")

    known = set(wait_for("metric names in Prometheus",
                         lambda: prom_get("/api/v1/label/__name__/values", {})[1]["data"], 10))
    coord_target = coord.url.split("//")[1]
    expectations = {
        "joule-node": {"node": ("coord", ["coord", "edge1"]), "instance": (coord_target, [coord_target]),
                       "device": ["cpu", "sim:laptop-cpu"]},
        "joule-cluster": {"coordinator": (coord_target, [coord_target]), "node": ["coord", "edge1"],
                          "device": ["cpu", "sim:laptop-cpu", "sim:jetson-orin"]},
    }
    results = check_panels(boards, expectations, known)
    check_shown(results)
    firing = check_alerts(alerts, known)
    check_test_series(known)

    panels = sum(1 for b in boards.values() for p in panels_of(b) if p["type"] != "row")
    version = run_tool([PROMETHEUS, "--version"])[1].split("\n")[0]
    print(f"PASS {NAME}: {len(boards)} dashboards, {panels} panels, {len(results)} queries returned data "
          f"({len(SHOWN)} checked against the workload) and "
          f"{len(alerts)} alert rules evaluated (active: {', '.join(firing) or 'none'}) on {version} scraping "
          f"a coordinator and an agent; promtool check/test rules clean; {time.monotonic() - STARTED:.0f} s")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        rc = main()
    except Failure as e:
        print(f"FAIL {NAME}: {e}", file=sys.stderr)
        log_tails()
        rc = 1
    except KeyboardInterrupt:
        print(f"FAIL {NAME}: interrupted", file=sys.stderr)
        rc = 130
    finally:
        cleanup()
    sys.exit(rc)
