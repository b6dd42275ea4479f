#!/usr/bin/python3
"""advise_bench.py: pruning advice (POST /v1/advise) predicted against measured savings.

    /usr/bin/python3 bench/advise_bench.py --json /tmp/advise.json     # ~15 min: 300 s probing, 4 networks
    /usr/bin/python3 bench/advise_bench.py --quick                     # ~4 min smoke run

From an empty state, a fresh jouled (one `cpu` device, `threads = 1`) is asked for one probe run
naming the benchmark's networks as the workload. Then, per network, it asks jouled for advice
that saves `--target` of the estimated energy (widths down to `--min-multiplier`), and meters the
original and the advised network with `joule-worker measure` (the same LibTorch training steps
that probes run, median of readings), in turn, twice (original, advised, original, advised) so a
change in the machine's load shows as a disagreement between the pairs. It reports per network
the predicted saving (jouled's advice), the measured saving (joule-worker), the saving the FLOPs
alone predict (1 - advised FLOPs / original FLOPs), the parameters removed and the widths.

Joules on a machine without RAPL come from the `modelled` meter (idle watts x wall seconds +
watts per busy core x CPU seconds): the benchmark then tests the prediction of time and CPU under
the advice, not of energy, and says so. Nothing here was used to choose the advice's method.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
NETWORKS = ["lenet5", "cnn5", "vgg_small", "mlp_wide"]


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def arguments():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jouled", default=os.path.join(REPO, "build", "daemon", "jouled"))
    p.add_argument("--worker", default=os.path.join(REPO, "build", "worker", "joule-worker"))
    p.add_argument("--networks", nargs="+", default=NETWORKS, help="names under examples/models")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--target", type=float, default=0.5)
    p.add_argument("--min-multiplier", type=float, default=0.5)
    p.add_argument("--probe-seconds", type=float, default=300)
    p.add_argument("--reading-seconds", type=float, default=1.0, help="joule-worker measure --min-reading-seconds")
    p.add_argument("--repetitions", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="60 s of probing, two networks, short readings")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (state, logs, specs)")
    args = p.parse_args()
    if args.quick:
        args.probe_seconds, args.networks, args.reading_seconds, args.repetitions = 60, ["lenet5", "cnn5"], 0.3, 3
    return args


class Jouled:
    def __init__(self, args, directory):
        self.dir = directory
        self.state = os.path.join(directory, "state")
        self.log_path = os.path.join(directory, "jouled.log")
        self.config = os.path.join(directory, "jouled.toml")
        with open(self.config, "w") as f:
            f.write("\n".join(["[[devices]]", 'name = "cpu"', "threads = 1", "[probing]", "enabled = true",
                               f'worker = "{args.worker}"']) + "\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "MKL_", "OPENBLAS_", "JOULE_"))}
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen([args.jouled, "--state-dir", self.state, "--listen", "127.0.0.1:0",
                                          "--config", self.config], stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env)
        self.port = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.port is None:
            match = LISTENING.search(self.read_log())
            if match:
                self.port = int(match.group(1))
            elif self.proc.poll() is not None:
                break
            else:
                time.sleep(0.1)
        if self.port is None:
            raise RuntimeError(f"jouled did not start:\n{self.read_log()[-3000:]}")

    def read_log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=300) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"{method} {path}: HTTP {error.code}: {error.read().decode()[:2000]}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def measure(args, spec_path):
    """joule-worker measure: (joules per step, seconds per step, meter source)."""
    out = subprocess.run([args.worker, "measure", "--model", spec_path, "--batch-size", str(args.batch_size),
                          "--threads", "1", "--repetitions", str(args.repetitions), "--min-reading-seconds",
                          str(args.reading_seconds), "--json"], capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"joule-worker measure {spec_path}: {out.stderr.strip()[-500:]}")
    result = json.loads(out.stdout)
    network = result["networks"][0]
    return network["joules_per_step"], network["seconds_per_step"], result["meter_source"]


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def main():
    args = arguments()
    directory = tempfile.mkdtemp(prefix="joule-advise-")
    os.chmod(directory, 0o755)  # jouled refuses a jobs directory its jobs' accounts cannot enter
    jouled = None
    rows, report = [], {"args": vars(args), "networks": []}
    try:
        jouled = Jouled(args, directory)
        specs = {}
        for name in args.networks:
            with open(os.path.join(REPO, "examples", "models", name + ".json")) as f:
                specs[name] = json.load(f)
        training = {"batch_size": args.batch_size, "samples_per_epoch": 100 * args.batch_size}
        log(f"probing cpu for up to {args.probe_seconds:.0f} s, naming {', '.join(args.networks)} (load {loadavg():.1f})")
        run = jouled.call("POST", "/v1/probes", {"device": "cpu", "seconds": args.probe_seconds,
                                                 "models": [{"model": specs[n], "training": training}
                                                            for n in args.networks]})
        while run["state"] == "running":
            time.sleep(5)
            run = jouled.call("GET", f"/v1/probes/{run['id']}")
        log(f"probe run {run['state']}: {run.get('probes')} probes")
        report["probe_run"] = run
        for name in args.networks:
            started = time.monotonic()
            advice = jouled.call("POST", "/v1/advise", {"model": specs[name], "training": training,
                                                        "target": args.target, "device": "cpu",
                                                        "min_multiplier": args.min_multiplier})
            advise_seconds = time.monotonic() - started
            flops = [jouled.call("POST", "/v1/estimate", {"model": m, "training": training, "devices": ["cpu"]})
                     ["model"]["flops_per_step"] for m in (specs[name], advice["model"])]
            paths = [os.path.join(directory, f"{name}{suffix}.json") for suffix in ("", "-advised")]
            for path, spec in zip(paths, (specs[name], advice["model"])):
                with open(path, "w") as f:
                    json.dump(spec, f)
            load_before = loadavg()
            readings = [measure(args, path) for path in (paths[0], paths[1], paths[0], paths[1])]
            pairs = [1.0 - readings[1][0] / readings[0][0], 1.0 - readings[3][0] / readings[2][0]]
            row = {"network": name, "reached": advice["reached"], "predicted_saving": advice["saving"],
                   "measured_saving": sum(pairs) / 2, "measured_pairs": pairs,
                   "flops_saving": 1.0 - flops[1] / flops[0],
                   "parameters": [advice["original"]["parameters"], advice["advised"]["parameters"]],
                   "joules_per_step": [[r[0] for r in readings[0::2]], [r[0] for r in readings[1::2]]],
                   "meter_source": readings[0][2], "model_source": advice["source"],
                   "widths": [f"{l.get('name') or l['type'] + str(l['index'])} {l['width']}->{l['advised_width']}"
                              for l in advice["layers"] if "width" in l and l["width"] != l["advised_width"]],
                   "warnings": advice["advised"]["warnings"], "load": [load_before, loadavg()],
                   "advise_seconds": advise_seconds}
            log(f"{name}: predicted {100 * row['predicted_saving']:.1f} %, measured {100 * row['measured_saving']:.1f} % "
                f"(pairs {', '.join(f'{100 * p:.1f}' for p in pairs)}), FLOPs {100 * row['flops_saving']:.1f} %")
            rows.append(row)
        report["networks"] = rows
    finally:
        if jouled:
            jouled.stop()
        if args.keep:
            log(f"kept {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)

    print(f"target {100 * args.target:.0f} %, widths down to x{args.min_multiplier}, batch {args.batch_size}, "
          f"{args.probe_seconds:.0f} s of probing; joules {rows[0]['meter_source'] if rows else '?'} "
          f"({'not measured: CPU time under a model' if rows and rows[0]['meter_source'] == 'modelled' else 'measured'})")
    print(f"{'network':<12}{'reached':>8}{'predicted':>11}{'measured':>10}{'pairs':>16}{'FLOPs':>8}"
          f"{'|pred-meas|':>13}{'|FLOPs-meas|':>14}{'advise s':>10}  parameters")
    for r in rows:
        pairs = "/".join(f"{100 * p:.1f}" for p in r["measured_pairs"])
        print(f"{r['network']:<12}{str(r['reached']):>8}{100 * r['predicted_saving']:>10.1f}%{100 * r['measured_saving']:>9.1f}%"
              f"{pairs:>16}{100 * r['flops_saving']:>7.1f}%"
              f"{100 * abs(r['predicted_saving'] - r['measured_saving']):>12.1f}pp"
              f"{100 * abs(r['flops_saving'] - r['measured_saving']):>13.1f}pp{r['advise_seconds']:>10.2f}"
              f"  {r['parameters'][0]} -> {r['parameters'][1]}")
        print(f"{'':<12}widths: {', '.join(r['widths'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
