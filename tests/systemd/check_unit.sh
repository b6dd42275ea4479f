#!/usr/bin/env bash
# Checks a systemd unit file without needing systemd as PID 1 or an installed
# jouled:
#   (a) `systemd-analyze verify` must print nothing at all (it exits 0 even on
#       unknown keys and bad values, so any output counts as a failure);
#   (b) `systemd-analyze security --offline=yes` must score <= MAX_EXPOSURE.
#
# Usage: check_unit.sh [--drop-in FILE]... [--max SCORE] UNIT [JOULED_BINARY]
#   JOULED_BINARY (e.g. the freshly built daemon) replaces ExecStart='s program
#   in a temporary copy, because verify fails when that program does not exist
#   on this machine. Without it the installed program is used if present,
#   else `true`. Only program paths are swapped: every directive is still
#   parsed, which a self-test below proves on each run.
#   --drop-in FILE (repeatable) puts FILE in UNIT.d/ beside the copy, as
#   /etc/systemd/system/UNIT.d/ would, so both checks see the unit with it.
#   --max SCORE is the highest exposure accepted (default MAX_EXPOSURE).
set -euo pipefail

# 2.4: running each job under an account of its own (so that jobs cannot reach
# jouled's state) costs CAP_SETUID/SETGID/CHOWN/KILL and ProtectProc=invisible,
# 0.8 of systemd's score, and a writable delegated cgroup for jobs
# (ProtectControlGroups=no) 0.2; everything else stays as hardened as at 1.4.
MAX_EXPOSURE=${MAX_EXPOSURE:-2.4}

fail() { echo "FAIL: $*" >&2; exit 1; }

drop_ins=()
while [[ $# -gt 0 && $1 == --* ]]; do
    case $1 in
        --drop-in) [[ $# -ge 2 && -f $2 ]] || fail "--drop-in needs an existing file"; drop_ins+=("$2"); shift 2 ;;
        --max) [[ $# -ge 2 ]] || fail "--max needs a score"; MAX_EXPOSURE=$2; shift 2 ;;
        *) fail "unknown option $1" ;;
    esac
done
[[ $# -ge 1 && $# -le 2 ]] || fail "usage: $0 [--drop-in FILE]... [--max SCORE] UNIT [JOULED_BINARY]"
unit=$1
[[ -f $unit ]] || fail "no such unit file: $unit"
command -v systemd-analyze >/dev/null || fail "systemd-analyze not found"

# Deterministic output: no colours, no pager, default log level, ASCII.
export SYSTEMD_LOG_LEVEL=info SYSTEMD_LOG_COLOR=0 SYSTEMD_PAGER=cat LC_ALL=C

true_bin=$(type -P true)
if [[ $# -eq 2 ]]; then
    [[ -x $2 ]] || fail "not an executable: $2"
    start_bin=$(realpath "$2")
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Same file name: verify derives the unit name from it.
copy=$tmp/$(basename "$unit")

# Rewrite Exec*= program paths that do not exist here (keeping any of the
# -@:+! prefixes). ExecStart takes JOULED_BINARY when given.
while IFS= read -r line || [[ -n $line ]]; do
    if [[ $line =~ ^(Exec[A-Za-z]+=)([-@:+!]*)(/[^[:space:]]+)(.*)$ ]]; then
        key=${BASH_REMATCH[1]} prefix=${BASH_REMATCH[2]}
        prog=${BASH_REMATCH[3]} rest=${BASH_REMATCH[4]}
        new=$prog
        if [[ $key == ExecStart= && -n ${start_bin:-} ]]; then
            new=$start_bin
        elif [[ ! -x $prog ]]; then
            new=$true_bin
            echo "note: $prog is not installed here; verifying with $new in its place" >&2
        fi
        line="$key$prefix$new$rest"
    fi
    printf '%s\n' "$line"
done <"$unit" >"$copy"
# Drop-ins beside the copy: systemd-analyze reads UNIT.d/*.conf from the unit's directory.
if [[ ${#drop_ins[@]} -gt 0 ]]; then
    mkdir "$copy.d"
    for drop_in in "${drop_ins[@]}"; do cp "$drop_in" "$copy.d/"; done
fi

verify() { systemd-analyze verify --man=no "$1" 2>&1 || true; }

# Self-test: verify must still report an unknown key in this setup, or an
# empty output below would prove nothing.
mkdir "$tmp/selftest"
sed '/^\[Service\]/a ProtectSystm=strict' "$copy" >"$tmp/selftest/$(basename "$unit")"
[[ -n $(verify "$tmp/selftest/$(basename "$unit")") ]] ||
    fail "self-test: systemd-analyze verify did not report an unknown key"

# (a) verify: any output is a failure; show it against the original file name.
out=$(verify "$copy")
if [[ -n $out ]]; then
    printf '%s\n' "${out//"$copy"/$unit}" >&2
    fail "systemd-analyze verify reported problems in $unit ${drop_ins[*]}"
fi
echo "ok: systemd-analyze verify is clean${drop_ins[*]:+ with ${drop_ins[*]}}"

# (b) security: parse "Overall exposure level for NAME: 1.4 OK". On the copy, which carries
# the drop-ins; its swapped program paths do not enter the score.
report=$(systemd-analyze security --no-pager --offline=yes "$copy" 2>&1) ||
    { printf '%s\n' "$report" >&2; fail "systemd-analyze security failed"; }
score=$(sed -nE 's/.*Overall exposure level for [^:]*: ([0-9]+\.[0-9]+).*/\1/p' <<<"$report")
[[ -n $score ]] || { printf '%s\n' "$report" >&2; fail "no overall exposure level in the output"; }
if awk -v s="$score" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(s > m) }'; then
    printf '%s\n' "$report" >&2
    fail "exposure level $score is above $MAX_EXPOSURE"
fi
echo "ok: exposure level $score (limit $MAX_EXPOSURE)"
