#!/usr/bin/env bash
# A real Slurm cluster on this one Debian host, for tests and CI (root only).
#
#   ci-cluster.sh up BASE     install (once) and start munged, slurmctld and NODES slurmd; wait until idle
#   ci-cluster.sh down BASE   stop every daemon that `up` started, by the PIDs it recorded
#
# Knobs: NODES (3), CPUS (CPUs declared per node, 4), CTLD_PORT (16817), SLURMD_PORT (first of NODES
# consecutive ports, 16821). BASE must be a fresh folder: a reused state folder brings old jobs back.
# After `up`, clients need SLURM_CONF=BASE/slurm/etc/slurm.conf (also written to BASE/env).
# Recipe and its pitfalls: docs/slurm.md.
set -euo pipefail

cmd=${1:?usage: ci-cluster.sh up|down BASE}
BASE=${2:?usage: ci-cluster.sh up|down BASE}
NODES=${NODES:-3}
CPUS=${CPUS:-4}
CTLD_PORT=${CTLD_PORT:-16817}
SLURMD_PORT=${SLURMD_PORT:-16821}

fail() { echo "ci-cluster: $*" >&2; exit 1; }

install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
        && command -v munged >/dev/null && command -v mungekey >/dev/null; then
        return 0
    fi
    [ "$(id -u)" = 0 ] || fail "Slurm is not installed and installing it needs root (uid is $(id -u))"
    command -v apt-get >/dev/null || fail "Slurm is not installed and there is no apt-get to install it"
    apt-get update -qq >"$BASE/apt.log" 2>&1 || fail "apt-get update failed: $(tail -3 "$BASE/apt.log")"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        munge slurmctld slurmd slurm-client >>"$BASE/apt.log" 2>&1 \
        || fail "apt-get install munge slurmctld slurmd slurm-client failed: $(tail -3 "$BASE/apt.log")"
}

write_conf() {
    local last=$((SLURMD_PORT + NODES - 1))
    cat >"$BASE/slurm/etc/slurm.conf" <<CONF
ClusterName=prismtest
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$BASE/munge/run/munge.sock
StateSaveLocation=$BASE/slurm/state
SlurmdSpoolDir=$BASE/slurm/spool/%n
SlurmctldPidFile=$BASE/slurm/run/slurmctld.pid
SlurmdPidFile=$BASE/slurm/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/slurm/log/slurmctld.log
SlurmdLogFile=$BASE/slurm/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
InactiveLimit=0
MinJobAge=4
MailProg=/bin/true
NodeName=n[1-$NODES] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$SLURMD_PORT-$last] CPUs=$CPUS RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=n[1-$NODES] Default=YES MaxTime=INFINITE State=UP
CONF
}

up() {
    [ "$(id -u)" = 0 ] || fail "the test cluster runs its daemons as root (uid is $(id -u))"
    mkdir -p "$BASE"
    install
    mkdir -p "$BASE"/munge/{etc,run,lib,log} "$BASE"/slurm/{etc,state,spool,log,run}
    # munged refuses a socket whose folders are not o+x; its key folder stays private.
    chmod 755 "$BASE" "$BASE/munge" "$BASE/munge/run"
    chmod 700 "$BASE"/munge/{etc,lib,log}
    [ -f "$BASE/munge/etc/munge.key" ] || mungekey --create --keyfile="$BASE/munge/etc/munge.key" --bits=1024
    write_conf
    export SLURM_CONF=$BASE/slurm/etc/slurm.conf
    echo "export SLURM_CONF=$SLURM_CONF" >"$BASE/env"
    munged --key-file="$BASE/munge/etc/munge.key" --socket="$BASE/munge/run/munge.sock" \
        --pid-file="$BASE/munge/run/munged.pid" --log-file="$BASE/munge/log/munged.log" \
        --seed-file="$BASE/munge/lib/munged.seed" || fail "munged did not start: $(tail -3 "$BASE/munge/log/munged.log")"
    slurmctld -D >"$BASE/slurm/log/slurmctld.out" 2>&1 &
    echo $! >"$BASE/slurm/run/ctld.bgpid"
    for i in $(seq 1 "$NODES"); do
        mkdir -p "$BASE/slurm/spool/n$i"
        slurmd -D -N "n$i" >"$BASE/slurm/log/slurmd-n$i.out" 2>&1 &
        echo $! >"$BASE/slurm/run/slurmd-n$i.bgpid"
    done
    # `sinfo -t idle` would also count nodes that do not respond (idle*).
    for _ in $(seq 1 300); do
        [ "$(sinfo -h -N -o %t 2>/dev/null | grep -cx idle)" = "$NODES" ] && { echo "ci-cluster: $NODES nodes idle"; return 0; }
        sleep 0.1
    done
    fail "the nodes did not become idle in 30 s: $(sinfo -N 2>&1 | tr '\n' ' '); slurmctld: $(tail -3 "$BASE/slurm/log/slurmctld.out" | tr '\n' ' ')"
}

down() {
    local pids=() p
    for f in "$BASE"/slurm/run/*.bgpid; do [ -f "$f" ] && pids+=("$(cat "$f")"); done
    [ ${#pids[@]} -gt 0 ] && kill -TERM "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 1 50); do
        local alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    rm -f "$BASE"/slurm/run/*.bgpid
    if [ -f "$BASE/munge/run/munged.pid" ]; then
        kill -TERM "$(cat "$BASE/munge/run/munged.pid")" 2>/dev/null || true
    fi
}

case $cmd in
    up) up ;;
    down) down ;;
    *) fail "unknown command $cmd (up or down)" ;;
esac
