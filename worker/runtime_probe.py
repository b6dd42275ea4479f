"""The Python half of `joule-worker runtime`: what a PyTorch training loop written in Python costs
beyond the same loop in LibTorch, and what starting the interpreter and importing torch costs.

joule-worker embeds this file and runs it as `PYTHON -c <this file> --layers L --width W --batch B
--threads T --reading-seconds S --readings R`, talking over the child's stdin and stdout, one
line at a time, so that it can meter each phase with its own meter (a system meter such as RAPL,
or this child's CPU clock for the `modelled` one):

    child                                   joule-worker
    imported PYTHON TORCH            ->     start-up window closed (from before the spawn)
    begin                            ->     a reading's window opened
                                     <-     go
    (steps for about S seconds)
    end STEPS SECONDS                ->     the reading's window closed
    ... R readings ...
    done                             ->     closes the child's stdin; the child exits

The network is L blocks of [Linear(W, W), ReLU] then Linear(W, 10), trained with plain SGD and
cross-entropy on one fixed synthetic batch, the loop a training script would write: zero_grad,
forward, loss, backward, step, and loss.item() (which scripts call to log). joule-worker trains
the same network in LibTorch with the same readings; the difference per step is Python's.
"""

import time

import torch  # noqa: E402  (the import is what the start-up window measures)
import torch.nn as nn  # noqa: E402

import argparse  # noqa: E402
import sys  # noqa: E402


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main():
    say(f"imported {sys.version.split()[0]} {torch.__version__}")
    parser = argparse.ArgumentParser(prog="joule-worker runtime (python side)")
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--reading-seconds", type=float, required=True)
    parser.add_argument("--readings", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=20, help="steps at least")
    parser.add_argument("--warmup-seconds", type=float, default=0.0, help="and at least this long")
    args = parser.parse_args(sys.argv[1:])
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    blocks = []
    for _ in range(args.layers):
        blocks += [nn.Linear(args.width, args.width), nn.ReLU()]
    network = nn.Sequential(*blocks, nn.Linear(args.width, 10))
    optimizer = torch.optim.SGD(network.parameters(), lr=0.01)
    loss_function = nn.CrossEntropyLoss()
    inputs = torch.randn(args.batch, args.width)
    labels = torch.randint(0, 10, (args.batch,))
    network.train()

    def step():
        optimizer.zero_grad()
        loss = loss_function(network(inputs), labels)
        loss.backward()
        optimizer.step()
        return loss.item()

    warm_until, warmed = time.monotonic() + args.warmup_seconds, 0
    while warmed < args.warmup or time.monotonic() < warm_until:
        step()
        warmed += 1
    for _ in range(args.readings):
        say("begin")
        if sys.stdin.readline().strip() != "go":
            return 2
        started = time.monotonic()
        steps, elapsed = 0, 0.0
        while elapsed < args.reading_seconds:
            step()
            steps += 1
            elapsed = time.monotonic() - started
        say(f"end {steps} {elapsed:.9f}")
    say("done")
    sys.stdin.read()  # joule-worker reads this process's CPU clock until it closes our stdin
    return 0


if __name__ == "__main__":
    sys.exit(main())
