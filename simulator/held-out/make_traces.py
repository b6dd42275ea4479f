#!/usr/bin/env python3
"""Writes the trace.jsonl of each held-out joule-sim scenario, reproducibly (fixed seeds).

The traces are checked in; run this only to write a new held-out scenario: python3 make_traces.py
"""
import json
import math
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = "../../../examples/models/"

# network -> (samples per epoch, epochs, batch sizes, devices asked for)
CATALOGUE = {
    "resnet18_cifar": (50000, (5, 40), (64, 128, 256), ["cuda:*"]),       # CIFAR-10
    "mobilenetv2_cifar": (50000, (5, 40), (32, 64, 128), ["cuda:*"]),     # CIFAR-10
    "lstm_classifier": (120000, (2, 10), (16, 256), None),                # AG News
    "lenet5_wide": (60000, (10, 50), (256,), None),                       # MNIST
}


def gpu_lab():
    rng = random.Random(4242)
    names = list(CATALOGUE)
    weights = [0.35, 0.35, 0.2, 0.1]
    jobs = []
    for index in range(1, 151):
        name = rng.choices(names, weights)[0]
        samples, (lo, hi), batches, devices = CATALOGUE[name]
        entry = {
            "at": round(rng.uniform(8, 18) * 3600, 1),
            "name": f"{name}-{index}",
            "model": MODELS + name + ".json",
            "training": {"batch_size": rng.choice(batches), "epochs": rng.randint(lo, hi),
                         "samples_per_epoch": samples},
        }
        constraints = {}
        if devices and rng.random() < 0.7:
            constraints["devices"] = devices
        if rng.random() < 0.25:
            constraints["deadline_seconds"] = rng.choice([3, 6, 10]) * 3600
        if constraints:
            entry["constraints"] = constraints
        jobs.append(entry)
    with open(os.path.join(HERE, "gpu-lab", "trace.jsonl"), "w") as out:
        for entry in sorted(jobs, key=lambda e: e["at"]):
            out.write(json.dumps(entry) + "\n")


CAMPUS_CLUSTER = """## carbon-campus (held out): three server GPUs and two workstations on a campus grid with much
## solar and a coal-and-gas night (campus.csv); jobs over two working days, slack mixed.
## Written by make_traces.py (seed 3434) for the carbon figures of issue 34.
start = "2026-11-26T00:00:00Z"
utc_offset_minutes = 0
carbon = "campus.csv"

[[nodes]]
name = "gpu-a"
devices = [
  {name = "cuda:0", profile = "server-gpu", probes = 200, idle_watts = 50.0},
  {name = "cuda:1", profile = "server-gpu", probes = 200, idle_watts = 50.0},
]

[[nodes]]
name = "gpu-b"
devices = [{name = "cuda:0", profile = "server-gpu", probes = 200, idle_watts = 60.0}]

[[nodes]]
name = "ws-1"
devices = [{name = "cpu", profile = "laptop-cpu", probes = 200, idle_watts = 8.0}]

[[nodes]]
name = "ws-2"
devices = [{name = "cpu", profile = "laptop-cpu", probes = 200, idle_watts = 8.0}]
"""

CAMPUS_POLICY = """## carbon-campus (held out): min-carbon, no budgets.

[placement]
objective = "min-carbon"
risk = 0.05
"""


