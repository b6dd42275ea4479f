#!/usr/bin/env bash
# Packs what bench/gpu/check.sh needs on a GPU machine that has PyTorch, CMake, Ninja and g++ but
# none of jouled's Debian libraries, into .gpu-carry/ (gitignored; about 60 MB, carried there):
#   jouled            this build's jouled, stripped, its RPATH set to lib/ beside it (patchelf)
#   lib/              the Debian libraries it loads, less glibc's and libstdc++/libgcc (the GPU
#                     machine's own are newer, and older binaries run on them)
#   devdeps/*.deb     the Debian header packages the CUDA joule-worker builds against
#   specs/*.json      the held-out end-to-end networks (bench/e2e/nets.py) traced with joule.spec
# Run here, after scripts/build.sh jouled: bench/gpu/pack.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
carry=.gpu-carry
command -v patchelf >/dev/null || { echo "pack.sh: needs patchelf (apt-get install patchelf)" >&2; exit 1; }
rm -rf "$carry"
mkdir -p "$carry/lib" "$carry/devdeps" "$carry/specs"
strip -o "$carry/jouled" "$build/daemon/jouled"
# DT_RPATH, not RUNPATH: it also serves the libraries' own dependencies (libsystemd's libcap...).
patchelf --force-rpath --set-rpath '$ORIGIN/lib' "$carry/jouled"
ldd "$build/daemon/jouled" | awk '$3 ~ /^\// {print $3}' |
  grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*|libpthread|libdl|librt)\.so' |
  while read -r lib; do cp -L "$lib" "$carry/lib/"; done
(cd "$carry/devdeps" && apt-get download libeigen3-dev nlohmann-json3-dev libfmt-dev libfmt9 libcli11-dev \
  liblbfgspp-dev >/dev/null)
# The third held-out set (never read for the estimator's design; bench/e2e/nets.py), traced with
# Debian's python3-torch at one sample's shape: check.py trains them at its own batch size.
PYTHONPATH=python:bench/e2e /usr/bin/python3 - "$carry/specs" <<'PY'
import json, os, sys
import joule, nets
out = sys.argv[1]
for name, (factory, make_input, subset) in nets.NETWORKS.items():
    if subset != "held-out":
        continue
    model = nets.build(name)
    inputs, _ = nets.batch(name, 2)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(joule.spec(model, inputs, name=name), f)
PY
du -sh "$carry"
