#!/usr/bin/python3
"""Trains one network of bench/e2e/nets.py on synthetic data: what bench/e2e_accuracy.py runs
as a real job through jouled.

    /usr/bin/python3 bench/e2e/train.py --net resnet --batch-size 64 --epochs 5 --samples 768

Plain PyTorch: the dataset is `--samples` synthetic samples (torch.randn / randint, fixed seed),
made once; each epoch shuffles it and trains on every batch of exactly --batch-size samples
(--samples must be a multiple of it) with SGD (lr 0.01, no momentum, the "sgd" of a job's
`training.optimizer`) and cross-entropy; after each epoch it calls joule.progress(epoch,
of=epochs), which does nothing outside jouled. Threads are whatever torch picks from the
environment (jouled sets OMP_NUM_THREADS to the device's thread count); the script does not
choose them.

The last line of stdout is `E2E_RESULT {json}`: torch's thread count, the thread variables seen,
seconds from the process's start to the first step (interpreter, imports, model, data),
training seconds, per-epoch seconds, and this process's own CPU seconds (getrusage), from which
e2e_accuracy.py tells the job's own share of the node's metered energy from other load.
"""

import time

T_IMPORT = time.monotonic()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nets  # noqa: E402

try:
    import joule  # on the job's PYTHONPATH when jouled runs it
except ImportError:  # outside jouled without python/ on the path: no progress reports
    joule = None


def process_age():
    """Seconds since this process was started (exec), from /proc/self/stat."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--net", required=True, choices=sorted(nets.NETWORKS))
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--samples", type=int, required=True, help="samples per epoch (a multiple of the batch)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.samples % args.batch_size:
        parser.error("--samples must be a multiple of --batch-size (every step is a full batch)")

    age_at_import = process_age()
    network = nets.build(args.net, args.seed)
    inputs, labels = nets.batch(args.net, args.samples, args.seed)
    optimizer = torch.optim.SGD(network.parameters(), lr=args.lr)
    loss_function = nn.CrossEntropyLoss()
    network.train()
    generator = torch.Generator().manual_seed(args.seed + 1)
    setup_done = time.monotonic()
    age_at_first_step = process_age()
    cpu_before = cpu_seconds()
    epoch_seconds, losses, steps = [], [], 0
    for epoch in range(1, args.epochs + 1):
        started, total, batches = time.monotonic(), 0.0, 0
        order = torch.randperm(args.samples, generator=generator)
        for first in range(0, args.samples, args.batch_size):
            index = order[first:first + args.batch_size]
            optimizer.zero_grad()
            loss = loss_function(network(inputs[index]), labels[index])
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        steps += batches
        epoch_seconds.append(time.monotonic() - started)
        losses.append(total / batches)
        if joule is not None:
            joule.progress(epoch, of=args.epochs, loss=total / batches)
        print(f"epoch {epoch}/{args.epochs}: loss {total / batches:.4f}, {epoch_seconds[-1]:.2f} s", flush=True)
    training_seconds = time.monotonic() - setup_done
    result = {
        "net": args.net, "batch_size": args.batch_size, "epochs": args.epochs, "samples_per_epoch": args.samples,
        "steps": steps, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "thread_env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                       "JOULE_THREADS", "MALLOC_MMAP_THRESHOLD_",
                                                       "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_")},
        "seconds_to_import_done": age_at_import, "seconds_to_first_step": age_at_first_step,
        "setup_seconds": setup_done - T_IMPORT,
        "training_seconds": training_seconds, "epoch_seconds": epoch_seconds, "losses": losses,
        "cpu_seconds_total": cpu_seconds(), "cpu_seconds_training": cpu_seconds() - cpu_before,
        "process_seconds": process_age(),
    }
    print("E2E_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
