#!/usr/bin/env bash
# Installs everything Joule needs to build, run and test, from Debian 12's own packages.
# Idempotent: does nothing when all packages are already there. Needs root (or sudo).
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build pkg-config
  # libraries (all from Debian; nothing is downloaded at build time)
  libboost-dev libeigen3-dev liblbfgspp-dev nlohmann-json3-dev libfmt-dev libspdlog-dev libcli11-dev libtomlplusplus-dev
  prometheus-cpp-dev libsystemd-dev libsqlite3-dev libssl-dev
  # joule-worker: LibTorch 1.13 (CPU), which calls the system libblas.so.3: OpenBLAS, not the
  # reference BLAS that is 6-13x slower for linear and recurrent layers (measured)
  libtorch-dev libopenblas0-pthread
  # the estimator's GP solves batch predictions with BLAS (cblas.h, libblas.so -> OpenBLAS)
  libblas-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus  # the real server the metrics and dashboards tests scrape with, and promtool
  python3-yaml  # the dashboards test reads alerts/ and the Grafana provisioning files
  systemd     # systemd-analyze for the unit checks (systemd need not be running)
  python3-seccomp  # the unit's RestrictAddressFamilies= applied to a real jouled (systemd_address_families)
  lintian     # the Debian package's test (debian_package): cpack builds it, lintian checks it
  # the Slurm adapter's real-Slurm test (tests/slurm/run.sh starts its own single-host Slurm with
  # scripts/slurm-up.sh; the packages' services are not started, see policy-rc.d below)
  slurm-wlm slurm-client munge
  procps curl python3
  # the Python package (python/): PyTorch for its tracing tests, setuptools for pip install ./python
  python3-torch python3-torchvision python3-setuptools
  # the REST API's contract (docs/openapi.yaml): read, validated against the OpenAPI 3.0
  # meta-schema that openapi-specification ships, and live answers validated against it
  python3-yaml python3-jsonschema openapi-specification
  # the status page's test (python_status_page): jouled's page in a real headless browser
  chromium
  # joulectl's completion is tested under the bash-completion framework as well as without it,
  # and its man page is rendered by man (cli_joulectl)
  bash-completion man-db
)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root (missing: ${missing[*]})" >&2; exit 1; }
  SUDO=sudo
fi
echo "install-deps: installing ${missing[*]}"
# Installing the prometheus package would also start a Prometheus server on :9090, and
# slurm-wlm/munge would start slurmctld, slurmd and munged (without systemd their postinst
# fails: invoke-rc.d "could not determine current runlevel"); the tests start their own, so keep
# package scripts from starting services: policy-rc.d "exit 101" while apt runs, removed on
# any exit (the trap is set before the file exists, so a failure halfway removes it too).
created_policy=0
trap '[ $created_policy = 0 ] || $SUDO rm -f /usr/sbin/policy-rc.d' EXIT
if [ ! -e /usr/sbin/policy-rc.d ]; then
  created_policy=1
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
