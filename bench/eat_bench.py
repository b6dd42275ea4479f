#!/usr/bin/python3
"""eat_bench.py: energy-aware training (EAT, seed 004) with and without its penalty, through jouled.

    /usr/bin/python3 bench/eat_bench.py --json /tmp/eat.json       # ~2 min on 2 cores
    /usr/bin/python3 bench/eat_bench.py --quick                    # ~20 s smoke run

The benchmark writes two small datasets in real formats (nothing is downloaded): 28x28 grey
shapes in MNIST's IDX pair, and 32x32 colour shapes in CIFAR-10's binary format, ten classes
each (bars, crosses, rings, boxes... at jittered places, with noise). A fresh jouled (one `cpu`
device, `threads = 1`, probing off) then runs, one at a time, LeNet-5 on the first and a small
CNN on the second as built-in jobs (`run.builtin`), each with `training.eat` at lambda = 0 (the
usual training, firing rates still counted), at the seed's lambda (0.1; sigma 1e-3) and at 1.

Reported per network and lambda: held-out accuracy, the firing rate (share of outputs that are
not zero) of every counted layer and their mean, the job's energy and seconds as jouled metered
them (with the meter's source), and the multiply-accumulates a zero-skipping accelerator would
still do: each conv/linear layer's MACs times the firing rate of the activations it reads. That
last figure is computed, not measured.

What the measurement can and cannot show: a CPU (and this VM's `modelled` meter, which counts
idle watts x seconds + watts per busy core x CPU seconds) does the same work for a zero as for
any other number, so EAT cannot lower these joules; the penalty's extra elementwise work can
only raise them. The firing rates, and the MACs they would save on hardware that skips zeros,
are what EAT changes.
"""

import argparse
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")

