#!/usr/bin/env python3
"""Writes the trace.jsonl of each shipped joule-sim scenario, reproducibly (fixed seeds).

The traces are checked in; run this only to change them: python3 make_traces.py
Jobs use the networks of examples/models/ with the datasets they are usually trained on.
"""
import json
import math
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = "../../../examples/models/"

# network -> (samples per epoch, typical epochs, batch sizes users pick, devices users ask for)
# Heavy networks are mostly submitted for GPUs ("cuda:*"), as their owners would.
CATALOGUE = {
    "lenet5": (60000, (5, 30), (32, 64, 128), None),               # MNIST
    "lenet5_wide": (60000, (5, 30), (32, 64, 128), None),          # MNIST
    "mlp": (7352, (20, 100), (16, 32, 64), None),                  # UCI HAR
    "mlp_wide": (60000, (5, 30), (64, 128, 256), None),            # MNIST
    "gru_tagger": (200000, (3, 15), (32, 64), None),               # a tagging corpus
    "cnn5": (1281167, (2, 10), (32, 64, 128), ["cuda:*"]),         # ImageNet 32x32
    "vgg_small": (1281167, (2, 10), (64, 128, 256), ["cuda:*"]),   # ImageNet 32x32
    "lstm_classifier": (560000, (2, 8), (32, 64, 128), ["cuda:*"]),     # Yelp polarity
    "transformer_small": (560000, (2, 8), (32, 64, 128), ["cuda:*"]),   # Yelp polarity
}

def job(rng, at, index, names, scale=1.0, deadline_share=0.2, edge_share=0.1):
    name = rng.choice(names)
    samples, (lo, hi), batches, devices = CATALOGUE[name]
    entry = {
        "at": round(at, 1),
        "name": f"{name}-{index}",
        "model": MODELS + name + ".json",
        "training": {"batch_size": rng.choice(batches), "epochs": max(1, round(rng.randint(lo, hi) * scale)),
                     "samples_per_epoch": samples},
    }
    constraints = {}
    if devices and rng.random() < 0.8:
        constraints["devices"] = devices
    elif rng.random() < edge_share:
        # Data that may not leave the edge: the Jetsons and Pis only.
        constraints["devices"] = ["jetson-*/*", "pi-*/*"]
    if rng.random() < deadline_share:
        constraints["deadline_seconds"] = rng.choice([4, 6, 8, 12]) * 3600
    if constraints:
        entry["constraints"] = constraints
    if rng.random() < 0.1:
        entry["priority"] = 1
    return entry


def write(name, jobs):
    with open(os.path.join(HERE, name, "trace.jsonl"), "w") as out:
        for entry in sorted(jobs, key=lambda e: e["at"]):
            out.write(json.dumps(entry) + "\n")


def mixed_fleet():
    rng = random.Random(2026)
    jobs, at, index = [], 0.0, 0
    while len(jobs) < 200:
        hour = (at / 3600.0) % 24
        rate = 14.0 if 8 <= hour < 18 else 4.0  # jobs per hour: office hours, then the night
        at += rng.expovariate(rate / 3600.0)
        if at >= 24 * 3600:
            at = rng.uniform(0, 24 * 3600)
        index += 1
        jobs.append(job(rng, at, index, list(CATALOGUE), scale=3.0))
    write("mixed-fleet", jobs)


def solar_edge():
    rng = random.Random(7)
    names = ["lenet5", "lenet5_wide", "mlp", "mlp_wide", "gru_tagger", "cnn5", "lstm_classifier"]
    jobs, index = [], 0
    for day in range(2):
        for _ in range(30):
            index += 1
            at = day * 86400 + rng.uniform(6, 22) * 3600  # a field station's working day and evening
            entry = job(rng, at, index, names, scale=4.0, deadline_share=0.0, edge_share=0.0)
            entry.pop("constraints", None)
            jobs.append(entry)
    write("solar-edge", jobs)


def burst():
    rng = random.Random(11)
    jobs = [job(rng, rng.uniform(9 * 3600, 9.5 * 3600), i + 1, list(CATALOGUE), scale=2.0, deadline_share=0.0)
            for i in range(120)]
    write("burst", jobs)


CARBON_FLEET = """## {name}: carbon-aware timing on a small lab fleet under a {kind} grid ({signal}).
## Two Jetson Orins, a workstation and a GPU server with two GPUs, all drawing from one grid; every
## job may finish up to 12 hours after it is submitted. Written by make_traces.py.
start = "2026-11-26T00:00:00Z"
utc_offset_minutes = 0
carbon = "{signal}"

[[nodes]]
name = "jetson-1"
devices = [{{name = "cuda:0", profile = "jetson-orin", probes = 200, idle_watts = 5.0}}]

[[nodes]]
name = "jetson-2"
devices = [{{name = "cuda:0", profile = "jetson-orin", probes = 200, idle_watts = 5.0}}]

[[nodes]]
name = "workstation"
devices = [{{name = "cpu", profile = "laptop-cpu", probes = 200, idle_watts = 9.0}}]

[[nodes]]
name = "gpu-server"
devices = [
  {{name = "cuda:0", profile = "server-gpu", probes = 200, idle_watts = 55.0}},
  {{name = "cuda:1", profile = "server-gpu", probes = 200, idle_watts = 55.0}},
]
"""

