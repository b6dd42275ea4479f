#!/usr/bin/env bash
# Crashes and restarts the slurmctld of a private Slurm from scripts/slurm-up.sh, as a
# controller crash would: SIGKILL (no state save on the way out), then a new slurmctld with the
# same slurm.conf and StateSaveLocation (no -c), waiting until it answers and the node is usable.
# Jobs acknowledged in the last ~5 s before the kill may be gone, and their ids handed out
# again (docs/design.md, Slurm, "Exactly once").
#
# Usage: scripts/slurm-restart-ctld.sh RUN_DIR [restart|kill|start]   (default: restart)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=slurm-common.sh
. "$here/slurm-common.sh"

[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 RUN_DIR [restart|kill|start]" >&2; exit 2; }
run_dir=$(cd "$1" && pwd)
action=${2:-restart}
[ -f "$run_dir/slurm.conf" ] || { slurm_log "no $run_dir/slurm.conf (run slurm-up.sh first)"; exit 1; }

case "$action" in
  kill | restart)
    pid_alive "$run_dir/slurmctld.pid" || { slurm_log "slurmctld is not running"; exit 1; }
    stop_pid "$run_dir/slurmctld.pid" KILL 10 || { slurm_log "slurmctld survives SIGKILL"; exit 1; }
    ;;& # restart goes on to start
  start | restart)
    pid_alive "$run_dir/slurmctld.pid" && { slurm_log "slurmctld is already running"; exit 1; }
    start_slurmctld "$run_dir"
    wait_slurm_ready "$run_dir" 60
    ;;
  kill) ;;
  *) echo "usage: $0 RUN_DIR [restart|kill|start]" >&2; exit 2 ;;
esac
