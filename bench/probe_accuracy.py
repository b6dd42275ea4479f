#!/usr/bin/env python3
"""Statistics and driving of bench/probe_accuracy.sh (standard library only).

  probe_accuracy.py run --url URL --jouled-pid PID --state-dir DIR ... --out FILE
      one probe run through jouled's API, estimates, whole-model measurements, report, JSON
  probe_accuracy.py report FILE
      prints the report of a JSON file written by `run` again (no measurement)

Joules are whatever `joule-worker` meters; without RAPL/NVML that is the `modelled` meter
(process CPU time x 12 W + wall time x 10 W): a model of energy, not a measurement.
"""

import argparse
import glob
import hashlib
import json
import math
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

IDLE_WATTS = 10.0  # the modelled meter's defaults (jouled.toml [[devices]] and joule-worker)
BUSY_WATTS = 12.0


def log(message):
    print(f"[probe_accuracy {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- machine load

def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def cpu_ticks():
    """(busy, total, steal) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = v[0] + v[1] + v[2] + v[5] + v[6]
    return busy, busy + v[3] + v[4] + v[7], v[7]


def proc_ticks(pid):
    """utime+stime+cutime+cstime of a process (its reaped children included), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(fields[i]) for i in (11, 12, 13, 14))
    except OSError:
        return None


class CpuWindow:
    """CPU used by other processes than ours over a window, in % of all CPUs."""

    def __init__(self, own_ticks):
        self.own_ticks = own_ticks  # callable: jiffies of our processes so far
        self.t0 = time.time()
        self.busy0, self.total0, self.steal0 = cpu_ticks()
        self.own0 = own_ticks()
        self.load0 = loadavg()

    def close(self):
        busy, total, steal = cpu_ticks()
        own = self.own_ticks()
        d_total = max(1, total - self.total0)
        d_own = max(0, (own or 0) - (self.own0 or 0))
        d_busy = busy - self.busy0
        return {
            "seconds": round(time.time() - self.t0, 1),
            "cpus": os.cpu_count(),
            "busy_percent": round(100.0 * d_busy / d_total, 1),
            "ours_percent": round(100.0 * d_own / d_total, 1),
            "others_percent": round(100.0 * max(0, d_busy - d_own) / d_total, 1),
            "steal_percent": round(100.0 * (steal - self.steal0) / d_total, 1),
            "loadavg_before": self.load0,
            "loadavg_after": loadavg(),
        }


# ---------------------------------------------------------------- jouled API