CARBON_POLICY = """## {name}: min-carbon placement, no budgets: each job's device and start chosen for the fewest
## grams before its deadline; joule-sim runs min-energy (never defers), fifo (run now) and
## carbon-only (waits for the lowest hour, knowing nothing of run times) beside it.

[placement]
objective = "min-carbon"
risk = 0.05
"""


def carbon_signal(kind, rng):
    """Hourly gCO2e/kWh from a day before the start to three days after. MADE UP, shaped as
    such grids' days are, not any grid's data:
    - solar: ~380 at night (gas), falling to ~100 at solar noon on a clear day; each day's sun
      0.7-1.0 of clear, ±10 of hourly noise.
    - wind: a slow random walk (AR(1), about 8 hours' memory) between 60 and 450 around 250.
    - flat: 300 ± 10 (a hydro- or nuclear-steady grid, or a constant average)."""
    start = -24
    rows, level = [], 250.0
    for h in range(start, 72):
        hour = h % 24
        if kind == "solar":
            if hour == 0:  # each day's sky
                sun = rng.uniform(0.7, 1.0)
            value = 380.0 - 280.0 * sun * max(0.0, math.sin(math.pi * (hour - 6) / 12)) + rng.gauss(0, 10)
        elif kind == "wind":
            level = 250.0 + 0.88 * (level - 250.0) + rng.gauss(0, 45)
            value = min(450.0, max(60.0, level))
        else:
            value = 300.0 + rng.gauss(0, 10)
        rows.append((h, max(0.0, value)))
    return rows


def carbon_scenarios():
    jobs = carbon_jobs()
    for kind in ("solar", "wind", "flat"):
        name = f"carbon-{kind}"
        os.makedirs(os.path.join(HERE, name), exist_ok=True)
        write(name, jobs)
        signal = f"{kind}.csv"
        with open(os.path.join(HERE, name, signal), "w") as out:
            out.write(f"# {carbon_signal.__doc__.splitlines()[0]}\n# {kind}: made up by make_traces.py\n")
            out.write("time,value\n")
            for h, value in carbon_signal(kind, random.Random(f"{kind}-34")):
                day, hour = divmod(h, 24)
                out.write(f"2026-11-{26 + day:02d}T{hour:02d}:00:00Z,{value:.0f}\n")
        with open(os.path.join(HERE, name, "cluster.toml"), "w") as out:
            out.write(CARBON_FLEET.format(name=name, kind=kind + "-heavy" if kind != "flat" else "flat", signal=signal))
        with open(os.path.join(HERE, name, "policy.toml"), "w") as out:
            out.write(CARBON_POLICY.format(name=name))


PRICE_FLEET = CARBON_FLEET.replace('carbon = "{signal}"', 'price = "{signal}"').replace(
    "carbon-aware timing on a small lab fleet under a {kind} grid", "price-aware timing on a small lab fleet at {kind}")

PRICE_POLICY = """## {name}: min-cost placement, no budgets: each job's device and start chosen for the least
## expected cost before its deadline; joule-sim runs min-energy (never defers) and fifo (run now)
## beside it.

[placement]
objective = "min-cost"
risk = 0.05
"""

CARBON_BUDGET_POLICY = """## carbon-budget: carbon-solar's jobs and grid under min-carbon with a budget of {grams} g CO2e
## per calendar day on the whole fleet: half of what running every job at once (fifo) emits over
## the whole trace in simulated grams (seed 1), set by that rule before any run with the budget.

[placement]
objective = "min-carbon"
risk = 0.05

[[budgets]]
name = "fleet-grams"
scope = "cluster"
grams = {grams}
calendar = "day"
"""


def price_signal(rng):
    """Hourly prices per kWh (EUR) from a day before the start to three days after. MADE UP,
    shaped as a day-ahead market's winter weekday, not any market's data: ~0.10 at night, a
    morning peak ~0.28 at 08:00, a solar dip ~0.14 at 13:00, an evening peak ~0.36 at 19:00;
    each day scaled 0.85-1.15, ±0.015 of hourly noise."""
    shape = [0.10, 0.09, 0.09, 0.09, 0.10, 0.12, 0.18, 0.25, 0.28, 0.25, 0.20, 0.16,
             0.14, 0.14, 0.15, 0.18, 0.24, 0.31, 0.35, 0.36, 0.30, 0.22, 0.16, 0.12]
    rows = []
    for h in range(-24, 72):
        hour = h % 24
        if hour == 0:
            scale = rng.uniform(0.85, 1.15)
        rows.append((h, max(0.0, shape[hour] * scale + rng.gauss(0, 0.015))))
    return rows


