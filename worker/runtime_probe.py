"""The Python half of `joule-worker runtime`: what a PyTorch training loop written in Python costs
beyond the same loop in LibTorch, and what starting the interpreter and importing torch costs.

joule-worker embeds this file and runs it as `PYTHON -c <this file> --network JSON --batch B
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

The network is a spec joule-worker wrote (`{"input": [...], "layers": [{"type": ..., "in": [...],
args...}]}`, each layer with its per-sample input shape): L blocks of Linear + ReLU for the
per-module line, or several layers of one kind (conv2d, batchnorm1d, lstm...) for that kind's own
cost. It is built as a user writes one, torch.nn modules called in turn from the network's
forward (an LSTM's output unpacked there, attention called on (x, x, x)), and trained with plain
SGD and cross-entropy, the loop a training script would write: each step's batch drawn by index
from synthetic data in memory (eight batches, reshuffled each pass), zero_grad, forward, loss,
backward, step, and loss.item() (which scripts call to log). A DataLoader's own per-batch work
(workers, collation) is not in it.
joule-worker trains the same network in LibTorch with the same readings; the difference per step
is Python's.
"""

import time

import torch  # noqa: E402  (the import is what the start-up window measures)
import torch.nn as nn  # noqa: E402

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def build_layer(layer):
    """One layer of the spec as torch.nn builds it, and how the forward calls it (None: module(x))."""
    kind, shape = layer["type"], layer["in"]
    if kind == "linear":
        return nn.Linear(shape[-1], layer["out_features"], bias=layer.get("bias", True)), None
    if kind in ("conv1d", "conv2d"):
        convolution = nn.Conv1d if kind == "conv1d" else nn.Conv2d
        return convolution(shape[0], layer.get("out_channels", 1), layer.get("kernel_size", 1),
                           stride=layer.get("stride", 1), padding=layer.get("padding", 0),
                           dilation=layer.get("dilation", 1), groups=layer.get("groups", 1),
                           bias=layer.get("bias", True)), None
    if kind in ("maxpool2d", "avgpool2d"):
        kernel = layer.get("kernel_size", 1)
        pool = nn.MaxPool2d if kind == "maxpool2d" else nn.AvgPool2d
        return pool(kernel, stride=layer.get("stride", kernel), padding=layer.get("padding", 0)), None
    if kind == "adaptive_avgpool2d":
        return nn.AdaptiveAvgPool2d(layer.get("output_size", 1)), None
    if kind == "batchnorm1d":
        return nn.BatchNorm1d(shape[0]), None
    if kind == "batchnorm2d":
        return nn.BatchNorm2d(shape[0]), None
    if kind == "layernorm":
        return nn.LayerNorm(shape[-1]), None
    if kind == "dropout":
        return nn.Dropout(layer.get("p", 0.5)), None
    if kind == "softmax":
        dim = layer.get("dim", -1)
        return nn.Softmax(dim=dim if dim < 0 else dim + 1), None
    if kind == "flatten":
        return nn.Flatten(1), None
    plain = {"relu": nn.ReLU, "relu6": nn.ReLU6, "gelu": nn.GELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid,
             "silu": nn.SiLU, "hardswish": nn.Hardswish, "mish": nn.Mish, "identity": nn.Identity}
    if kind in plain:
        return plain[kind](), None
    if kind == "leaky_relu":
        return nn.LeakyReLU(layer.get("negative_slope", 0.01)), None
    if kind == "elu":
        return nn.ELU(layer.get("alpha", 1.0)), None
    if kind == "softplus":
        return nn.Softplus(layer.get("beta", 1.0), layer.get("threshold", 20.0)), None
    if kind in ("lstm", "gru"):
        recurrent = nn.LSTM if kind == "lstm" else nn.GRU
        module = recurrent(shape[-1], layer.get("hidden_size", 1), layer.get("num_layers", 1), batch_first=True,
                           bidirectional=layer.get("bidirectional", False))
        if layer.get("output") == "sequence":
            return module, lambda m, x: m(x)[0]
        return module, lambda m, x: m(x)[0][:, -1]
    if kind == "multihead_attention":
        module = nn.MultiheadAttention(shape[-1], layer.get("num_heads", 1), batch_first=True)
        return module, lambda m, x: m(x, x, x, need_weights=False)[0]
    if kind == "transformer_encoder_layer":
        return nn.TransformerEncoderLayer(shape[-1], layer.get("nhead", 1), layer.get("dim_feedforward", 1),
                                          activation=layer.get("activation", "relu"),
                                          norm_first=layer.get("norm_first", False), batch_first=True), None
    raise ValueError(f"the runtime probe builds no {kind} layer")


class Network(nn.Module):
    def __init__(self, layers):
        super().__init__()
        built = [build_layer(layer) for layer in layers]
        self.layers = nn.ModuleList(module for module, _ in built)
        self.calls = [call for _, call in built]

    def forward(self, x):
        for module, call in zip(self.layers, self.calls):
            x = module(x) if call is None else call(module, x)
        return x


def main():
    say(f"imported {sys.version.split()[0]} {torch.__version__}")
    parser = argparse.ArgumentParser(prog="joule-worker runtime (python side)")
    parser.add_argument("--network", required=True, help="the spec, as JSON")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--reading-seconds", type=float, required=True)
    parser.add_argument("--readings", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=20, help="steps at least")
    parser.add_argument("--warmup-seconds", type=float, default=0.0, help="and at least this long")
    args = parser.parse_args(sys.argv[1:])
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    spec = json.loads(args.network)
    network = Network(spec["layers"])
    optimizer = torch.optim.SGD(network.parameters(), lr=0.01)
    loss_function = nn.CrossEntropyLoss()
    # A script's data: each step gathers its batch by index from samples in memory (LibTorch's
    # loop trains on one batch; the gather and its Python are part of what a step costs here).
    samples = args.batch * 8
    inputs = torch.randn(samples, *spec["input"])
    labels = torch.randint(0, 10, (samples,))
    drawn = {"order": torch.randperm(samples), "first": 0}
    network.train()

    def step():
        if drawn["first"] >= samples:
            drawn["order"], drawn["first"] = torch.randperm(samples), 0
        index = drawn["order"][drawn["first"]:drawn["first"] + args.batch]
        drawn["first"] += args.batch
        optimizer.zero_grad()
        loss = loss_function(network(inputs[index]), labels[index])
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