LENET5 = json.load(open(os.path.join(REPO, "examples", "models", "lenet5.json")))
CNN_SMALL = {"name": "cnn_small", "input": {"shape": [3, 32, 32]}, "loss": "cross_entropy", "layers": [
    {"type": "conv2d", "out_channels": 16, "kernel_size": 3, "padding": 1}, {"type": "relu"},
    {"type": "maxpool2d", "kernel_size": 2},
    {"type": "conv2d", "out_channels": 32, "kernel_size": 3, "padding": 1}, {"type": "relu"},
    {"type": "maxpool2d", "kernel_size": 2}, {"type": "flatten"},
    {"type": "linear", "out_features": 64}, {"type": "relu"},
    {"type": "linear", "out_features": 10}]}


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def shape_mask(label, size, rng):
    """A size x size mask of class `label`'s shape, jittered."""
    mask = [[0.0] * size for _ in range(size)]
    c = size // 2 + rng.randint(-size // 8, size // 8)
    r0 = size // 2 + rng.randint(-size // 8, size // 8)
    half = size // 4 + rng.randint(-1, 1)

    def put(y, x):
        if 0 <= y < size and 0 <= x < size:
            mask[y][x] = 1.0
    for t in range(-half, half + 1):
        if label == 0:  # horizontal bar
            put(r0, c + t); put(r0 + 1, c + t)
        elif label == 1:  # vertical bar
            put(r0 + t, c); put(r0 + t, c + 1)
        elif label == 2:  # diagonal
            put(r0 + t, c + t)
        elif label == 3:  # anti-diagonal
            put(r0 + t, c - t)
        elif label == 4:  # cross
            put(r0, c + t); put(r0 + t, c)
        elif label == 5:  # x
            put(r0 + t, c + t); put(r0 + t, c - t)
        elif label == 6:  # box outline
            put(r0 - half, c + t); put(r0 + half, c + t); put(r0 + t, c - half); put(r0 + t, c + half)
        elif label == 7:  # filled square
            for u in range(-half // 2, half // 2 + 1):
                put(r0 + t // 2, c + u)
        elif label == 8:  # ring
            for y in range(size):
                for x in range(size):
                    d = ((y - r0) ** 2 + (x - c) ** 2) ** 0.5
                    if abs(d - half) < 1.0:
                        mask[y][x] = 1.0
        else:  # two dots
            put(r0 - half // 2, c - half // 2); put(r0 + half // 2, c + half // 2)
            put(r0 - half // 2 + 1, c - half // 2); put(r0 + half // 2 + 1, c + half // 2)
    return mask


def write_mnist(directory, count, seed):
    rng = random.Random(seed)
    images = bytearray(struct.pack(">IIII", 0x803, count, 28, 28))
    labels = bytearray(struct.pack(">II", 0x801, count))
    for i in range(count):
        label = i % 10
        mask = shape_mask(label, 28, rng)
        for row in mask:
            images.extend(min(255, int(200 * v + rng.randint(0, 40))) for v in row)
        labels.append(label)
    paths = (os.path.join(directory, "shapes-images-idx3-ubyte"), os.path.join(directory, "shapes-labels-idx1-ubyte"))
    open(paths[0], "wb").write(images)
    open(paths[1], "wb").write(labels)
    return {"format": "mnist-idx", "images": paths[0], "labels": paths[1]}


def write_cifar(directory, count, seed):
    rng = random.Random(seed)
    records = bytearray()
    for i in range(count):
        label = i % 10
        mask = shape_mask(label, 32, rng)
        colour = [rng.randint(120, 255), rng.randint(120, 255), rng.randint(120, 255)]
        records.append(label)
        for channel in range(3):
            for row in mask:
                records.extend(min(255, int(colour[channel] * v + rng.randint(0, 50))) for v in row)
    path = os.path.join(directory, "shapes_batch.bin")
    open(path, "wb").write(records)
    return {"format": "cifar10", "files": [path]}


class Jouled:
    def __init__(self, build, state):
        self.jouled = os.path.join(build, "daemon", "jouled")
        self.worker = os.path.join(build, "worker", "joule-worker")
        self.state = state
        self.config = os.path.join(state + "-config.toml")
        with open(self.config, "w") as f:
            f.write("[[devices]]\nname = \"cpu\"\nmeter = \"auto\"\nthreads = 1\n"
                    f"[probing]\nenabled = false\nworker = \"{self.worker}\"\n")
        self.log_path = state + ".log"
        self.proc = None
        self.port = None

    def start(self):
        env = {k: v for k, v in os.environ.items()
               if not (k.startswith(("OMP_", "MKL_", "OPENBLAS_", "JOULE_")) or k == "PYTHONPATH")}
        with open(self.log_path, "wb") as log_file:
            self.proc = subprocess.Popen([self.jouled, "--state-dir", self.state, "--listen", "127.0.0.1:0",
                                          "--config", self.config], stdout=log_file, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not self.port:
            m = LISTENING.search(open(self.log_path, errors="replace").read())
            if m:
                self.port = int(m.group(1))
            elif self.proc.poll() is not None:
                break
            time.sleep(0.1)
        if not self.port:
            raise RuntimeError("jouled did not start:\n" + open(self.log_path, errors="replace").read()[-3000:])
        while time.monotonic() < deadline:
            try:
                self.call("GET", "/readyz")
                return
            except (RuntimeError, OSError):
                time.sleep(0.2)
        raise RuntimeError("jouled never became ready")

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                return json.loads(reply.read().decode())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{method} {path}: HTTP {e.code}: {e.read().decode('utf-8', 'replace')[:2000]}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def macs_by_layer(jouled, model, batch_size, samples):
    """Forward multiply-accumulates per sample of each conv2d/linear layer, by index."""
    answer = jouled.call("POST", "/v1/estimate", {"model": model, "training": {
        "batch_size": batch_size, "epochs": 1, "samples_per_epoch": samples}})
    out = {}
    for row in answer["model"]["layers"]:
        layer = model["layers"][row["index"]]
        outputs = 1
        for d in row["output_shape"]:
            outputs *= d
        if row["type"] == "conv2d":
            k = layer["kernel_size"]
            out[row["index"]] = outputs * row["input_shape"][0] * k * k
        elif row["type"] == "linear":
            out[row["index"]] = outputs * row["input_shape"][-1]
    return out


def zero_skipping_share(model, macs, rates):
    """MACs a zero-skipping accelerator would do, as a share of all: each layer's MACs times the
    firing rate of what it reads (the input image counts as all firing)."""
    total = done = 0.0
    last_rate = 1.0
    for index, layer in enumerate(model["layers"]):
        if index in macs:
            total += macs[index]
            done += macs[index] * last_rate
        key = f"{index}_{layer['type']}"
        if key in rates:
            last_rate = rates[key]
    return done / total if total else 1.0


def run_job(jouled, name, model, dataset, samples, epochs, lam, sigma):
    job = {"name": f"{name}-lambda-{lam:g}", "model": model,
           "training": {"batch_size": 32, "epochs": epochs, "samples_per_epoch": samples, "optimizer": "sgd_momentum",
                        "eat": {"lambda": lam, "sigma": sigma}},
           "run": {"builtin": {"dataset": dataset, "checkpoint": False}}}
    job_id = jouled.call("POST", "/v1/jobs", job)["id"]
    while True:
        state = jouled.call("GET", f"/v1/jobs/{job_id}")
        if state["state"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(1)
    if state["state"] != "succeeded":
        raise RuntimeError(f"{name} lambda {lam}: {state['state']}: {state['reason']}")
    return state


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(REPO, "build"))
    parser.add_argument("--lambdas", default="0,0.1,1",
                        help="comma-separated lambdas (default 0, the seed's 0.1, and 1 for the trend)")
    parser.add_argument("--sigma", type=float, default=1e-3)
    parser.add_argument("--samples", type=int, default=6000, help="images per dataset (a tenth held out)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="800 images, 2 epochs")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.epochs = 800, 2
    root = tempfile.mkdtemp(prefix="joule-eat-")
    os.chmod(root, 0o755)
    jouled = Jouled(args.build, os.path.join(root, "state"))
    results = []
    try:
        log(f"writing {args.samples} images per dataset in {root}")
        datasets = {"lenet5": write_mnist(root, args.samples, 1), "cnn_small": write_cifar(root, args.samples, 2)}
        jouled.start()
        train = args.samples - args.samples // 10
        load = os.getloadavg()[0]
        for name, model in (("lenet5", LENET5), ("cnn_small", CNN_SMALL)):
            macs = macs_by_layer(jouled, model, 32, train)
            for lam in [float(x) for x in args.lambdas.split(",")]:
                log(f"{name}, lambda {lam:g}: training")
                done = run_job(jouled, name, model, datasets[name], train, args.epochs, lam, args.sigma)
                rates = done["progress"].get("firing_rates", {})
                energy = done.get("energy") or {}
                results.append({
                    "network": name, "lambda": lam, "sigma": args.sigma, "epochs": args.epochs,
                    "accuracy": done["progress"].get("accuracy"),
                    "firing_rates": rates,
                    "mean_firing_rate": sum(rates.values()) / len(rates) if rates else None,
                    "zero_skipping_macs_share": zero_skipping_share(model, macs, rates),
                    "joules": energy.get("joules"), "source": energy.get("source"),
                    "seconds": done.get("seconds")})
                r = results[-1]
                log(f"  accuracy {r['accuracy']:.3f}, mean firing {r['mean_firing_rate']:.3f}, "
                    f"MACs left with zero skipping {r['zero_skipping_macs_share']:.3f}, "
                    f"{r['joules']:.0f} J ({r['source']}), {r['seconds']:.1f} s")
        summary = {"load_at_start": load, "load_at_end": os.getloadavg()[0], "samples": args.samples,
                   "results": results}
        print(json.dumps(summary, indent=2))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=2)
    finally:
        jouled.stop()
        shutil.rmtree(root, ignore_errors=True)
        for suffix in ("-config.toml", ".log", "-jobs"):
            path = jouled.state + suffix
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else (
                os.path.exists(path) and os.remove(path))


if __name__ == "__main__":
    main()
