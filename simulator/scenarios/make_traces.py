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


if __name__ == "__main__":
    mixed_fleet()
    solar_edge()
    burst()