def api(url, method="GET", body=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return json.loads(reply.read().decode())
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{method} {url}: HTTP {e.code}: {e.read().decode()[:2000]}")


def cpu_device(base):
    for device in api(base + "/v1/devices")["devices"]:
        if device["name"] == "cpu":
            return device
    raise SystemExit("jouled has no cpu device")


def read_state(state_dir):
    """Probe samples and runs from jouled's SQLite state (read-only)."""
    path = os.path.join(state_dir, "jouled.db")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    samples = []
    for row in db.execute(
        "select id, at_ms, layer_key, joules_per_step, seconds_per_step, source, detail from probe_samples "
        "where device = 'cpu' order by id"
    ):
        detail = json.loads(row[6])
        samples.append(
            {
                "id": row[0],
                "at_ms": row[1],
                "key": row[2],
                "joules_per_step": row[3],
                "seconds_per_step": row[4],
                "source": row[5],
                "features": detail.get("features", {}),
                "target": detail.get("target", {}),
                "networks": detail.get("networks", []),
            }
        )
    snapshot = db.execute("select version, snapshot, meta from model_snapshots where device = 'cpu'").fetchone()
    model = None
    if snapshot:
        saved = json.loads(snapshot[1])
        model = {
            "version": snapshot[0],
            "dropped": saved.get("dropped"),
            "joules_per_flop": (saved["flops_sum_xy"] / saved["flops_sum_xx"]) if saved.get("flops_sum_xx") else None,
            "keys": {name: len(entry.get("x", [])) for name, entry in saved.get("models", {}).items()},
        }
    db.close()
    return samples, model


def target_id(layer_spec, input_shape, batch, position):
    return json.dumps([layer_spec, list(input_shape), int(batch), position], sort_keys=True)


# ---------------------------------------------------------------- measuring

CHILD = None  # the joule-worker running now: stopped with this script (SIGTERM from probe_accuracy.sh)


def on_term(signum, frame):
    if CHILD is not None and CHILD.poll() is None:
        CHILD.kill()
        CHILD.wait()
    raise SystemExit(128 + signum)


def run_worker(cmd):
    global CHILD
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    CHILD = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = CHILD.communicate(timeout=900)
    code, CHILD = CHILD.returncode, None
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({code}): {err.strip()[-1000:]}")
    return json.loads(out)


def worker_measure(worker, spec_file, batch, steps, warmup, repetitions):
    cmd = [worker, "measure", "--model", spec_file, "--batch-size", str(batch), "--steps", str(steps),
           "--warmup", str(warmup), "--repetitions", str(repetitions), "--threads", "1", "--json"]
    return cmd, run_worker(cmd)


def children_ticks():
    t = os.times()
    return int(round((t.children_user + t.children_system) * os.sysconf("SC_CLK_TCK")))


# ---------------------------------------------------------------- statistics

def rel(estimate, truth):
    return (estimate - truth) / truth


def pct(x, digits=1):
    return "-" if x is None else f"{100.0 * x:+.{digits}f}%"


def mape(errors):
    errors = [abs(e) for e in errors if e is not None]
    return statistics.fmean(errors) if errors else None


def cpu_share(joules_per_step, seconds_per_step):
    """CPU seconds per wall second behind a modelled reading (1.0 = one thread never descheduled)."""
    if not seconds_per_step:
        return None
    return (joules_per_step - IDLE_WATTS * seconds_per_step) / BUSY_WATTS / seconds_per_step


def analyse(data):
    rows = data["rows"]
    samples = data["probe_samples"]
    exact = {}
    for s in samples:
        t = s["target"]
        if not t:
            continue
        layer = dict(t["layer"])
        exact.setdefault(target_id(layer, t["input_shape"], t["batch_size"], t["position"]), []).append(s)

    gp_errors, flops_errors, seconds_errors, within = [], [], [], []
    oracle_errors, gp_vs_sample = [], {}
    for row in rows:
        truth = row["measured"]["joules_per_step"]
        est = row.get("estimate") or {}
        row["flags"] = []
        if est.get("status") != "ok":
            row["flags"].append("no-model")
            row["gp_error"] = row["flops_error"] = None
        else:
            mean = est["joules_per_step"]["mean"]
            std = est["joules_per_step"]["std"]
            row["gp_error"] = rel(mean, truth)
            row["flops_error"] = rel(est["baseline"]["joules"] / max(1, est["steps"]), truth)
            row["within_2sigma"] = abs(mean - truth) <= 2.0 * std
            row["seconds_error"] = rel(est["seconds"]["mean"] / max(1, est["steps"]), row["measured"]["seconds_per_step"])
            if est.get("warnings"):
                row["flags"].append("extrapolated")
            gp_errors.append(row["gp_error"])
            flops_errors.append(row["flops_error"])
            seconds_errors.append(row["seconds_error"])
            within.append(row["within_2sigma"])
        # Oracle: the sum of the probe samples of exactly this network's layer configurations
        # (no GP): what the decomposition alone gives where the planner probed every layer.
        layers = (est.get("layers") if est.get("status") == "ok" else None) or []
        spec_layers = row["spec"]["layers"]
        shapes = {layer["index"]: layer["input_shape"] for layer in row["analysis_layers"]}
        covered, needed, total, per_layer = 0, 0, 0.0, []
        for layer in layers:
            key = layer["model"]
            if layer["joules_per_step"]["mean"] == 0.0 and layer["joules_per_step"]["std"] == 0.0:
                continue  # a view (flatten): no work of its own
            needed += 1
            position = key.split("@", 1)[1]
            found = exact.get(target_id(spec_layers[layer["index"]], shapes[layer["index"]], row["batch"], position))
            if found:
                covered += 1
                value = statistics.median(s["joules_per_step"] for s in found)
                total += value
                per_layer.append({"index": layer["index"], "key": key, "sample": value,
                                  "gp": layer["joules_per_step"]["mean"], "gp_std": layer["joules_per_step"]["std"]})
                if value > 0:
                    gp_vs_sample.setdefault(key, []).append(math.log(layer["joules_per_step"]["mean"] / value))
        row["exact_layers"] = {"covered": covered, "needed": needed, "layers": per_layer}
        if needed and covered == needed:
            row["oracle_joules_per_step"] = total
            row["oracle_error"] = rel(total, truth)
            oracle_errors.append(row["oracle_error"])
        else:
            row["oracle_joules_per_step"] = row["oracle_error"] = None

    probe_networks = [n for s in samples for n in s["networks"]]
    spreads = [n["joules_spread"] for n in probe_networks if "joules_spread" in n]
    by_key, by_batch = {}, {}
    previous = data["probe_run"]["started_ms"]
    for s in samples:
        # Wall time from the previous sample to this one: the probe's cost (process start,
        # warm-up, readings of 1-4 networks) plus the daemon's gaps; only approximately.
        spent = max(0.0, (s["at_ms"] - previous) / 1000.0)
        previous = s["at_ms"]
        entry = by_key.setdefault(s["key"], {"samples": 0, "non_positive": 0, "probe_seconds": 0.0})
        entry["samples"] += 1
        entry["non_positive"] += s["joules_per_step"] <= 0 or s["seconds_per_step"] <= 0
        entry["probe_seconds"] += spent
        batch = str(s["target"].get("batch_size", "?"))
        b = by_batch.setdefault(batch, {"samples": 0, "probe_seconds": 0.0})
        b["samples"] += 1
        b["probe_seconds"] += spent
    for key, logs in gp_vs_sample.items():
        by_key.setdefault(key, {"samples": 0, "non_positive": 0, "probe_seconds": 0.0})
        by_key[key]["gp_over_sample_median"] = math.exp(statistics.median(logs)) - 1.0
        by_key[key]["gp_vs_sample_layers"] = len(logs)
    measured_shares = [cpu_share(r["measured"]["joules_per_step"], r["measured"]["seconds_per_step"]) for r in rows]
    probe_shares = [cpu_share(n["joules_per_step"], n["seconds_per_step"]) for n in probe_networks
                    if n.get("seconds_per_step")]
    worst = max((r for r in rows if r.get("gp_error") is not None), key=lambda r: abs(r["gp_error"]), default=None)
    gp_mape, flops_mape = mape(gp_errors), mape(flops_errors)
    data["summary"] = {
        "rows": len(rows),
        "estimated_rows": len(gp_errors),
        "no_model_rows": sum("no-model" in r["flags"] for r in rows),
        "extrapolated_rows": sum("extrapolated" in r["flags"] for r in rows),
        "gp_mape": gp_mape,
        "flops_mape": flops_mape,
        "flops_over_gp_mape": (flops_mape / gp_mape) if gp_mape else None,
        "gp_mean_signed_error": statistics.fmean(gp_errors) if gp_errors else None,
        "gp_median_abs_error": statistics.median([abs(e) for e in gp_errors]) if gp_errors else None,
        "gp_worst": None if worst is None else {"network": worst["network"], "batch": worst["batch"],
                                                "error": worst["gp_error"]},
        "gp_within_10_percent": sum(abs(e) <= 0.10 for e in gp_errors),
        "within_2sigma_share": (sum(within) / len(within)) if within else None,
        "seconds_mape": mape(seconds_errors),
        "probe_seconds": data["probe_run"]["probe_seconds"],
        "probe_run_wall_seconds": (data["probe_run"]["finished_ms"] - data["probe_run"]["started_ms"]) / 1000.0,
        "probes": data["probe_run"]["probes"],
        "probe_failures": data["probe_run"]["failed"],
        "probe_samples": len(samples),
        "oracle": {"rows_fully_covered": len(oracle_errors), "mape": mape(oracle_errors),
                   "mean_signed_error": statistics.fmean(oracle_errors) if oracle_errors else None},
        "probe_noise": {
            "networks_measured": len(probe_networks),
            "median_joules_spread": statistics.median(spreads) if spreads else None,
            "networks_spread_over_10_percent": sum(x > 0.10 for x in spreads),
            "median_cpu_share": statistics.median(probe_shares) if probe_shares else None,
        },
        "probe_seconds_by_batch": by_batch,
        "measure_noise": {
            "median_round_spread": statistics.median(r["measured"]["round_spread"] for r in rows),
            "max_round_spread": max(r["measured"]["round_spread"] for r in rows),
            "median_cpu_share": statistics.median(x for x in measured_shares if x is not None),
        },
        "by_key": by_key,
    }
    return data


def report(data, out=sys.stdout):
    s = data["summary"]
    p = lambda *a: print(*a, file=out)  # noqa: E731
    source = data["rows"][0]["measured"]["source"] if data["rows"] else "?"
    p("")
    p(f"Probe accuracy on `cpu` ({data['environment'].get('device_name', '?')}, {data['environment'].get('torch', '?')}, "
      f"1 thread) -- joules from the `{source}` meter"
      + ("" if data["rows"] and data["rows"][0]["measured"].get("measured") else
         " (process CPU time x 12 W + wall x 10 W): a MODEL of energy, not a measurement"))
    for name, b in data.get("binaries", {}).items():
        p(f"{name}: sha256 {b['sha256'][:12]}, built {b['built']} (UTC); git HEAD at start: "
          f"{data.get('git_head_at_start', '?')}")
    p(f"probe run {data['probe_run']['id']}: requested {data['probe_run']['requested_seconds']:.0f} s, "
      f"{s['probes']} probes ({s['probe_failures']} failed), {s['probe_seconds']:.1f} s in probes, "
      f"run wall {s['probe_run_wall_seconds']:.1f} s; model v{data['model'].get('version')} from {s['probe_samples']} samples")
    p("")
    head = (f"{'network':<18} {'batch':>5} {'measured J/step':>15} {'GP J/step ± std':>23} {'GP err':>8} "
            f"{'FLOPs err':>9} {'in 2σ':>5} {'oracle':>8} {'s err':>7}  flags")
    p(head)
    p("-" * len(head))
    for r in data["rows"]:
        m = r["measured"]
        est = r.get("estimate") or {}
        if est.get("status") == "ok":
            e = est["joules_per_step"]
            gp = f"{e['mean']:.4g} ± {e['std']:.2g}"
            in2 = "yes" if r["within_2sigma"] else "no"
        else:
            gp, in2 = "no model", "-"
        flags = ",".join(r["flags"])
        cov = r["exact_layers"]
        if cov["needed"] and cov["covered"] < cov["needed"]:
            flags += ("," if flags else "") + f"probed {cov['covered']}/{cov['needed']} layers exactly"
        p(f"{r['network']:<18} {r['batch']:>5} {m['joules_per_step']:>11.4g} ±{100 * m['round_spread']:>2.0f}% "
          f"{gp:>23} {pct(r['gp_error']):>8} {pct(r['flops_error']):>9} {in2:>5} {pct(r['oracle_error']):>8} "
          f"{pct(r.get('seconds_error'), 0):>7}  {flags}")
    p("")
    fmt = lambda x: "-" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    p(f"GP MAPE {fmt(s['gp_mape'])} (median |error| {fmt(s['gp_median_abs_error'])}, mean signed "
      f"{pct(s['gp_mean_signed_error'])}, {s['gp_within_10_percent']}/{s['estimated_rows']} within ±10 %)")
    p(f"FLOPs baseline MAPE {fmt(s['flops_mape'])}; ratio FLOPs MAPE / GP MAPE = "
      + ("-" if s["flops_over_gp_mape"] is None else f"{s['flops_over_gp_mape']:.2f}"))
    if s["gp_worst"]:
        w = s["gp_worst"]
        p(f"worst GP error {pct(w['error'])} ({w['network']}, batch {w['batch']})")
    p(f"within the GP's own 2σ: {fmt(s['within_2sigma_share'])} of {s['estimated_rows']} estimates; "
      f"no-model rows {s['no_model_rows']}, rows with extrapolation warnings {s['extrapolated_rows']}")
    if not s["estimated_rows"]:
        p(f"NO ESTIMATES: a (layer kind, position) gets a GP only from 3 probe samples on, and the planner "
          f"first seeds every kind the workload needs ({len(s['by_key'])} here) before it refines any; this run "
          f"ended after {s['probes']} probes. Probe longer (the seeds took ~45 probes, ~400 s, on the 2-core VM).")
    p(f"seconds per step (GP time model) MAPE {fmt(s['seconds_mape'])}")
    p(f"probing: {s['probe_seconds']:.1f} s in {s['probes']} probes (one run of {data['probe_run']['requested_seconds']:.0f} s)")
    o = s["oracle"]
    p(f"oracle (sum of the exact layer configurations' probe samples, no GP): {o['rows_fully_covered']} rows fully "
      f"covered, MAPE {fmt(o['mape'])}, mean signed {pct(o['mean_signed_error'])}")
    n = s["probe_noise"]
    p(f"probe readings: {n['networks_measured']} probe networks, median spread (max-min)/median "
      f"{fmt(n['median_joules_spread'])}, {n['networks_spread_over_10_percent']} over 10 %; CPU/wall "
      f"{n['median_cpu_share']:.3f}")
    p("probe time by batch size (approx.): " + ", ".join(
        f"b{b}: {e['samples']} probes {e['probe_seconds']:.0f} s" for b, e in
        sorted(s["probe_seconds_by_batch"].items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0)))
    mn = s["measure_noise"]
    p(f"whole-model readings: median spread across rounds {fmt(mn['median_round_spread'])} "
      f"(max {fmt(mn['max_round_spread'])}), CPU/wall {mn['median_cpu_share']:.3f}")
    for phase in ("probing", "measuring"):
        w = data["load"].get(phase)
        if w:
            p(f"load while {phase}: {w['seconds']:.0f} s, loadavg {w['loadavg_before'][0]:.2f} -> "
              f"{w['loadavg_after'][0]:.2f}; machine busy {w['busy_percent']:.0f} % of {w['cpus']} CPUs, "
              f"ours {w['ours_percent']:.0f} %, others {w['others_percent']:.0f} %"
              + ("  (DISTURBED: others > 10 %)" if w["others_percent"] > 10 else ""))
    p("")
    p(f"{'layer model':<34} {'samples':>7} {'<=0 J':>6} {'probe s':>8} {'GP/sample-1 (exact configs)':>28}")
    for key, e in sorted(s["by_key"].items()):
        g = e.get("gp_over_sample_median")
        gp_text = "-" if g is None else f"{100 * g:+.1f}% ({e['gp_vs_sample_layers']} layers)"
        p(f"{key:<34} {e['samples']:>7} {e['non_positive']:>6} {e.get('probe_seconds', 0.0):>8.0f} {gp_text:>28}")


# ---------------------------------------------------------------- the run

def run(args):
    base = args.url.rstrip("/")
    batches = [int(b) for b in args.batches.split(",") if b]
    specs = []
    for path in sorted(glob.glob(os.path.join(args.models, "*.json"))):
        with open(path) as f:
            spec = json.load(f)
        specs.append((path, spec.get("name") or os.path.basename(path)[:-5], spec))
    data = {"benchmark": "probe_accuracy", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "quick": args.quick, "batches": batches, "networks": [n for _, n, _ in specs], "load": {}}

    data["binaries"] = {}
    for name, path, source in (("jouled", args.jouled_bin, args.source_jouled),
                               ("joule-worker", args.worker, args.source_worker)):
        if path and os.path.exists(path):
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            data["binaries"][name] = {"sha256": digest, "copied_from": source,
                                      "built": time.strftime("%Y-%m-%dT%H:%M:%S",
                                                             time.gmtime(os.path.getmtime(source or path)))}
    try:
        head = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "log", "-1",
                               "--format=%h %ci %s"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = ""
    data["git_head_at_start"] = head
    own = lambda: proc_ticks(args.jouled_pid)  # noqa: E731  jouled + its reaped probe processes
    window = CpuWindow(own)
    models = [{"model": spec, "training": {"batch_size": b, "samples_per_epoch": b, "epochs": 1}}
              for _, _, spec in specs for b in batches]
    body = {"device": "cpu", "seconds": args.seconds, "models": models}
    started = api(base + "/v1/probes", "POST", body)
    run_id = started["id"]
    log(f"probe run {run_id}: {args.seconds:.0f} s on cpu, learning the layers of {len(specs)} networks x "
        f"batches {batches} (no whole held-out network is trained while probing)")
    last = time.time()
    while True:
        time.sleep(2)
        current = api(f"{base}/v1/probes/{run_id}")
        if current["state"] != "running":
            break
        if time.time() - last >= 60:
            last = time.time()
            log(f"  {current['probes']} probes, {current['probe_seconds']:.0f} s in probes, {current['failed']} failed")
    log(f"probe run {current['state']}: {current['message']}; {current['probes']} probes in "
        f"{current['probe_seconds']:.1f} s")
    # The end of the run forces a refit of the GPs: wait until the model jouled serves holds
    # every kept sample (a non-positive sample is dropped and never counted).
    deadline = time.time() + 300
    device = cpu_device(base)
    while time.time() < deadline:
        samples, _ = read_state(args.state_dir)
        kept = sum(1 for s in samples if s["joules_per_step"] > 0 and s["seconds_per_step"] > 0)
        device = cpu_device(base)
        model = device.get("model", {})
        if model.get("state") == "ready" and model.get("samples", 0) >= kept and \
                model.get("probing", {}).get("state") != "probing":
            break
        time.sleep(1)
    else:
        log("WARNING: the model did not catch up with the stored samples in 300 s; estimating anyway")
    data["load"]["probing"] = window.close()
    data["probe_run"] = current
    data["device"] = device

    data["rows"] = []
    for path, name, spec in specs:
        for b in batches:
            answer = api(base + "/v1/estimate", "POST",
                         {"model": spec, "training": {"batch_size": b, "samples_per_epoch": b, "epochs": 1},
                          "devices": ["cpu"]})
            est = answer["estimates"][0] if answer["estimates"] else {"status": "no-model", "detail": "no row"}
            data["rows"].append({"network": name, "file": os.path.abspath(path), "batch": b, "spec": spec,
                                 "flops_per_step": answer["model"]["flops_per_step"],
                                 "analysis_layers": answer["model"]["layers"], "estimate": est})
    samples, model = read_state(args.state_dir)
    data["probe_samples"] = samples
    data["model"] = model or {}
    try:
        with open(args.jouled_log) as f:
            data["jouled_warnings"] = [line.rstrip() for line in f if " warn" in line or " error" in line]
    except OSError:
        data["jouled_warnings"] = []

    # Stop jouled before measuring: its estimates are taken, and then nothing of this benchmark
    # runs beside the whole-model measurements (an idle jouled costs little, but not nothing:
    # its meter thread and ticks wake it every second).
    os.kill(args.jouled_pid, signal.SIGTERM)
    for _ in range(100):
        if proc_ticks(args.jouled_pid) is None:
            break
        time.sleep(0.1)
    log("jouled stopped; measuring every network x batch whole with joule-worker measure")

    cfg = {"steps_per_repetition": 20, "warmup_steps": 10, "repetitions": 5}  # [probing] defaults
    data["probe_config"] = cfg
    window = CpuWindow(children_ticks)
    # Calibration: steps per reading so that one reading lasts at least --min-reading seconds.
    for row in data["rows"]:
        _, result = worker_measure(args.worker, row["file"], row["batch"], 5, 3, 1)
        sps = result["networks"][0]["seconds_per_step"]
        row["measure_steps"] = max(5, math.ceil(args.min_reading / max(sps, 1e-6)))
        if not data.get("environment"):
            env = result["environment"]
            data["environment"] = {"torch": "torch " + env["torch_version"], "blas": env["blas"],
                                   "device_name": env["device_name"], "fingerprint": env["fingerprint"]}
    # Rounds: every network x batch once per round, in a rotated order (interleaved, so
    # drift hits all alike), each a fresh process (as every probe is), medians of everything.
    readings = {i: [] for i in range(len(data["rows"]))}
    medians = {i: [] for i in range(len(data["rows"]))}
    commands = {}
    for r in range(args.rounds):
        order = list(range(len(data["rows"])))
        shift = (r * 7) % len(order)
        order = order[shift:] + order[:shift]
        if r % 2:
            order.reverse()
        for i in order:
            row = data["rows"][i]
            cmd, result = worker_measure(args.worker, row["file"], row["batch"], row["measure_steps"],
                                         cfg["warmup_steps"], args.repetitions)
            commands[i] = " ".join(cmd)
            net = result["networks"][0]
            readings[i].extend(net["repetitions"])
            medians[i].append(net["joules_per_step"])
            row["meter_source"] = result["meter_source"]
            row["meter_measured"] = result["measured"]
        log(f"  round {r + 1}/{args.rounds} done")
    data["load"]["measuring"] = window.close()
    for i, row in enumerate(data["rows"]):
        joules = [x["joules_per_step"] for x in readings[i]]
        seconds = [x["seconds_per_step"] for x in readings[i]]
        mid = statistics.median(joules)
        row["measured"] = {
            "joules_per_step": mid,
            "seconds_per_step": statistics.median(seconds),
            "readings": readings[i],
            "round_medians": medians[i],
            "round_spread": (max(medians[i]) - min(medians[i])) / mid,
            "steps_per_reading": row["measure_steps"],
            "source": row["meter_source"],
            "measured": row["meter_measured"],
            "command": commands[i],
        }
    data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    analyse(data)
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1)
    report(data)


