#!/usr/bin/env bash
# Builds the whole tree with AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/:
# -DJOULE_SANITIZE=ON, g++ or clang) and runs the whole test suite there with CTest.
#
#   scripts/sanitize.sh [CTEST ARGS...]
#       e.g. scripts/sanitize.sh -R 'JobsTest|CliTest' or scripts/sanitize.sh -L unit
#
# ASan's reports (memory errors, leaks at exit) go to build-asan/sanitizer-reports/
# report.<program>.<pid>, not to stderr: the integration tests start real jouled processes whose
# logs are removed with their temp dirs, and a jouled that leaks at a clean exit still looks
# healthy to the test that stopped it. UBSan's go to the process's stderr (g++'s separate UBSan
# runtime ignores log_path); each one aborts its process (-fno-sanitize-recover), so its test
# fails. The options below reach what the tests start (the test binaries, jouled, joulectl)
# through the environment, but not what jouled starts in turn: the job runner (`jouled
# --job-runner`) and joule-worker get environments of jouled's making, so they run with the
# sanitizers' defaults (stop at the first finding, leaks checked, no suppressions), report on
# the job's or probe's stderr file, and a finding there shows as a failed job or probe.
# Exits 1 if a test failed or any report was written; the reports are printed at the end.
#
# Leaks inside prebuilt third-party libraries that we cannot fix (LibTorch, OpenBLAS, ...) are
# suppressed in scripts/sanitizer/lsan.supp, each with the reason; findings in our code never are.
# UBSan cannot suppress anything here: its checks are not recoverable.
#
# Environment: JOULE_SANITIZE_JOBS (build and ctest parallelism, default: all CPUs);
# JOULE_SANITIZE_WORKER=0 leaves joule-worker out of the sanitized build and gives the sanitized
# jouled the plain build's (build/worker/joule-worker, through PATH): its five LibTorch sources are
# the slowest to compile here and none of them is jouled's code. The worker's own tests and the
# built-in trainer's integration tests then run only in the plain suite; jouled's probing paths
# still run sanitized. CI sets it, after scripts/test.sh has built build/.
# About 2x the time of scripts/test.sh on the same machine; the build is the larger part.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD="$ROOT/build-asan"
SUPPRESSIONS="$ROOT/scripts/sanitizer"
REPORTS="$BUILD/sanitizer-reports"
JOBS=${JOULE_SANITIZE_JOBS:-$(nproc)}

say() { printf '==> %s\n' "$*" >&2; }

cd "$ROOT"
./scripts/install-deps.sh

say "configuring $BUILD"
# -Og -g1: line tables are all a report needs, and -Og (optimisations that keep code debuggable)
# compiles in two thirds of the time of ASan's usual -O1 once UBSan instruments too (measured on
# daemon/src/jobs/job_service.cpp with both sanitizers: -O1 72 s, -Og 48 s, -O0 45 s; without
# sanitizers -O2 -g takes 50 s). The benchmarks are not tests, so they are not built here.
worker=ON
if [ "${JOULE_SANITIZE_WORKER:-1}" = 0 ]; then
  plain_worker="$ROOT/build/worker/joule-worker"
  if [ ! -x "$plain_worker" ]; then
    say "JOULE_SANITIZE_WORKER=0 needs the plain build's $plain_worker: run scripts/build.sh joule-worker first"
    exit 2
  fi
  worker=OFF
  export PATH="$(dirname "$plain_worker"):$PATH"
  say "joule-worker: the plain build's $plain_worker"
fi
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-Og -g1 -DNDEBUG" \
  -DJOULE_SANITIZE=ON -DJOULE_BUILD_BENCH=OFF -DJOULE_BUILD_WORKER="$worker" >/dev/null
say "building (-j$JOBS; load $(cut -d' ' -f1-3 /proc/loadavg))"
started=$SECONDS
cmake --build "$BUILD" -j"$JOBS"
say "built in $((SECONDS - started))s"

# World-writable (sticky, like /tmp): jobs may run under accounts of their own.
rm -rf "$REPORTS"
mkdir -p "$REPORTS"
chmod 1777 "$REPORTS"

# halt_on_error: the first finding ends the process (UBSan's do anyway, see -fno-sanitize-recover
# in CMakeLists.txt). log_exe_name names the program in each report's file name. Static
# initialisers that read another file's globals are findings too (strict_init_order).
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:check_initialization_order=1:strict_init_order=1:log_path=$REPORTS/report:log_exe_name=1"
export LSAN_OPTIONS="suppressions=$SUPPRESSIONS/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"

say "running the tests (-j$JOBS; load $(cut -d' ' -f1-3 /proc/loadavg))"
started=$SECONDS
status=0
(cd "$BUILD" && ctest --output-on-failure -j "$JOBS" "$@") || status=$?
say "tests ran in $((SECONDS - started))s (ctest status $status; load $(cut -d' ' -f1-3 /proc/loadavg))"

shopt -s nullglob
reports=("$REPORTS"/report.*)
shopt -u nullglob
if [ ${#reports[@]} -gt 0 ]; then
  for report in "${reports[@]}"; do
    say "sanitizer report ${report#"$ROOT/"}:"
    cat "$report" >&2
  done
  say "${#reports[@]} sanitizer report(s) in ${REPORTS#"$ROOT/"}/"
  status=1
else
  say "no sanitizer reports"
fi
exit "$status"