def carbon_campus():
    """Half-hourly gCO2e/kWh, MADE UP: a night of 520 (coal and gas) that falls to about 160 at
    13:00 under a clear sky, each day's sky 0.6-1.0 of clear, an evening peak of +40 at 19:00,
    ±15 of noise; jobs submitted over two days, slack 4, 12 or 24 hours or none."""
    rng = random.Random(3434)
    names = list(CATALOGUE)
    jobs = []
    for index in range(1, 101):
        name = rng.choice(names)
        samples, (lo, hi), batches, devices = CATALOGUE[name]
        day = rng.randint(0, 1)
        entry = {
            "at": round((day * 24 + rng.uniform(7, 20)) * 3600, 1),
            "name": f"{name}-{index}",
            "model": MODELS + name + ".json",
            "training": {"batch_size": rng.choice(batches), "epochs": max(1, rng.randint(lo, hi) // 4),
                         "samples_per_epoch": samples},
        }
        constraints = {}
        if devices and rng.random() < 0.7:
            constraints["devices"] = devices
        slack = rng.choices([None, 4, 12, 24], [0.2, 0.2, 0.4, 0.2])[0]
        if slack:
            constraints["deadline_seconds"] = slack * 3600
        if constraints:
            entry["constraints"] = constraints
        jobs.append(entry)
    os.makedirs(os.path.join(HERE, "carbon-campus"), exist_ok=True)
    with open(os.path.join(HERE, "carbon-campus", "trace.jsonl"), "w") as out:
        for entry in sorted(jobs, key=lambda e: e["at"]):
            out.write(json.dumps(entry) + "\n")
    with open(os.path.join(HERE, "carbon-campus", "campus.csv"), "w") as out:
        out.write("# made up by make_traces.py (carbon_campus): not a real grid's data\ntime,value\n")
        sky = 1.0
        for half in range(-48, 4 * 48):
            hour = (half % 48) / 2
            if half % 48 == 0:
                sky = rng.uniform(0.6, 1.0)
            sun = max(0.0, math.sin(math.pi * (hour - 6.5) / 13))
            value = 520 - 360 * sky * sun + 40 * math.exp(-((hour - 19) ** 2) / 2) + rng.gauss(0, 15)
            day, rest = divmod(half, 48)
            out.write(f"2026-11-{26 + day:02d}T{rest // 2:02d}:{30 * (rest % 2):02d}:00Z,{max(0, value):.0f}\n")
    with open(os.path.join(HERE, "carbon-campus", "cluster.toml"), "w") as out:
        out.write(CAMPUS_CLUSTER)
    with open(os.path.join(HERE, "carbon-campus", "policy.toml"), "w") as out:
        out.write(CAMPUS_POLICY)


def held_out_job(rng, at, index, names, epochs=lambda drawn: drawn):
    """One trace line: a network of `names` with its dataset, a batch size and epochs drawn (in that
    order) from its catalogue entry, `epochs` applied to the draw."""
    name = rng.choice(names)
    samples, (lo, hi), batches, _ = CATALOGUE[name]
    return {
        "at": round(at, 1),
        "name": f"{name}-{index}",
        "model": MODELS + name + ".json",
        "training": {"batch_size": rng.choice(batches), "epochs": epochs(rng.randint(lo, hi)),
                     "samples_per_epoch": samples},
    }


def write_scenario(name, cluster, policy, jobs):
    """A scenario's directory: its cluster and policy files, and its jobs in order of arrival."""
    os.makedirs(os.path.join(HERE, name), exist_ok=True)
    with open(os.path.join(HERE, name, "cluster.toml"), "w") as out:
        out.write(cluster)
    with open(os.path.join(HERE, name, "policy.toml"), "w") as out:
        out.write(policy)
    with open(os.path.join(HERE, name, "trace.jsonl"), "w") as out:
        for entry in sorted(jobs, key=lambda e: e["at"]):
            out.write(json.dumps(entry) + "\n")


CPU_PAIR_CLUSTER = """## cpu-pair (held out): two 64-core CPU servers (server-cpu) a department shares; a morning
## backlog of 80 jobs, then 15 an hour over the day; jobs ask for 2 to 32 cores, one in eight for a
## whole server. Written by make_traces.py (seed 6464) for the packing figures of issue 36.
start = "2026-11-26T08:00:00Z"
utc_offset_minutes = 0

[[nodes]]
name = "cpu-a"
devices = [{name = "cpu", profile = "server-cpu", probes = 300, cores = 64}]

[[nodes]]
name = "cpu-b"
devices = [{name = "cpu", profile = "server-cpu", probes = 300, cores = 64}]
"""

CPU_PAIR_POLICY = """## cpu-pair (held out): min-energy at the default risk; no budgets.

[placement]
objective = "min-energy"
risk = 0.05
"""


def cpu_pair():
    rng = random.Random(6464)
    names = ["lstm_classifier", "lenet5_wide"]
    jobs, at = [], 0.0
    for index in range(1, 201):
        at = rng.uniform(0, 900) if index <= 80 else at + rng.expovariate(15.0 / 3600.0)
        entry = held_out_job(rng, at, index, names, lambda epochs: max(1, epochs // 4))
        if rng.random() >= 0.125:
            entry["resources"] = {"cores": rng.choice([2, 4, 8, 16, 32])}
        if rng.random() < 0.1:
            entry["priority"] = 1
        jobs.append(entry)
    write_scenario("cpu-pair", CPU_PAIR_CLUSTER, CPU_PAIR_POLICY, jobs)


GPU_PAIR_DEVICES = ", ".join(f'{{name = "cuda:{i}", profile = "server-gpu", probes = 300}}' for i in range(4))
GPU_PAIR_CLUSTER = f"""## gpu-pair (held out): two servers with four data-centre GPUs each (server-gpu); a morning
## backlog of 40 jobs, then 6 an hour; jobs ask for 1, 2 or 4 GPUs (resources.gpus) and run
## data-parallel. Written by make_traces.py (seed 4848) for the multi-GPU figures of issue 36.
start = "2026-11-26T08:00:00Z"
utc_offset_minutes = 0

[[nodes]]
name = "gpu-a"
devices = [{GPU_PAIR_DEVICES}]

[[nodes]]
name = "gpu-b"
devices = [{GPU_PAIR_DEVICES}]
"""

GPU_PAIR_POLICY = """## gpu-pair (held out): min-energy at the default risk; no budgets.

[placement]
objective = "min-energy"
risk = 0.05
"""


def gpu_pair():
    rng = random.Random(4848)
    names = ["resnet18_cifar", "mobilenetv2_cifar"]
    jobs, at = [], 0.0
    for index in range(1, 101):
        at = rng.uniform(0, 600) if index <= 40 else at + rng.expovariate(6.0 / 3600.0)
        entry = held_out_job(rng, at, index, names)
        entry["resources"] = {"gpus": rng.choice([1, 1, 2, 2, 4])}
        if rng.random() < 0.1:
            entry["priority"] = 1
        jobs.append(entry)
    write_scenario("gpu-pair", GPU_PAIR_CLUSTER, GPU_PAIR_POLICY, jobs)


if __name__ == "__main__":
    gpu_lab()
    carbon_campus()
    cpu_pair()
    gpu_pair()