# ---------------------------------------------------------------- additivity (no jouled, no GP)

def probe_networks(layer, shape, out_shape, dtype, position, loss, classes=10):
    """The probe networks and signs of one layer in one position: thor_probes.hpp's recipe,
    re-stated here (plan_probe) so that a network's own layer configurations can be probed
    exactly, without the planner's variations."""
    def net(in_shape, in_dtype, layers):
        spec = {"name": "probe", "input": {"shape": list(in_shape)}, "layers": layers, "loss": loss}
        if in_dtype != "float":
            spec["input"]["dtype"] = in_dtype
        return spec

    def head(on):
        return ([{"type": "flatten"}] if len(on) != 1 else []) + [{"type": "linear", "out_features": classes}]

    if position == "output":
        return [net(shape, dtype, [layer])], [1]
    if position == "input":
        return [net(shape, dtype, [layer] + head(out_shape)), net(out_shape, "float", head(out_shape))], [1, -1]
    reference = ({"type": "conv2d", "out_channels": shape[0], "kernel_size": 1} if len(shape) == 3
                 else {"type": "linear", "out_features": shape[-1]})
    return ([net(shape, dtype, [reference, layer] + head(out_shape)), net(shape, dtype, [reference] + head(shape)),
             net(shape, dtype, head(shape)), net(out_shape, "float", head(out_shape))], [1, -1, 1, -1])


