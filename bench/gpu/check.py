#!/usr/bin/env python3
"""check.py: jouled's estimates against a real meter, end to end, on one device (bench/gpu/check.sh
runs it on a GPU machine; --device cpu runs the same steps here, against the modelled meter).

Standard library only (the GPU machine has PyTorch's Python, not Joule's). In order:
  1. starts jouled on 127.0.0.1 with an empty state, one device (`cuda:N`: meter nvml), probing
     only when asked (no background probes: they would share the meter with the measurements);
  2. measures every network whole with `joule-worker measure` on the device at --batch, each
     reading metered (NVML's total energy counter on a GPU): the "job", in LibTorch, as a
     built-in job runs. Jobs cannot run on a GPU through jouled yet (they run on `cpu`), so the
     worker's measurement stands in for the job's metered energy;
  3. asks jouled for one requested probe run of --probe-seconds on the device, naming every
     network at --batch, and waits for it to end;
  4. asks POST /v1/estimate for each network (runtime none: the worker's loop is LibTorch's) and
     compares joules per step with the measurement, and the FLOPs baseline's with it;
  5. measures the first network again: the machine's own noise, reported beside the errors.
"tuning" networks are examples/models (the estimator was designed looking at them, on CPUs);
"held-out" ones are bench/e2e/nets.py's third set, never read for a design decision.
Writes --out/check.json after every step, so a run cut short still leaves what it measured.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from loopback import call, free_port  # bench/loopback.py  # noqa: E402
from soak import Node  # bench/soak.py: jouled started and stopped  # noqa: E402

TUNING = ("lenet5", "cnn5", "transformer_small", "lstm_classifier")


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def networks(args):
    """[(name, set, spec)]: the tuning examples, then every held-out spec in --held-out."""
    out = [(name, "tuning", json.load(open(os.path.join(REPO, "examples", "models", f"{name}.json"))))
           for name in args.tuning]
    if args.held_out and os.path.isdir(args.held_out):
        for file in sorted(os.listdir(args.held_out)):
            if file.endswith(".json"):
                out.append((file[:-5], "held-out", json.load(open(os.path.join(args.held_out, file)))))
    return out


def measure(args, spec_path):
    command = [args.worker, "measure", "--model", spec_path, "--device", args.device, "--batch-size",
               str(args.batch), "--steps", str(args.measure_steps), "--warmup", "10", "--repetitions",
               str(args.repetitions), "--json"]
    if args.device == "cpu":
        command += ["--threads", "1"]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"joule-worker measure {os.path.basename(spec_path)} exited {result.returncode}: "
                           f"{result.stderr.strip()[-400:]}")
    answer = json.loads(result.stdout)
    network = answer["networks"][0]
    return {"joules_per_step": network["joules_per_step"], "seconds_per_step": network["seconds_per_step"],
            "spread": network.get("joules_spread"), "source": answer.get("meter_source"),
            "measured": answer.get("measured"), "wall_seconds": round(time.monotonic() - started, 1)}


def estimate(port, device, spec, batch, steps):
    status, body = call(port, "POST", "/v1/estimate",
                        {"model": spec, "training": {"batch_size": batch, "epochs": 1, "samples_per_epoch": batch * steps},
                         "devices": [device]})
    if status != 200:
        return {"status": f"HTTP {status}", "detail": str(body)[:300]}
    row = body["estimates"][0]
    if row.get("status") != "ok":
        return {"status": row.get("status"), "detail": row.get("detail")}
    n = max(1, row["steps"])
    layers = row.get("layers") or []
    return {"status": "ok", "source": row["source"], "joules_per_step": row["joules"]["mean"] / n,
            "std_per_step": row["joules"]["std"] / n, "baseline_per_step": row["baseline"]["joules"] / n,
            "flops_per_step": body["model"]["flops_per_step"],
            "sparse_layers": sum(1 for l in layers if l.get("sparse")),
            "extrapolated_layers": sum(1 for l in layers if l.get("extrapolated")), "layers": len(layers),
            "warnings": row.get("warnings", [])}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jouled", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--probe-seconds", type=float, default=240)
    p.add_argument("--probe-reading-seconds", type=float, default=1.0,
                   help="each probe reading's length (NVML's counter needs ~1 s to read within a few %%)")
    p.add_argument("--repetitions", type=int, default=3, help="readings per whole-network measurement")
    p.add_argument("--measure-steps", type=int, default=20)
    p.add_argument("--tuning", nargs="*", default=list(TUNING))
    p.add_argument("--held-out", default=os.path.join(REPO, ".gpu-carry", "specs"))
    p.add_argument("--limit", type=float, default=540, help="watchdog: give up after this many seconds")
    args = p.parse_args()
    args.jouled, args.worker = os.path.abspath(args.jouled), os.path.abspath(args.worker)

    deadline = time.monotonic() + args.limit
    os.makedirs(args.out, exist_ok=True)
    root = tempfile.mkdtemp(prefix="joule-check-")
    os.chmod(root, 0o755)
    report = {"device": args.device, "batch": args.batch, "probe_seconds": args.probe_seconds, "rows": []}

    def save():
        with open(os.path.join(args.out, "check.json"), "w") as f:
            json.dump(report, f, indent=1)

    nets = networks(args)
    spec_of = {name: spec for name, _, spec in nets}
    specs = {}
    for name, _, spec in nets:
        specs[name] = os.path.join(root, f"{name}.json")
        with open(specs[name], "w") as f:
            json.dump(spec, f)
    env_answer = subprocess.run([args.worker, "env", "--device", args.device], capture_output=True, text=True)
    report["worker_env"] = env_answer.stdout.strip()[-2000:] or env_answer.stderr.strip()[-500:]
    log(f"worker: {report['worker_env'][:300]}")

    meter = "nvml" if args.device.startswith("cuda:") else "auto"
    node = Node(os.path.join(REPO, "build"), root, free_port(), jouled=args.jouled,
                config=f'[log]\nlevel = "info"\n[[devices]]\nname = "{args.device}"\nmeter = "{meter}"\n'
                       f'[probing]\nenabled = true\nidle_seconds = 86400\nworker = "{args.worker}"\npython = ""\n'
                       f"reading_seconds = {args.probe_reading_seconds}\nrepetitions = 3\nmax_joules_per_day = 0\n"
                       + ("threads = 1\n" if args.device == "cpu" else ""))
    port = node.port

    def stop(*_):
        node.stop()
        if os.path.exists(node.log_path):
            shutil.copy(node.log_path, os.path.join(args.out, "jouled.log"))
        save()

    signal.signal(signal.SIGTERM, lambda *_: (stop(), sys.exit(1)))
    try:
        node.start()
        _, devices = call(port, "GET", "/v1/devices")
        device = next(d for d in devices["devices"] if d["name"] == args.device)
        report["meter"] = device.get("meter")
        log(f"jouled ready; {args.device} meter: {json.dumps(device.get('meter'))[:300]}")

        # 2. The "jobs": each network whole, metered.
        for name, subset, _ in nets:
            if time.monotonic() > deadline - args.probe_seconds - 60:
                log(f"watchdog: no time left to measure {name}")
                break
            m = measure(args, specs[name])
            report["rows"].append({"network": name, "set": subset, "measured": m})
            log(f"measured {name:<18} {m['joules_per_step']:.4g} J/step ({m['source']}, "
                f"{'measured' if m['measured'] else 'NOT measured'}), {m['seconds_per_step'] * 1e3:.3g} ms/step, "
                f"spread {100 * (m['spread'] or 0):.1f} %")
            save()

        # 3. One requested probe run naming every network.
        models = [{"model": spec, "training": {"batch_size": args.batch}} for _, _, spec in nets]
        seconds = max(10.0, min(args.probe_seconds, deadline - time.monotonic() - 60))
        status, run = call(port, "POST", "/v1/probes", {"device": args.device, "seconds": seconds, "models": models})
        if status != 202:
            raise RuntimeError(f"POST /v1/probes: HTTP {status}: {run}")
        log(f"probe run {run['id']} for {seconds:.0f} s")
        while True:
            time.sleep(5)
            _, run = call(port, "GET", f"/v1/probes/{run['id']}")
            if run["state"] != "running" or time.monotonic() > deadline - 45:
                break
        report["probe_run"] = run
        log(f"probe run {run['state']}: {run.get('probes')} probes, {run.get('failed')} failed, "
            f"{run['energy']['joules']:.0f} J ({run['energy']['source']}); {run.get('message', '')}")
        save()

        # 4. Estimates (the model is refitted when the run ends: wait for it to answer).
        for row in report["rows"]:
            steps = 1000
            for _ in range(20):
                e = estimate(port, args.device, spec_of[row["network"]], args.batch, steps)
                if e["status"] == "ok":
                    break
                time.sleep(1)
            row["estimate"] = e
        save()

        # 5. The same reference measured again.
        if report["rows"] and time.monotonic() < deadline - 15:
            first = report["rows"][0]
            again = measure(args, specs[first["network"]])
            a, b = first["measured"]["joules_per_step"], again["joules_per_step"]
            report["noise"] = {"network": first["network"], "first": a, "again": b,
                               "difference": abs(a - b) / ((a + b) / 2)}
        save()
    finally:
        stop()
        shutil.rmtree(root, ignore_errors=True)
    print_table(report)


def print_table(report):
    print(f"\n{report['device']}, batch {report['batch']}, probe run {report['probe_seconds']:.0f} s; "
          f"meter {json.dumps(report.get('meter'))[:200]}")
    print(f"{'network':<18} {'set':<8} {'measured J/step':>15} {'estimate':>10} {'+-1sd':>8} {'error':>7} "
          f"{'in 2sd':>6} {'flops est':>10} {'error':>7}  sparse/extrap/layers")
    errors = {}
    for row in report["rows"]:
        m, e = row["measured"], row.get("estimate") or {"status": "none"}
        if e.get("status") != "ok":
            print(f"{row['network']:<18} {row['set']:<8} {m['joules_per_step']:>15.4g}  no estimate: {e.get('detail')}")
            continue
        truth = m["joules_per_step"]
        err = e["joules_per_step"] / truth - 1
        base = e["baseline_per_step"] / truth - 1
        inside = abs(e["joules_per_step"] - truth) <= 2 * e["std_per_step"]
        errors.setdefault(row["set"], []).append((abs(err), abs(base), inside))
        print(f"{row['network']:<18} {row['set']:<8} {truth:>15.4g} {e['joules_per_step']:>10.4g} "
              f"{e['std_per_step']:>8.3g} {100 * err:>+6.1f}% {'yes' if inside else 'no':>6} "
              f"{e['baseline_per_step']:>10.4g} {100 * base:>+6.1f}%  "
              f"{e['sparse_layers']}/{e['extrapolated_layers']}/{e['layers']}")
    for subset, rows in errors.items():
        print(f"{subset}: MAPE {100 * statistics.mean(r[0] for r in rows):.1f} % (worst {100 * max(r[0] for r in rows):.1f} %), "
              f"FLOPs baseline {100 * statistics.mean(r[1] for r in rows):.1f} %, inside 2 sd {sum(r[2] for r in rows)} of {len(rows)}")
    if "noise" in report:
        n = report["noise"]
        print(f"noise: {n['network']} measured twice, {n['first']:.4g} and {n['again']:.4g} J/step, "
              f"{100 * n['difference']:.1f} % apart")


if __name__ == "__main__":
    main()
