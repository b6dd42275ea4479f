#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (build-fuzz/: clang-16, ASan + UBSan) and runs them.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#       Fuzzes each target (default: all) for SECONDS_PER_TARGET (default 60), one at a time,
#       over a copy of fuzz/corpus/<target>/ in build-fuzz/fuzz-runs/<target>/. Every crash-*,
#       leak-*, timeout-* and oom-* input found is copied to fuzz/regressions/<target>/. Exits 1
#       if anything was found.
#   scripts/fuzz.sh --regressions [TARGET...]
#       Runs every saved regression input, one by one, and the whole corpus once (-runs=0);
#       exits 1 if any of them still fails.
#
# Environment: JOULE_FUZZ_JOBS (build parallelism, default: all CPUs), JOULE_FUZZ_RESTARTS
# (how often a target is started again after a finding within its time, default 3),
# JOULE_FUZZ_ARGS (more libFuzzer flags, e.g. "-max_len=65536").
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD="$ROOT/build-fuzz"
ALL_TARGETS=(job_spec model_spec daemon_config policy cluster_sync worker_protocol http_api)
JOBS=${JOULE_FUZZ_JOBS:-$(nproc)}
RESTARTS=${JOULE_FUZZ_RESTARTS:-3}

say() { printf '==> %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# clang-16 and libFuzzer (libclang_rt.fuzzer, in libclang-rt-16-dev), from Debian's packages
# only. Debian 12's default clang-14 cannot build daemon/ (see the top-level CMakeLists.txt).
CLANG_VERSION=16

have_libfuzzer() {
  command -v "clang++-$CLANG_VERSION" >/dev/null || return 1
  local runtime
  runtime=$("clang-$CLANG_VERSION" -print-runtime-dir 2>/dev/null) || return 1
  [ -e "$runtime/libclang_rt.fuzzer-x86_64.a" ] || [ -e "$runtime/libclang_rt.fuzzer.a" ]
}

install_dependencies() {
  local packages=()
  command -v cmake >/dev/null || packages+=(cmake)
  command -v ninja >/dev/null || packages+=(ninja-build)
  if ! have_libfuzzer; then
    # A fresh container has no package lists: apt-cache then knows no package at all.
    apt-cache show "clang-$CLANG_VERSION" >/dev/null 2>&1 || as_root apt-get update
    packages+=("clang-$CLANG_VERSION" "libclang-rt-$CLANG_VERSION-dev")
  fi
  [ ${#packages[@]} -eq 0 ] && return 0
  say "installing ${packages[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${packages[@]}"
  have_libfuzzer || { echo "libFuzzer is still missing after installing ${packages[*]}" >&2; exit 1; }
}

build() {
  # Configured afresh when missing or made by another compiler (a cache keeps its compiler).
  if [ ! -f "$BUILD/build.ninja" ] ||
    ! grep -q "^CMAKE_CXX_COMPILER:[A-Z]*=.*clang++-$CLANG_VERSION\$" "$BUILD/CMakeCache.txt"; then
    say "configuring $BUILD"
    CC="clang-$CLANG_VERSION" CXX="clang++-$CLANG_VERSION" cmake --fresh -S "$ROOT" -B "$BUILD" -G Ninja \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DJOULE_BUILD_FUZZERS=ON
  fi
  local targets=()
  for t in "$@"; do targets+=("${t}_fuzz"); done
  say "building ${targets[*]} (-j$JOBS)"
  cmake --build "$BUILD" -j"$JOBS" --target "${targets[@]}"
}

# Totals over the rounds of one target (one log per round): executions, the last exec/s, and
# the last coverage line ("#N ... cov: C ft: F ..."). A crashing run prints its stats twice
# (at the end and from the crash handler): each log counts once.
summary_of() {
  local execs=0 rate="?" cov="?" ft="?" log line n
  for log in "$@"; do
    n=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log" | tail -n 1)
    execs=$((execs + ${n:-0}))
    n=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+)/\1/p' "$log" | tail -n 1)
    rate=${n:-$rate}
    line=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n 1 || true)
    if [ -n "$line" ]; then
      cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$line")
      ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$line")
    fi
  done
  printf 'runs %s, exec/s %s, cov %s, ft %s' "$execs" "$rate" "$cov" "$ft"
}

fuzz_target() {
  local target=$1 seconds=$2
  local binary="$BUILD/fuzz/${target}_fuzz"
  local work="$BUILD/fuzz-runs/$target"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  cp -r "$ROOT/fuzz/corpus/$target/." "$work/corpus/"
  # The http_api fixture keeps its SQLite file here (tmpfs where there is one); removed below,
  # even after a crash.
  local state
  state=$(mktemp -d "$( [ -w /dev/shm ] && echo /dev/shm || echo "${TMPDIR:-/tmp}")/joule-fuzz-$target.XXXXXX")
  local deadline=$((SECONDS + seconds)) round=0 status=0 logs=()
  while :; do
    local left=$((deadline - SECONDS))
    [ "$left" -ge 1 ] || break
    say "$target: fuzzing for ${left}s (round $round)"
    logs+=("$work/fuzz.$round.log")
    set +e
    # shellcheck disable=SC2086 # JOULE_FUZZ_ARGS is a list of flags
    JOULE_FUZZ_STATE_DIR="$state" "$binary" -max_total_time="$left" -timeout=30 -rss_limit_mb=4096 \
      -print_final_stats=1 -artifact_prefix="$work/artifacts/" ${JOULE_FUZZ_ARGS:-} "$work/corpus" \
      >"$work/fuzz.$round.log" 2>&1
    status=$?
    set -e
    [ "$status" -eq 0 ] && break
    round=$((round + 1))
    [ "$round" -le "$RESTARTS" ] || break
  done
  rm -rf "$state"
  local found=0
  shopt -s nullglob
  for artifact in "$work"/artifacts/{crash,leak,timeout,oom}-*; do
    mkdir -p "$ROOT/fuzz/regressions/$target"
    cp "$artifact" "$ROOT/fuzz/regressions/$target/"
    say "$target: FOUND $(basename "$artifact") -> fuzz/regressions/$target/ (logs: $work/fuzz.*.log)"
    found=1
  done
  shopt -u nullglob
  local note=""
  if [ "$found" -eq 1 ]; then note=", FINDINGS"; fi
  RESULTS+=("$(printf '%-16s %s, corpus %s files%s' "$target" "$(summary_of "${logs[@]}")" \
    "$(find "$work/corpus" -type f | wc -l)" "$note")")
  return "$found"
}

check_regressions() {
  local target=$1
  local binary="$BUILD/fuzz/${target}_fuzz" failed=0
  local state
  state=$(mktemp -d "$( [ -w /dev/shm ] && echo /dev/shm || echo "${TMPDIR:-/tmp}")/joule-fuzz-$target.XXXXXX")
  local log="$BUILD/fuzz-runs/$target-regressions.log"
  mkdir -p "$(dirname "$log")"
  : >"$log"
  shopt -s nullglob
  local inputs=("$ROOT/fuzz/regressions/$target"/*)
  shopt -u nullglob
  # One process per input: the first failure would otherwise hide the rest.
  for input in "${inputs[@]}"; do
    if JOULE_FUZZ_STATE_DIR="$state" "$binary" -timeout=30 -rss_limit_mb=4096 "$input" >>"$log" 2>&1; then
      say "$target: ok   ${input#"$ROOT/"}"
    else
      say "$target: FAIL ${input#"$ROOT/"} (log: $log)"
      failed=1
    fi
  done
  if JOULE_FUZZ_STATE_DIR="$state" "$binary" -runs=0 -timeout=30 -rss_limit_mb=4096 "$ROOT/fuzz/corpus/$target" \
    >>"$log" 2>&1; then
    say "$target: ok   fuzz/corpus/$target ($(find "$ROOT/fuzz/corpus/$target" -type f | wc -l) inputs)"
  else
    say "$target: FAIL fuzz/corpus/$target (log: $log)"
    failed=1
  fi
  rm -rf "$state"
  return "$failed"
}

main() {
  local mode=fuzz seconds=60
  if [ "${1:-}" = "--regressions" ]; then
    mode=regressions
    shift
  elif [[ "${1:-}" =~ ^[0-9]+$ ]]; then
    seconds=$1
    shift
  fi
  local targets=("$@")
  [ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")
  for t in "${targets[@]}"; do
    if ! printf '%s\n' "${ALL_TARGETS[@]}" | grep -qx "$t"; then
      echo "unknown target $t (targets: ${ALL_TARGETS[*]})" >&2
      exit 2
    fi
  done

  install_dependencies
  build "${targets[@]}"

  local failed=0
  RESULTS=()
  if [ "$mode" = regressions ]; then
    for t in "${targets[@]}"; do check_regressions "$t" || failed=1; done
    exit "$failed"
  fi
  say "load before fuzzing: $(cut -d' ' -f1-3 /proc/loadavg)"
  for t in "${targets[@]}"; do fuzz_target "$t" "$seconds" || failed=1; done
  say "summary (${seconds}s per target; load now $(cut -d' ' -f1-3 /proc/loadavg)):"
  printf '  %s\n' "${RESULTS[@]}" >&2
  exit "$failed"
}

main "$@"
