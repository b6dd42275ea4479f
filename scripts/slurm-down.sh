#!/usr/bin/env bash
# Stops the private Slurm that scripts/slurm-up.sh started in RUN_DIR, by the pids it stored:
# cancels its jobs, stops slurmd, slurmctld and munged (SIGTERM, SIGKILL after 10 s), kills
# job processes that outlived slurmd, removes empty cgroup directories Slurm may leave, and
# releases the host lock. Logs and state stay in RUN_DIR. Safe to run twice.
#
# Usage: scripts/slurm-down.sh RUN_DIR
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=slurm-common.sh
. "$here/slurm-common.sh"

[ $# -eq 1 ] || { echo "usage: $0 RUN_DIR" >&2; exit 2; }
[ -d "$1" ] || { slurm_log "no such directory: $1"; exit 0; }
run_dir=$(cd "$1" && pwd)
conf="$run_dir/slurm.conf"

# Jobs first, while slurmctld can still tell slurmd to end them.
if pid_alive "$run_dir/slurmctld.pid" && pid_alive "$run_dir/slurmd.pid"; then
  ids=$(SLURM_CONF="$conf" timeout 15 squeue -h -o %A 2>/dev/null | tr '\n' ' ')
  if [ -n "${ids// /}" ]; then
    # shellcheck disable=SC2086
    SLURM_CONF="$conf" timeout 15 scancel $ids 2>/dev/null
    for ((i = 0; i < 100; i++)); do
      [ -z "$(SLURM_CONF="$conf" timeout 15 squeue -h -o %A -t PD,R,S,CG,CF 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
fi

for daemon in slurmd slurmctld; do
  stop_pid "$run_dir/$daemon.pid" TERM 10 || stop_pid "$run_dir/$daemon.pid" KILL 5 ||
    slurm_log "$daemon ($(cat "$run_dir/$daemon.pid")) does not stop"
done

# slurmstepd and job processes carry slurmd's SLURM_CONF (slurm-up.sh sets it); a job
# process also has SLURM_JOB_ID, which tells it from this script's own callers.
leftovers() {
  local environ pid
  for environ in $(grep -lzxF "SLURM_CONF=$conf" /proc/[0-9]*/environ 2>/dev/null); do
    pid=${environ#/proc/}
    pid=${pid%/environ}
    [ "$pid" = $$ ] && continue
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmstepd ] ||
      grep -qz '^SLURM_JOB_ID=' "$environ" 2>/dev/null; then
      echo "$pid"
    fi
  done
}
for signal in TERM KILL; do
  pids=$(leftovers)
  [ -z "$pids" ] && break
  slurm_log "SIG$signal to job processes left behind: $(echo $pids)"
  # shellcheck disable=SC2086
  kill -"$signal" $pids 2>/dev/null
  sleep 1
done

stop_pid "$run_dir/munged.pid" TERM 10 || stop_pid "$run_dir/munged.pid" KILL 5
stop_pid "$run_dir/lock.pid" KILL 5

# Empty per-node cgroup directories (with proctrack/cgroup or task/cgroup), deepest first.
for top in /sys/fs/cgroup/*/slurm_localhost /sys/fs/cgroup/slurm_localhost; do
  [ -d "$top" ] && find "$top" -depth -type d -exec rmdir {} + 2>/dev/null
done

rm -f "$run_dir"/{munged,slurmctld,slurmd,lock}.pid "$run_dir"/*.pidfile "$run_dir/munge/munge.socket"*
exit 0
