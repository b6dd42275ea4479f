#!/usr/bin/env python3
"""A stand-in for joule-worker at its process boundary, for tests of jouled's probing.

`env` prints an environment, `runtime` a runtime probe's result, `probe --request F ...` one
result line per request in the real format, flushed as it goes: a network costs the sum of its
layers (in proportion to the size of each layer's spec), so probes decompose as THOR's
subtraction assumes. Where a cpufreq scaling_max_freq is named, it is read as the device's clock
cap: below its top (4.7 GHz) a step takes (4.7 GHz / cap)^0.5 as long and (cap / 4.7 GHz)^0.3 the
energy. A request at more threads than one takes threads^-0.7 the time and threads^0.25 the
energy. Each reading of the same request can cost `drift` more than the one before.

It reads how to behave from EMBEDDED_CONFIG below where a test wrote JSON there (jouled runs a
copy of its worker, in a clean environment), else from the JSON file beside it named as it is
plus ".json" (every key optional): env, result, runtime_result (the worker's own JSON, as the tests make them), env_fails,
runtime_fails, fail_at (the plan within a process that fails), seconds (before each result),
cap_file, drift, and the logs it appends to: calls, done, requests, runtime_calls, caps,
threads_log.
"""
import json
import sys
import time

EMBEDDED_CONFIG = ""
if EMBEDDED_CONFIG:
    config = json.loads(EMBEDDED_CONFIG)
else:
    with open(sys.argv[0] + ".json") as config_file:
        config = json.load(config_file)

ENVIRONMENT = {"torch_version": "1.13.1", "blas": "fake BLAS", "threads": 1, "device": "cpu",
               "device_name": "fake CPU", "cuda": "",
               "fingerprint": "torch 1.13.1; blas fake BLAS; threads 1; device cpu; fake CPU"}
NETWORK = {"name": "net", "joules_per_step": 0.01, "seconds_per_step": 0.001, "joules_spread": 0.0,
           "seconds_spread": 0.0, "final_loss": 1.0, "steps_per_repetition": 10,
           "repetitions": [{"joules_per_step": 0.01, "seconds_per_step": 0.001, "steps": 10}]}
RESULT = {"environment": ENVIRONMENT, "meter_source": "modelled", "measured": False, "batch_size": 1,
          "networks": [NETWORK]}


def log(key, text):
    if config.get(key):
        with open(config[key], "a") as file:
            file.write(text + "\n")


args = sys.argv[1:]
if args[0] == "env":
    if config.get("env_fails"):
        sys.stderr.write("joule-worker: error while loading shared libraries: libtorch.so\n")
        sys.exit(1)
    print(json.dumps(config.get("env", ENVIRONMENT)))
    sys.exit(0)
if args[0] == "runtime":
    log("runtime_calls", " ".join(args))
    if config.get("runtime_fails"):
        sys.stderr.write("joule-worker: python3 (1 blocks): importing torch: it ended; it said: "
                         "ModuleNotFoundError: No module named 'torch'\n")
        sys.exit(1)
    out = config["runtime_result"]
    # Each kind asked for costs 20 µs a layer beyond the line (8 layers, a flatten and a Linear
    # beside them); gru's network does not build here, as a kind a worker cannot read.
    kinds = args[args.index("--kinds") + 1].split(",") if "--kinds" in args else []
    for kind in kinds:
        if kind == "gru":
            sys.stderr.write("joule-worker runtime: gru layers not read: it said: no GRU here\n")
            continue
        extra = 1e-4 + 1e-5 * 2 + 8 * 2e-5
        out["steps"].append(dict(out["steps"][0], modules=10, kind=kind, kind_layers=8,
                                 runtime_seconds_per_step=1e-4 + extra, difference_seconds_per_step=extra,
                                 runtime_joules_per_step=1e-3 + 10 * extra, difference_joules_per_step=10 * extra))
    print(json.dumps(out))
    sys.exit(0)
template = config.get("result", RESULT)
cap = 4700000.0
if config.get("cap_file"):
    with open(config["cap_file"]) as f:
        cap = float(f.read())
    log("caps", "%d" % cap)
time_factor = (4700000.0 / cap) ** 0.5
energy_factor = (cap / 4700000.0) ** 0.3
requests = [args[i + 1] for i, arg in enumerate(args) if arg == "--request"]
log("calls", " ".join(args))
for n, path in enumerate(requests):
    with open(path) as f:
        request = json.load(f)
    line = json.dumps([request["batch_size"], request["networks"]], sort_keys=True)
    read_before = 0
    if config.get("requests"):
        try:
            with open(config["requests"]) as earlier_requests:
                read_before = sum(1 for earlier in earlier_requests if earlier.rstrip("\n") == line)
        except FileNotFoundError:
            pass
    drifted = 1.0 + config.get("drift", 0.0) * read_before
    log("requests", line)
    time.sleep(config.get("seconds", 0.0))
    if n == config.get("fail_at", -1):
        sys.stderr.write("no LibTorch here\n")
        sys.exit(1)
    out = dict(template, batch_size=request["batch_size"])
    threads = request.get("threads", 1)
    out["environment"] = dict(template["environment"], threads=threads)
    log("threads_log", "%d" % threads)
    net = template["networks"][0]
    size = lambda network: sum(len(json.dumps(layer)) for layer in network["layers"]) / 100.0
    out["networks"] = [dict(net, joules_per_step=net["joules_per_step"] * size(spec) * energy_factor * drifted
                                                 * threads ** 0.25,
                            seconds_per_step=net["seconds_per_step"] * size(spec) * time_factor * threads ** -0.7)
                       for spec in request["networks"]]
    print(json.dumps(out), flush=True)
    log("done", path)
