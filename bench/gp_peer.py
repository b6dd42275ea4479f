#!/usr/bin/env python3
"""The GP benchmark's data, its scikit-learn peer, and the side-by-side table.

    gp_peer.py generate --out DIR [--sizes 50,200,1000,2000]
    gp_peer.py run --data DIR --n N --restarts R --out FILE.json
    gp_peer.py table --data DIR --restarts R

Data (written once by `generate`, read by both sides, so both fit exactly the same numbers):
an energy-like regression problem in d = 4 log2-scaled features of a conv layer,

    x1 = log2 channels  ~ U[3, 9]      x2 = log2 spatial size ~ U[2, 7]
    x3 = log2 kernel    ~ U[0, log2 7] x4 = log2 batch        ~ U[0, 8]
    C, S, K, B = 2**x1, 2**x2, 2**x3, 2**x4
    flops = 2 C² S² K² B
    util  = (B S² / (B S² + 256)) · (C / (C + 24)) · (0.8 + 0.2 sin(1.3 x1))
    E     = 5e-11 flops / util + 1.2e-8 C S² B + 1e-3                       (joules per step)
    y     = log(E · (1 + 0.01 ε)),  ε ~ N(0, 1)                             (1 % multiplicative noise)

Training sets train_N.csv are the first N rows of one draw of max(2000, N) rows with
numpy.random.default_rng(20240611) (x for all rows, then ε for all rows; so the sets are
nested and do not depend on --sizes below 2,000); the held-out set test.csv (1,000 rows) comes
from default_rng(20240612). Columns: x1, x2, x3, x4, y (measured log E), y_true
(noise-free log E).

The peer: sklearn.gaussian_process.GaussianProcessRegressor with
ConstantKernel(1.0, (1e-3, 1e5)) * Matern(nu=2.5, length_scale=[1]*4, (1e-2, 1e3))
+ WhiteKernel(1e-2, (1e-6, 10)), normalize_y=True, n_restarts_optimizer=R, random_state=0,
on inputs standardised with the training mean and std (Joule's GP standardises inside). So
both search the same space, within the same bounds, from the same default start. One BLAS
thread (the runner sets OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1).

Timings: fit = median of `fit_repeats` fits (same count as gp_bench); predict = median time
per call over timed blocks of at least 0.2 s (1 point with return_std=True, and 1,000 points).
"""

import argparse
import csv
import json
import math
import os
import statistics
import sys
import time

SIZES = (50, 200, 1000, 2000)
TEST_ROWS = 1000
STREAM_ROWS = 2000  # at least this many training rows are drawn, whatever --sizes asks for
TRAIN_SEED = 20240611
TEST_SEED = 20240612


def fit_repeats(n):
    """How many fits each side times at size n (gp_bench.cpp uses the same rule)."""
    return 5 if n <= 200 else (2 if n <= 1000 else 1)


def energy_log(x):
    import numpy as np
    c, s, k, b = (2.0 ** x[:, j] for j in range(4))
    flops = 2.0 * c * c * s * s * k * k * b
    util = (b * s * s / (b * s * s + 256.0)) * (c / (c + 24.0)) * (0.8 + 0.2 * np.sin(1.3 * x[:, 0]))
    return np.log(5e-11 * flops / util + 1.2e-8 * c * s * s * b + 1e-3)


def draw(rng, rows):
    import numpy as np
    lo = np.array([3.0, 2.0, 0.0, 0.0])
    hi = np.array([9.0, 7.0, math.log2(7.0), 8.0])
    x = lo + (hi - lo) * rng.random((rows, 4))
    y_true = energy_log(x)
    y = y_true + np.log1p(0.01 * rng.standard_normal(rows))
    return x, y, y_true


def write_csv(path, x, y, y_true):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["x1", "x2", "x3", "x4", "y", "y_true"])
        for row, a, b in zip(x, y, y_true):
            w.writerow([repr(float(v)) for v in row] + [repr(float(a)), repr(float(b))])


def read_csv(path):
    import numpy as np
    data = np.loadtxt(path, delimiter=",", skiprows=1)
    return data[:, :4], data[:, 4], data[:, 5]


def generate(args):
    import numpy as np
    os.makedirs(args.out, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    x, y, y_true = draw(np.random.default_rng(TRAIN_SEED), max(sizes + [STREAM_ROWS]))
    for n in sizes:
        write_csv(os.path.join(args.out, f"train_{n}.csv"), x[:n], y[:n], y_true[:n])
    xt, yt, yt_true = draw(np.random.default_rng(TEST_SEED), TEST_ROWS)
    write_csv(os.path.join(args.out, "test.csv"), xt, yt, yt_true)


def time_per_call(fn, min_block=0.2, blocks=5):
    """Median seconds per call over `blocks` blocks, each long enough to be timed well."""
    calls = 1
    while True:
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        if time.perf_counter() - t >= min_block:
            break
        calls *= 2
    per_call = []
    for _ in range(blocks):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t) / calls)
    return statistics.median(per_call)


def errors(mean_log, y, y_true):
    import numpy as np
    return {
        "rmse": float(np.sqrt(np.mean((mean_log - y) ** 2))),
        "rmse_true": float(np.sqrt(np.mean((mean_log - y_true) ** 2))),
        "mape": float(np.mean(np.abs(np.exp(mean_log) - np.exp(y)) / np.exp(y))),
        "within_3sd": None,
    }


