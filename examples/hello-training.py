#!/usr/bin/env python3
"""A tiny training job for the first run: logistic regression by SGD on synthetic data, in
pure Python so it needs nothing installed. It prints its loss per epoch like a real trainer."""
import math
import random
import sys

random.seed(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
features = 16
true_w = [random.uniform(-1, 1) for _ in range(features)]
data = []
for _ in range(20000):
    x = [random.gauss(0, 1) for _ in range(features)]
    y = 1.0 if sum(w * v for w, v in zip(true_w, x)) > 0 else 0.0
    data.append((x, y))

w = [0.0] * features
rate = 0.1
for epoch in range(1, 9):
    random.shuffle(data)
    loss = 0.0
    for x, y in data:
        z = sum(a * b for a, b in zip(w, x))
        p = 1.0 / (1.0 + math.exp(-max(min(z, 30), -30)))
        loss -= y * math.log(p + 1e-12) + (1 - y) * math.log(1 - p + 1e-12)
        g = p - y
        w = [a - rate * g * b for a, b in zip(w, x)]
    print(f"epoch {epoch}: loss {loss / len(data):.4f}", flush=True)
