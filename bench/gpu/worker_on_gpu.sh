#!/usr/bin/env bash
# Builds joule-worker alone against PyTorch's CUDA LibTorch (Debian's libtorch-dev is CPU-only)
# and checks it on a real NVIDIA GPU: the environment it records, NVML metering, whole-model
# measurements and a THOR probe on cuda:0. Run from the repository root on a GPU machine with
# PyTorch, CMake, Ninja and g++ (bench/gpu/build_worker.sh builds the worker; bench/gpu/pack.sh
# packs the Debian header packages it needs).
# Usage: bench/gpu/worker_on_gpu.sh [OUTPUT_DIR]
set -euo pipefail
out=${1:-/tmp/joule-gpu}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,power.draw,power.limit --format=csv | tee "$out/gpu.csv"
g++ --version | head -1
python3 -c 'import torch; print("python torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
build=/tmp/joule-worker-build
worker_env=$(bench/gpu/build_worker.sh "$build" joule_additivity_bench | tail -1)
eval "$worker_env"
worker="$build/worker/joule-worker"
"$worker" env --device cuda:0 | tee "$out/env.json"
"$worker" meters --device cuda:0 --seconds 2 | tee "$out/meters.json"
# Whole models on the GPU, metered by NVML (each: 10 warm-up steps, 5 readings of 400 steps: NVML updates every 10-100 ms).
for model in lenet5 cnn5 vgg_small transformer_small lstm_classifier; do
  "$worker" measure --model "examples/models/$model.json" --device cuda:0 --batch-size 256 --steps 400 --repetitions 5 --json \
    > "$out/measure-$model.json"
  python3 - "$out/measure-$model.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); n = r["networks"][0]
print(f'{n["name"]:<18} {n["seconds_per_step"]*1e3:8.2f} ms/step  {n["joules_per_step"]:8.3f} J/step  '
      f'spread {n["joules_spread"]*100:4.1f} %  source {r["meter_source"]} measured={r["measured"]}')
PY
done
# The same on the CPU of that machine, for the contrast (modelled: no RAPL there either, likely).
"$worker" measure --model examples/models/cnn5.json --device cpu --batch-size 64 --steps 5 --repetitions 3 --json \
  > "$out/measure-cnn5-cpu.json" || true
# A THOR probe of a conv layer in the hidden position (4 networks, interleaved) on the GPU.
python3 - > "$out/probe-request.json" <<'PY'
import json
head = {"type": "linear", "out_features": 10}
ref = {"type": "conv2d", "out_channels": 64, "kernel_size": 1}
target = {"type": "conv2d", "out_channels": 64, "kernel_size": 3, "padding": 1}
inp = {"shape": [64, 32, 32]}
nets = [
  {"name": "R-L-H", "input": inp, "layers": [ref, target, {"type": "flatten"}, head]},
  {"name": "R-H'", "input": inp, "layers": [ref, {"type": "flatten"}, head]},
  {"name": "H'", "input": inp, "layers": [{"type": "flatten"}, head]},
  {"name": "H", "input": inp, "layers": [{"type": "flatten"}, head]},
]
print(json.dumps({"device": "cuda:0", "batch_size": 128, "warmup_steps": 20, "steps_per_repetition": 100,
                  "repetitions": 5, "networks": nets}))
PY
"$worker" probe --request "$out/probe-request.json" > "$out/probe-result.json"
python3 - "$out/probe-result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("probe:", r["meter_source"], "measured" if r["measured"] else "NOT measured", r["environment"]["fingerprint"])
for n in r["networks"]:
    print(f'  {n["name"]:<8} {n["seconds_per_step"]*1e3:8.3f} ms/step {n["joules_per_step"]:8.4f} J/step spread {n["joules_spread"]*100:4.1f} %')
j = [n["joules_per_step"] for n in r["networks"]]
print(f"  conv2d@hidden by subtraction: {j[0] - (j[1] - j[2]) - j[3]:.4f} J/step")
PY
# THOR additivity on the GPU: every layer probed in its position, summed, against the whole model.
"$build/worker/joule_additivity_bench" "$worker" cuda:0 256 examples/models/lenet5.json examples/models/cnn5.json \
  examples/models/transformer_small.json > "$out/additivity.json"
