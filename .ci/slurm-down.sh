#!/usr/bin/env bash
# Stop the daemons that .ci/slurm-up.sh started, by the process ids it recorded (never by name).
# Daemons it did not start (a cluster that was already running) are left alone. Idempotent.
set -uo pipefail
STATE=${SLURM_UP_STATE:-/run/reprozoo-slurm}
say() { echo "[slurm-down] $*" >&2; }

[[ -d $STATE ]] || { say "nothing to stop (no $STATE)"; exit 0; }

# slurmd first, then the controller, then munge (which the other two need while stopping)
for name in slurmd slurmctld munged; do
    f=$STATE/$name.pid
    [[ -f $f ]] || continue
    pid=$(tr -dc '0-9' < "$f")
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
        # the pid must still belong to that daemon (pids are reused)
        comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
        if [[ $comm == "$name" ]]; then
            kill -TERM "$pid"
            for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; say "$name (pid $pid) killed"
            else say "$name (pid $pid) stopped"; fi
        else
            say "pid $pid is '$comm' now, not $name: left alone"
        fi
    fi
    rm -f "$f"
done
rmdir "$STATE" 2>/dev/null || true
exit 0