def run(args):
    import warnings
    import numpy as np
    import sklearn
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel
    from threadpoolctl import threadpool_info

    warnings.simplefilter("ignore", ConvergenceWarning)
    x, y, _ = read_csv(os.path.join(args.data, f"train_{args.n}.csv"))
    xt, yt, yt_true = read_csv(os.path.join(args.data, "test.csv"))

    def make():
        kernel = (ConstantKernel(1.0, (1e-3, 1e5)) * Matern(length_scale=[1.0] * 4, length_scale_bounds=(1e-2, 1e3), nu=2.5)
                  + WhiteKernel(1e-2, (1e-6, 10.0)))
        return GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=args.restarts, random_state=0)

    fit_times = []
    for _ in range(fit_repeats(args.n)):
        t = time.perf_counter()
        mean = x.mean(axis=0)
        std = x.std(axis=0)
        std[std == 0.0] = 1.0
        gp = make().fit((x - mean) / std, y)
        fit_times.append(time.perf_counter() - t)

    def scaled(q):
        return (q - mean) / std

    one = xt[:1]
    t1 = time_per_call(lambda: gp.predict(scaled(one), return_std=True))
    t1000 = time_per_call(lambda: gp.predict(scaled(xt), return_std=True))
    m, sd = gp.predict(scaled(xt), return_std=True)
    result = {
        "n": args.n,
        "fit_s": statistics.median(fit_times),
        "fit_repeats": len(fit_times),
        "predict1_s": t1,
        "predict1000_s": t1000,
        "log_marginal_likelihood": float(gp.log_marginal_likelihood_value_),
        "kernel": str(gp.kernel_),
        "versions": {"sklearn": sklearn.__version__, "numpy": np.__version__,
                     "blas": [(i.get("internal_api"), i.get("version"), i.get("num_threads")) for i in threadpool_info()]},
    }
    result.update(errors(m, yt, yt_true))
    # sklearn's std already includes the WhiteKernel noise (kernel_.diag does): Joule's
    # variance_with_noise.
    result["within_3sd"] = float(np.mean(np.abs(m - yt) <= 3.0 * sd))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


def load_ours(path):
    """gp_bench's Google Benchmark JSON (medians of the repetitions) -> {n: {...}}, seconds."""
    with open(path) as f:
        doc = json.load(f)
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    out = {}
    # With one repetition Google Benchmark writes no aggregates: the single run is the median.
    medians = {b["run_name"] for b in doc["benchmarks"] if b.get("aggregate_name") == "median"}
    for b in doc["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        if b.get("run_type") != "aggregate" and b["run_name"] in medians:
            continue
        kind, n = b["run_name"].split("/")[:2]
        row = out.setdefault(int(n), {})
        row[kind + "_s"] = b["real_time"] * scale[b["time_unit"]]
        for key in ("rmse", "rmse_true", "mape", "within_3sd", "evaluations", "full_data_evaluations",
                    "log_marginal_likelihood"):
            if key in b:
                row[key] = b[key]
    return out


def fmt_time(s):
    if s >= 1.0:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.1f} us"


def table(args):
    sizes = sorted(int(f[5:-5]) for f in os.listdir(args.data) if f.startswith("ours_") and f.endswith(".json"))
    header = ["n", "fit ours", "fit sklearn", "x", "pred 1 ours", "pred 1 sklearn", "x", "pred 1000 ours",
              "pred 1000 sklearn", "x", "RMSE ours", "RMSE sklearn", "MAPE ours", "MAPE sklearn"]
    rows = []
    notes = []
    for n in sizes:
        ours = load_ours(os.path.join(args.data, f"ours_{n}.json"))[n]
        with open(os.path.join(args.data, f"sklearn_{n}.json")) as f:
            peer = json.load(f)
        ratio = lambda k: f"{peer[k] / ours[k]:.1f}"
        rows.append([str(n), fmt_time(ours["fit_s"]), fmt_time(peer["fit_s"]), ratio("fit_s"),
                     fmt_time(ours["predict1_s"]), fmt_time(peer["predict1_s"]), ratio("predict1_s"),
                     fmt_time(ours["predict1000_s"]), fmt_time(peer["predict1000_s"]), ratio("predict1000_s"),
                     f"{ours['rmse']:.5f}", f"{peer['rmse']:.5f}",
                     f"{100 * ours['mape']:.3f}%", f"{100 * peer['mape']:.3f}%"])
        notes.append(f"n={n}: ours LML {ours['log_marginal_likelihood']:.2f}, {int(ours['evaluations'])} LML evaluations "
                     f"({int(ours['full_data_evaluations'])} on all n); sklearn LML {peer['log_marginal_likelihood']:.2f}; "
                     f"RMSE vs noise-free truth ours {ours['rmse_true']:.5f} sklearn {peer['rmse_true']:.5f}; "
                     f"held-out within 3 sd ours {100 * ours['within_3sd']:.1f}% sklearn {100 * peer['within_3sd']:.1f}%; "
                     f"fits timed: {peer['fit_repeats']}")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |"
    print(f"GP fit (restarts={args.restarts}) and predict, Joule (C++/Eigen) vs scikit-learn; x = sklearn time / ours")
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    print()
    print("RMSE: log joules vs the measured (1 % noise) held-out targets; MAPE: joules, exp(mean) vs measured.")
    for note in notes:
        print(note)
    with open(os.path.join(args.data, f"sklearn_{sizes[-1]}.json")) as f:
        print("peer:", json.load(f)["versions"])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--out", required=True)
    g.add_argument("--sizes", default=",".join(map(str, SIZES)))
    r = sub.add_parser("run")
    r.add_argument("--data", required=True)
    r.add_argument("--n", type=int, required=True)
    r.add_argument("--restarts", type=int, default=3)
    r.add_argument("--out", required=True)
    t = sub.add_parser("table")
    t.add_argument("--data", required=True)
    t.add_argument("--restarts", type=int, default=3)
    args = p.parse_args()
    {"generate": generate, "run": run, "table": table}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
