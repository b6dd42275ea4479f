#!/usr/bin/env bash
# Starts a private single-host Slurm for tests: munged, slurmctld and slurmd on this machine.
#
# Usage: scripts/slurm-up.sh RUN_DIR
#   Writes RUN_DIR/slurm.conf (partition "joule", node "localhost", settings tested with
#   Slurm 22.05), starts munged (as munge, private socket RUN_DIR/munge/munge.socket),
#   slurmctld -D and slurmd -D -N localhost in the background, stores their pids in
#   RUN_DIR/{munged,slurmctld,slurmd}.pid, waits until the node is idle and exits 0.
#   Clients then use: export SLURM_CONF=RUN_DIR/slurm.conf
#   Stop it with scripts/slurm-down.sh RUN_DIR; kill -9 and restart slurmctld with
#   scripts/slurm-restart-ctld.sh RUN_DIR.
#
# Exit 77 (the tests' "skip") with a message when Slurm cannot run here: not root, binaries or
# the munge key missing, ports 6817/6818 taken by a Slurm that is not ours. Exit 1 when a
# daemon fails to start (its log is printed).
#
# Slurm's ports are fixed (slurmctld 6817, slurmd 6818, on 0.0.0.0), so one such Slurm runs per
# host: the lock $JOULE_SLURM_LOCK (/run/lock/joule-slurm.lock) is held from here until
# slurm-down.sh; a second slurm-up.sh waits up to JOULE_SLURM_LOCK_WAIT seconds (default 600)
# for it, so parallel ctest runs from two build trees take turns.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=slurm-common.sh
. "$here/slurm-common.sh"