def carbon_jobs():
    """carbon-*'s 80 jobs: submitted over a day, most in office hours, each with 12 h of slack."""
    rng = random.Random(34)
    jobs, index = [], 0
    while len(jobs) < 80:
        at = rng.uniform(0, 24 * 3600)
        hour = at / 3600.0
        if not (8 <= hour < 18) and rng.random() < 0.6:
            continue  # most work is submitted in office hours
        index += 1
        entry = job(rng, at, index, list(CATALOGUE), scale=0.5, deadline_share=0.0, edge_share=0.0)
        entry.setdefault("constraints", {})["deadline_seconds"] = 12 * 3600
        jobs.append(entry)
    return jobs


def price_scenario():
    name = "price-dayahead"
    os.makedirs(os.path.join(HERE, name), exist_ok=True)
    write(name, carbon_jobs())
    with open(os.path.join(HERE, name, "prices.csv"), "w") as out:
        out.write(f"# {price_signal.__doc__.splitlines()[0]}\n# made up by make_traces.py\n")
        out.write("time,eur_per_kwh\n")
        for h, value in price_signal(random.Random("price-34")):
            day, hour = divmod(h, 24)
            out.write(f"2026-11-{26 + day:02d}T{hour:02d}:00:00Z,{value:.4f}\n")
    with open(os.path.join(HERE, name, "cluster.toml"), "w") as out:
        out.write(PRICE_FLEET.format(name=name, kind="day-ahead prices", signal="prices.csv"))
    with open(os.path.join(HERE, name, "policy.toml"), "w") as out:
        out.write(PRICE_POLICY.format(name=name))


def carbon_budget_scenario(grams):
    """carbon-solar with a daily grams budget (`grams`: see CARBON_BUDGET_POLICY for the rule)."""
    name = "carbon-budget"
    os.makedirs(os.path.join(HERE, name), exist_ok=True)
    write(name, carbon_jobs())
    with open(os.path.join(HERE, "carbon-solar", "solar.csv")) as source:
        text = source.read()
    with open(os.path.join(HERE, name, "solar.csv"), "w") as out:
        out.write(text)
    with open(os.path.join(HERE, name, "cluster.toml"), "w") as out:
        out.write(CARBON_FLEET.format(name=name, kind="solar-heavy", signal="solar.csv"))
    with open(os.path.join(HERE, name, "policy.toml"), "w") as out:
        out.write(CARBON_BUDGET_POLICY.format(grams=grams))


# Half of what fifo (every job at once) emits over carbon-solar's whole trace: 36 g of simulated
# CO2e at seed 1 (joule-sim --seed 1 on carbon-solar), so 18 g a day, fixed before any run with it.
CARBON_BUDGET_GRAMS = 18


def cpu_server(name, jobs_per_hour, ranged=False):
    """A 64-core CPU server a team shares: 160 jobs, each asking for 4, 8 or 16 cores
    (resources.cores), on the catalogue's small and medium networks. cpu-server is handed them as
    a backlog within ten minutes (its makespan measures how many jobs an hour the server gets
    through); cpu-server-day gets 20 an hour over a working day."""
    rng = random.Random(64)
    names = ["lenet5", "lenet5_wide", "mlp", "mlp_wide", "gru_tagger"]
    jobs, at = [], 0.0
    for index in range(1, 161):
        at += rng.expovariate(jobs_per_hour / 3600.0)
        entry = job(rng, at, index, names, scale=0.5, deadline_share=0.0, edge_share=0.0)
        entry.pop("constraints", None)
        cores = rng.choice([4, 8, 8, 16])
        # ranged: the same jobs letting placement choose between their count and twice it.
        entry["resources"] = {"cores": {"min": cores, "max": 2 * cores} if ranged else cores}
        jobs.append(entry)
    write(name, jobs)


def gpu_server(name, jobs_per_hour, count, scale):
    """An 8-GPU server a team shares: jobs on the catalogue's GPU networks, each asking for 1, 2,
    4 or 8 GPUs (resources.gpus; data-parallel: each GPU trains 1/N of every epoch), arriving
    over a working day."""
    rng = random.Random(8)
    names = ["cnn5", "vgg_small", "lstm_classifier", "transformer_small"]
    jobs, at = [], 0.0
    for index in range(1, count + 1):
        at += rng.expovariate(jobs_per_hour / 3600.0)
        entry = job(rng, at, index, names, scale=scale, deadline_share=0.0, edge_share=0.0)
        entry.pop("constraints", None)
        entry["resources"] = {"gpus": rng.choice([1, 2, 2, 4, 4, 8])}
        jobs.append(entry)
    write(name, jobs)


if __name__ == "__main__":
    mixed_fleet()
    solar_edge()
    burst()
    carbon_scenarios()
    cpu_server("cpu-server", 960.0)  # 160 in about ten minutes
    cpu_server("cpu-server-day", 20.0)
    cpu_server("cpu-server-range", 960.0, ranged=True)
    gpu_server("gpu-server", 600.0, 60, 5.0)  # 60 in about six minutes
    price_scenario()
    carbon_budget_scenario(CARBON_BUDGET_GRAMS)
