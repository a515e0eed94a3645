#!/usr/bin/env bash
# Bring up a single-node SLURM cluster on this machine (Debian's slurm-wlm 22.05 + munge), without
# systemd: munged, slurmctld and slurmd are started directly, SlurmUser=root, accounting off.
#
#   .ci/slurm-up.sh          # idempotent: exits 0 at once when `sinfo` already shows a usable node
#   .ci/slurm-down.sh        # stops the daemons this script started, by their process ids
#
# Exit status: 0 the cluster answers; 77 it cannot be started here (the reason is printed on stderr:
# not root, no apt-get, packages not installable, a foreign slurm.conf we will not overwrite);
# anything else: it was started but did not come up in time (logs under /var/log/slurm).
# Bounded in time: SLURM_UP_TIMEOUT seconds in all (default 240), apt included.
# The pids of the daemons it started are written to $SLURM_UP_STATE (default /run/reprozoo-slurm).
set -uo pipefail

TIMEOUT=${SLURM_UP_TIMEOUT:-240}
STATE=${SLURM_UP_STATE:-/run/reprozoo-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# reprozoo single-node cluster (.ci/slurm-up.sh)"
DEADLINE=$(( $(date +%s) + TIMEOUT ))

say()  { echo "[slurm-up] $*" >&2; }
skip() { say "SKIP: $*"; exit 77; }
left() { local l=$(( DEADLINE - $(date +%s) )); (( l > 0 )) && echo "$l" || echo 1; }

node_ok() {  # a node in a state that can run jobs
    timeout 5 sinfo -h -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated|completing)'
}

if command -v sinfo >/dev/null 2>&1 && node_ok; then
    say "cluster already up: $(timeout 5 sinfo -h -o '%P %D %T %c cpus %m MB' | head -1)"
    exit 0
fi

[[ $(id -u) -eq 0 ]] || skip "not root (uid $(id -u)): cannot install slurm-wlm/munge or start slurmctld/slurmd"

# --- packages ------------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
        || ! command -v sinfo >/dev/null; then
    command -v apt-get >/dev/null || skip "slurm-wlm/munge are not installed and there is no apt-get"
    export DEBIAN_FRONTEND=noninteractive
    say "installing slurm-wlm and munge with apt-get"
    if ! timeout "$(left)" apt-get install -y -q --no-install-recommends slurm-wlm munge >/tmp/slurm-up-apt.log 2>&1; then
        timeout "$(left)" apt-get update -q >>/tmp/slurm-up-apt.log 2>&1 || true
        timeout "$(left)" apt-get install -y -q --no-install-recommends slurm-wlm munge >>/tmp/slurm-up-apt.log 2>&1 \
            || skip "apt-get could not install slurm-wlm/munge (see /tmp/slurm-up-apt.log: $(tail -1 /tmp/slurm-up-apt.log))"
    fi
fi

mkdir -p "$STATE"

pid_alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }
pid_of() { [[ -f $1 ]] && tr -dc '0-9' < "$1"; }

# --- munge ---------------------------------------------------------------------------------
MUNGE_PID=$(pid_of /run/munge/munged.pid || true)
if ! pid_alive "$MUNGE_PID"; then
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        if command -v mungekey >/dev/null; then mungekey --create --force --keyfile /etc/munge/munge.key
        else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
    fi
    chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
    rm -f /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged --force || { say "munged did not start"; exit 1; }
    for _ in $(seq 50); do [[ -S /run/munge/munge.socket.2 ]] && break; sleep 0.1; done
    MUNGE_PID=$(pid_of /run/munge/munged.pid || true)
    echo "$MUNGE_PID" > "$STATE/munged.pid"
    say "munged started (pid $MUNGE_PID)"
fi
munge -n 2>/dev/null | unmunge >/dev/null 2>&1 || { say "munge does not answer"; exit 1; }

# --- slurm.conf ----------------------------------------------------------------------------
if [[ -f $CONF ]] && ! grep -qF "$MARK" "$CONF"; then
    skip "$CONF exists and was not written by this script; not overwriting a cluster's configuration"
fi
HOST=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
install -d -m 0755 /etc/slurm /var/log/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd
cat > "$CONF" <<EOF
$MARK
ClusterName=reprozoo
SlurmctldHost=$HOST
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
# squeue is the status command here (no accounting); finished jobs stay visible this long
MinJobAge=300
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=main Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF

# --- daemons -------------------------------------------------------------------------------
CTLD_PID=$(pid_of /run/slurmctld.pid || true)
if ! pid_alive "$CTLD_PID"; then
    rm -f /run/slurmctld.pid
    /usr/sbin/slurmctld || { say "slurmctld did not start (see /var/log/slurm/slurmctld.log)"; exit 1; }
    for _ in $(seq 100); do CTLD_PID=$(pid_of /run/slurmctld.pid || true); pid_alive "$CTLD_PID" && break; sleep 0.1; done
    echo "$CTLD_PID" > "$STATE/slurmctld.pid"
    say "slurmctld started (pid $CTLD_PID)"
else
    timeout 10 scontrol reconfigure >/dev/null 2>&1 || true
fi
SLURMD_PID=$(pid_of /run/slurmd.pid || true)
if ! pid_alive "$SLURMD_PID"; then
    rm -f /run/slurmd.pid
    /usr/sbin/slurmd || { say "slurmd did not start (see /var/log/slurm/slurmd.log)"; exit 1; }
    for _ in $(seq 100); do SLURMD_PID=$(pid_of /run/slurmd.pid || true); pid_alive "$SLURMD_PID" && break; sleep 0.1; done
    echo "$SLURMD_PID" > "$STATE/slurmd.pid"
    say "slurmd started (pid $SLURMD_PID)"
fi

# --- wait for the node ---------------------------------------------------------------------
resumed=0
while (( $(date +%s) < DEADLINE )); do
    if node_ok; then
        say "cluster up: $(timeout 5 sinfo -h -o '%P %D %T %c cpus %m MB' | head -1)"
        exit 0
    fi
    state=$(timeout 5 sinfo -h -o '%T' 2>/dev/null | head -1)
    if [[ $state =~ ^(down|drain|drained|unknown) ]] && (( ! resumed )); then
        timeout 5 scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 && resumed=1
    fi
    sleep 0.5
done
say "the node did not become idle within ${TIMEOUT}s (sinfo: $(timeout 5 sinfo -h 2>&1 | head -2));" \
    "see /var/log/slurm/slurmctld.log and slurmd.log"
exit 1