[ $# -eq 1 ] || { echo "usage: $0 RUN_DIR" >&2; exit 2; }
skip() { slurm_log "cannot run Slurm here: $*"; exit 77; }

[ "$(id -u)" -eq 0 ] || skip "needs root (slurmd starts jobs as their owner, munged runs as munge)"
for tool in munged munge slurmctld slurmd sbatch squeue scontrol scancel sinfo setpriv setsid flock; do
  command -v "$tool" >/dev/null || skip "$tool not found (scripts/install-deps.sh installs slurm-wlm, slurm-client and munge)"
done
id munge >/dev/null 2>&1 || skip "no munge user (package munge)"
[ -s /etc/munge/munge.key ] || skip "no /etc/munge/munge.key (package munge creates it)"

mkdir -p "$1"
run_dir=$(cd "$1" && pwd)
conf="$run_dir/slurm.conf"
if pid_alive "$run_dir/slurmctld.pid" || pid_alive "$run_dir/slurmd.pid"; then
  slurm_log "a Slurm from $run_dir is already running (scripts/slurm-down.sh $run_dir)"
  exit 1
fi

# The host lock: taken here, then handed to a holder process that lives until slurm-down.sh.
mkdir -p "$(dirname "$JOULE_SLURM_LOCK")"
exec 9>>"$JOULE_SLURM_LOCK"
if ! flock -n 9; then
  # A holder whose Slurm is gone (slurm-down.sh was interrupted) only needs to go too; one
  # younger than 90 s may belong to a slurm-up.sh still starting its daemons (60 s at most).
  owner=$(head -n 1 "$JOULE_SLURM_LOCK" 2>/dev/null || true)
  holder_age=0
  [ -n "$owner" ] && [ -s "$owner/lock.pid" ] &&
    holder_age=$(ps -o etimes= -p "$(cat "$owner/lock.pid")" 2>/dev/null | tr -d ' ')
  if [ "${holder_age:-0}" -gt 90 ] && ! pid_alive "$owner/slurmctld.pid" && ! pid_alive "$owner/slurmd.pid" &&
    ! pid_alive "$owner/munged.pid"; then
    slurm_log "removing the lock holder of $owner: its Slurm is gone"
    stop_pid "$owner/lock.pid" KILL 5 || true
  fi
fi
if ! flock -n 9; then
  slurm_log "waiting for the Slurm from $(head -n 1 "$JOULE_SLURM_LOCK" 2>/dev/null || echo '?') to stop (lock $JOULE_SLURM_LOCK)"
  flock -w "${JOULE_SLURM_LOCK_WAIT:-600}" 9 ||
    skip "another Slurm started by slurm-up.sh still runs from $(head -n 1 "$JOULE_SLURM_LOCK" 2>/dev/null) (scripts/slurm-down.sh DIR stops it)"
fi
echo "$run_dir" >"$JOULE_SLURM_LOCK"
setsid sleep infinity </dev/null >/dev/null 2>&1 &
echo $! >"$run_dir/lock.pid"
disown $!
exec 9>&-  # the holder keeps the lock (flock locks belong to the shared open file)

fail() {
  slurm_log "$*"
  "$here/slurm-down.sh" "$run_dir" >/dev/null 2>&1 || true
  exit 1
}

# Something else on Slurm's ports (a system slurmctld, a Slurm left behind by a killed run).
listening=$(awk 'NR > 1 && $4 == "0A" { split($2, a, ":"); print a[2] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null)
if grep -qxE "1AA1|1AA2" <<<"$listening"; then
  "$here/slurm-down.sh" "$run_dir" >/dev/null 2>&1 || true
  skip "ports 6817/6818 are in use by another Slurm (ss -ltnp 'sport = :6817')"
fi

mkdir -p "$run_dir/state" "$run_dir/spool" "$run_dir/munge"
chmod 0755 "$run_dir"  # munged (as munge) must reach its socket directory
chown munge:munge "$run_dir/munge"
chmod 0755 "$run_dir/munge"

# NodeName=localhost with this host's CPU layout; RealMemory a little under what slurmd sees.
read -r cpus boards sockets cores threads memory < <(
  slurmd -C | awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
    END { print v["CPUs"], v["Boards"], v["SocketsPerBoard"], v["CoresPerSocket"], v["ThreadsPerCore"], v["RealMemory"] }')
memory=$((memory > 512 ? memory - 256 : memory))

cat >"$conf" <<EOF
# Written by scripts/slurm-up.sh: a private single-host Slurm for tests.
ClusterName=joule
SlurmctldHost=localhost
SlurmUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$run_dir/munge/munge.socket
StateSaveLocation=$run_dir/state
SlurmdSpoolDir=$run_dir/spool
SlurmctldPidFile=$run_dir/slurmctld.pidfile
SlurmdPidFile=$run_dir/slurmd.pidfile
SlurmctldLogFile=$run_dir/slurmctld.log
SlurmdLogFile=$run_dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$run_dir/jobcomp.txt
MpiDefault=none
MailProg=/bin/true
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
# Finished jobs stay in slurmctld's memory (squeue/scontrol) this long: no slurmdbd here.
MinJobAge=300
ReturnToService=2
SlurmdTimeout=300
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus Boards=$boards SocketsPerBoard=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=$memory State=UNKNOWN
PartitionName=joule Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF

# munged as munge (as root it refuses: "PRNG seed dir is insecure"), on a private socket so a
# system munged, if any, is left alone.
setsid setpriv --reuid=munge --regid=munge --init-groups -- munged --foreground \
  --socket="$run_dir/munge/munge.socket" --pid-file="$run_dir/munge/munged.pidfile" \
  --seed-file="$run_dir/munge/munged.seed" --log-file="$run_dir/munge/munged.log" \
  </dev/null >>"$run_dir/munged.out" 2>&1 &
echo $! >"$run_dir/munged.pid"
disown $!
for ((i = 0; i < 100; i++)); do
  munge -n -S "$run_dir/munge/munge.socket" 2>/dev/null | unmunge -S "$run_dir/munge/munge.socket" >/dev/null 2>&1 && break
  if ! pid_alive "$run_dir/munged.pid"; then
    cat "$run_dir/munged.out" >&2 || true
    "$here/slurm-down.sh" "$run_dir" >/dev/null 2>&1 || true
    skip "munged does not start as munge (output above)"
  fi
  sleep 0.1
done
((i < 100)) || fail "munged not answering on $run_dir/munge/munge.socket"

start_slurmctld "$run_dir"
# slurmd gets SLURM_CONF in its environment: its slurmstepds and the jobs inherit it, which is
# how slurm-down.sh finds job processes that outlive slurmd.
SLURM_CONF="$conf" setsid slurmd -D -N localhost -f "$conf" \
  </dev/null >>"$run_dir/slurmd.out" 2>&1 &
echo $! >"$run_dir/slurmd.pid"
disown $!

wait_slurm_ready "$run_dir" 60 || fail "Slurm did not come up"
slurm_log "Slurm up: SLURM_CONF=$conf (partition joule, node localhost, ports 6817/6818)"
