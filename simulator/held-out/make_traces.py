#!/usr/bin/env python3
"""Writes the trace.jsonl of each held-out joule-sim scenario, reproducibly (fixed seeds).

The traces are checked in; run this only to write a new held-out scenario: python3 make_traces.py
"""
import json
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


if __name__ == "__main__":
    gpu_lab()
