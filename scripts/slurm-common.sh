# Shared by slurm-up.sh, slurm-down.sh and slurm-restart-ctld.sh (sourced, not run).
# A private single-host Slurm lives in one RUN_DIR: slurm.conf, state/, spool/, logs, and the
# pids of the processes the scripts started (munged.pid, slurmctld.pid, slurmd.pid, lock.pid).
# Its clients find it through SLURM_CONF=RUN_DIR/slurm.conf.

export PATH="$PATH:/usr/sbin:/sbin"

# Slurm's ports are fixed (6817 slurmctld, 6818 slurmd; they bind 0.0.0.0), so only one such
# Slurm can run on a host. slurm-up.sh holds this lock for as long as its Slurm lives.
JOULE_SLURM_LOCK=${JOULE_SLURM_LOCK:-/run/lock/joule-slurm.lock}

slurm_log() { echo "${0##*/}: $*" >&2; }

# Whether PID runs. A zombie does not: the daemons are orphans once slurm-up.sh exits, and
# their exit is only collected when init gets round to it (seconds, on some machines).
running() {
  local state
  state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# Whether the process with the pid stored in FILE is alive.
pid_alive() {
  local file=$1
  [ -s "$file" ] || return 1
  running "$(cat "$file")"
}

# Sends SIGNAL to the pid in FILE and waits up to SECONDS for it to end. Returns 1 if it lives on.
stop_pid() {
  local file=$1 signal=$2 seconds=$3 pid i
  [ -s "$file" ] || return 0
  pid=$(cat "$file")
  kill -"$signal" "$pid" 2>/dev/null || return 0
  for ((i = 0; i < seconds * 20; i++)); do
    running "$pid" || return 0
    sleep 0.05
  done
  return 1
}

# slurmctld in the foreground (-D), in the background of this script, in its own session so
# that a terminal's ^C or the caller's process group does not reach it. Keeps StateSaveLocation
# (no -c): a restart recovers the jobs that were saved.
start_slurmctld() {
  local run_dir=$1
  SLURM_CONF="$run_dir/slurm.conf" setsid slurmctld -D -f "$run_dir/slurm.conf" \
    </dev/null >>"$run_dir/slurmctld.out" 2>&1 9>&- &
  echo $! >"$run_dir/slurmctld.pid"
  disown $!  # slurm-down.sh stops it by pid; no "Killed" notice from this shell
}

# Waits until slurmctld answers and the node is usable (idle, mixed or allocated).
wait_slurm_ready() {
  local run_dir=$1 seconds=$2 i state
  for ((i = 0; i < seconds * 5; i++)); do
    if ! pid_alive "$run_dir/slurmctld.pid"; then
      slurm_log "slurmctld exited; last lines of $run_dir/slurmctld.log:"
      tail -n 20 "$run_dir/slurmctld.log" "$run_dir/slurmctld.out" >&2 2>/dev/null || true
      return 1
    fi
    if SLURM_CONF="$run_dir/slurm.conf" scontrol ping 2>/dev/null | grep -q "is UP"; then
      state=$(SLURM_CONF="$run_dir/slurm.conf" sinfo -h -n localhost -o %T 2>/dev/null || true)
      case "$state" in
        idle | mixed | allocated | completing) return 0 ;;
      esac
    fi
    sleep 0.2
  done
  slurm_log "Slurm not ready after ${seconds}s (node state: '${state:-?}'); see $run_dir/*.log"
  tail -n 20 "$run_dir/slurmctld.log" "$run_dir/slurmd.log" >&2 2>/dev/null || true
  return 1
}