def worker_probe(worker, networks, batch, workdir, cfg, seed):
    request = {"device": "cpu", "threads": 1, "batch_size": batch, "optimizer": "sgd",
               "warmup_steps": cfg["warmup_steps"], "steps_per_repetition": cfg["steps_per_repetition"],
               "repetitions": cfg["repetitions"], "meter": "auto", "idle_watts": IDLE_WATTS,
               "watts_per_busy_core": BUSY_WATTS, "seed": seed, "networks": networks}
    path = os.path.join(workdir, "request.json")
    with open(path, "w") as f:
        json.dump(request, f)
    return run_worker([worker, "probe", "--request", path])


def additivity(args):
    """Probes every layer of each network exactly as it sits in the network (daemon settings:
    one process per layer, warm-up 10, 5 readings), sums the decomposed layers, and compares the
    sum with the whole network measured by a probe process of the same settings and with the
    `measure` truth of the run: the floor of the method without the GP."""
    import tempfile
    with open(args.file) as f:
        data = json.load(f)
    cfg = data.get("probe_config", {"steps_per_repetition": 20, "warmup_steps": 10, "repetitions": 5})
    wanted = set(args.networks.split(",")) if args.networks else None
    results, seed = [], 1
    window = CpuWindow(children_ticks)
    with tempfile.TemporaryDirectory() as workdir:
        cache = {}
        for row in data["rows"]:
            if row["batch"] != args.batch or (wanted and row["network"] not in wanted):
                continue
            spec, batch = row["spec"], row["batch"]
            layers = row["analysis_layers"]
            est_layers = {l["index"]: l for l in (row["estimate"].get("layers") or [])}
            params_before, parts = 0, []
            for i, a in enumerate(layers):
                free = a["parameters"] == 0 and a["flops_per_step"] == 0 and a["activation_bytes_per_step"] == 0
                position = "output" if i + 1 == len(layers) else ("hidden" if params_before > 0 else "input")
                params_before += a["parameters"]
                if free and position != "output":
                    continue
                layer = spec["layers"][i]
                if layer.get("inputs"):
                    # A join (add, concat, mul) reads named layers: its probe networks would need
                    # the graph around it (thor_probes.hpp builds them; this re-statement does not).
                    # Left out of the sum and listed with probed 0.
                    parts.append({"index": i, "type": layer["type"], "position": position, "probed": 0.0,
                                  "networks": [], "spreads": [], "gp": None, "gp_std": None, "join": True})
                    continue
                dtype = spec["input"].get("dtype", "float") if i == 0 else "float"
                key = json.dumps([layer, a["input_shape"], position], sort_keys=True)
                if key not in cache:
                    nets, signs = probe_networks(layer, a["input_shape"], a["output_shape"], dtype, position,
                                                 spec.get("loss", "cross_entropy"))
                    seed += 1
                    result = worker_probe(args.worker, nets, batch, workdir, cfg, seed)
                    cache[key] = {"joules_per_step": sum(sg * n["joules_per_step"]
                                                         for sg, n in zip(signs, result["networks"])),
                                  "networks": [n["joules_per_step"] for n in result["networks"]],
                                  "spreads": [n["joules_spread"] for n in result["networks"]]}
                e = est_layers.get(i)
                parts.append({"index": i, "type": layer["type"], "position": position,
                              "probed": cache[key]["joules_per_step"], "networks": cache[key]["networks"],
                              "spreads": cache[key]["spreads"],
                              "gp": e["joules_per_step"]["mean"] if e else None,
                              "gp_std": e["joules_per_step"]["std"] if e else None})
            seed += 1
            whole = worker_probe(args.worker, [spec], batch, workdir, cfg, seed)["networks"][0]
            total = sum(p["probed"] for p in parts)
            truth = row["measured"]["joules_per_step"]
            results.append({"network": row["network"], "batch": batch, "layers": parts, "sum_of_layers": total,
                            "whole_probe_process": whole["joules_per_step"], "whole_measure": truth,
                            "gp": row["estimate"]["joules_per_step"]["mean"] if row["estimate"].get("status") == "ok"
                            else None})
            r = results[-1]
            log(f"{row['network']} b{batch}: sum of {len(parts)} layers {total:.4g} J, whole (probe process) "
                f"{whole['joules_per_step']:.4g} J, whole (measure) {truth:.4g} J")
    load = window.close()
    print(f"\nAdditivity at batch {args.batch}: each layer probed exactly where it sits (no GP, no planner), "
          f"summed; joules from the modelled meter")
    print(f"{'network':<18} {'sum/whole(probe)-1':>18} {'whole probe/measure-1':>22} {'sum/measure-1':>14} "
          f"{'GP/measure-1':>13}")
    for r in results:
        print(f"{r['network']:<18} {pct(rel(r['sum_of_layers'], r['whole_probe_process'])):>18} "
              f"{pct(rel(r['whole_probe_process'], r['whole_measure'])):>22} "
              f"{pct(rel(r['sum_of_layers'], r['whole_measure'])):>14} "
              f"{pct(None if r['gp'] is None else rel(r['gp'], r['whole_measure'])):>13}")
    print(f"MAPE of the sum of exact layers against measure: "
          f"{100 * mape([rel(r['sum_of_layers'], r['whole_measure']) for r in results]):.1f} %; "
          f"against the whole network in a probe process: "
          f"{100 * mape([rel(r['sum_of_layers'], r['whole_probe_process']) for r in results]):.1f} %")
    print(f"load: others {load['others_percent']:.0f} % of {load['cpus']} CPUs over {load['seconds']:.0f} s, "
          f"loadavg {load['loadavg_before'][0]:.2f} -> {load['loadavg_after'][0]:.2f}")
    print("\nper layer (J/step): probed exactly vs GP estimate")
    for r in results:
        print(f"  {r['network']} b{r['batch']}:")
        for p in r["layers"]:
            gp = "-" if p["gp"] is None else f"{p['gp']:.4g} ({pct(rel(p['gp'], p['probed']) if p['probed'] > 0 else None)})"
            print(f"    {p['index']:>2} {p['type'] + '@' + p['position']:<34} probed {p['probed']:>10.4g}  GP {gp}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"batch": args.batch, "results": results, "load": load, "probe_config": cfg,
                       "source_run": args.file}, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--url", required=True)
    r.add_argument("--jouled-bin", default="")
    r.add_argument("--source-jouled", default="")
    r.add_argument("--source-worker", default="")
    r.add_argument("--jouled-pid", type=int, required=True)
    r.add_argument("--state-dir", required=True)
    r.add_argument("--jouled-log", default="")
    r.add_argument("--worker", required=True)
    r.add_argument("--models", required=True)
    r.add_argument("--batches", default="16,32,64")
    r.add_argument("--seconds", type=float, default=600)
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--repetitions", type=int, default=5)
    r.add_argument("--min-reading", type=float, default=0.2)
    r.add_argument("--quick", action="store_true")
    r.add_argument("--out", required=True)
    rep = sub.add_parser("report")
    rep.add_argument("file")
    add = sub.add_parser("additivity", help="probe each network's own layers exactly and sum them (no jouled)")
    add.add_argument("file", help="a JSON file written by run")
    add.add_argument("--worker", required=True)
    add.add_argument("--batch", type=int, default=32)
    add.add_argument("--networks", default="", help="comma-separated names (default: all)")
    add.add_argument("--out", default="")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_term)
    if args.command == "run":
        run(args)
    elif args.command == "additivity":
        additivity(args)
    else:
        with open(args.file) as f:
            data = json.load(f)
        report(analyse(data))


if __name__ == "__main__":
    main()
