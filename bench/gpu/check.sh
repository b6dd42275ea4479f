#!/usr/bin/env bash
# The end-to-end accuracy check on a real GPU meter, in one command that fits in 10 minutes on a
# machine with one NVIDIA GPU and PyTorch (bench/README.md, "Estimates against NVML"):
#   bench/gpu/check.sh [OUT_DIR] [check.py options, e.g. --probe-seconds 240 --batch 256]
# Builds the CUDA joule-worker (bench/gpu/build_worker.sh), then bench/gpu/check.py runs jouled
# with NVML on cuda:0, measures each network whole on the GPU, probes cuda:0 for a few minutes
# naming them, and prints the estimates' error against NVML per network and per set, the FLOPs
# baseline's, and the same network measured twice. jouled comes from $JOULED, else .gpu-carry/
# (bench/gpu/pack.sh, for a machine without jouled's Debian libraries), else build/, else PATH.
# Exits 2 with the reason where there is no NVIDIA GPU or no PyTorch with CUDA.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/joule-check}
shift || true
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "check.sh: no NVIDIA GPU here (nvidia-smi finds none): nothing to check" >&2
  exit 2
fi
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "check.sh: no PyTorch with CUDA for python3: the CUDA joule-worker is built against its LibTorch" >&2
  exit 2
fi
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,power.draw,power.limit,temperature.gpu --format=csv | tee "$out/gpu.csv"
python3 -c 'import torch; print("python torch", torch.__version__, "cuda", torch.version.cuda)' | tee "$out/torch.txt"
jouled=${JOULED:-}
for candidate in .gpu-carry/jouled build/daemon/jouled "$(command -v jouled || true)"; do
  [ -z "$jouled" ] && [ -n "$candidate" ] && [ -x "$candidate" ] && jouled=$candidate
done
[ -n "$jouled" ] || { echo "check.sh: no jouled (set JOULED, or run bench/gpu/pack.sh where it is built)" >&2; exit 2; }
"$jouled" --version >/dev/null || { echo "check.sh: $jouled does not run here (ldd $jouled)" >&2; exit 2; }
build=/tmp/joule-worker-build
worker_env=$(bench/gpu/build_worker.sh "$build" | tail -1)
eval "$worker_env"
python3 bench/gpu/check.py --jouled "$jouled" --worker "$build/worker/joule-worker" --device cuda:0 --out "$out" "$@"
