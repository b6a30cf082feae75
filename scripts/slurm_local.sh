#!/usr/bin/env bash
# A one-node Slurm cluster on this machine (slurmctld + slurmd on localhost, munge auth) with 4
# fake GPUs as GRES, so that Slurm itself sets CUDA_VISIBLE_DEVICES for each job. For tests
# (tests/cluster/test_cluster.py) and .ci/run; needs root (apt-get, daemons, mknod).
#
#   scripts/slurm_local.sh            # install if missing, configure, start, wait until idle
#   scripts/slurm_local.sh --stop     # stop the daemons it started
#
# Idempotent: a running, idle cluster is left as it is. Everything lives in $HPO_SLURM_DIR
# (default /tmp/hpo-slurm): slurm.conf, gres.conf, the fake device files, state, logs.
# /etc/slurm/slurm.conf is linked to it when there is none, so plain sbatch/srun find it;
# otherwise export SLURM_CONF=$HPO_SLURM_DIR/slurm.conf.
set -euo pipefail

DIR="${HPO_SLURM_DIR:-/tmp/hpo-slurm}"
HOST="$(hostname -s)"
GPUS=4
# Declared, not detected (SlurmdParameters=config_overrides): two orchestrator jobs must fit
# on a 2-core CI machine.
CPUS="${HPO_SLURM_CPUS:-8}"
export SLURM_CONF="$DIR/slurm.conf"

stop() {
    for pidfile in "$DIR/slurmd.pid" "$DIR/slurmctld.pid"; do
        [[ -s "$pidfile" ]] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done
}
if [[ "${1:-}" == "--stop" ]]; then stop; exit 0; fi

idle() { sinfo -h -N -o '%t' 2>/dev/null | grep -qx 'idle\|mix'; }
if idle; then echo "slurm: already running ($SLURM_CONF)"; exit 0; fi

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q slurm-wlm munge >/dev/null \
        || { apt-get update -q >/dev/null && apt-get install -y -q slurm-wlm munge >/dev/null; }
fi

mkdir -p "$DIR/state" "$DIR/spool" "$DIR/dev"
# The fake GPUs: character devices with /dev/null's numbers (1:3). Slurm wants device files
# for GRES File=; with no cgroup plugin nothing is ever constrained to them.
for i in $(seq 0 $((GPUS - 1))); do
    [[ -c "$DIR/dev/gpu$i" ]] || { rm -f "$DIR/dev/gpu$i"; mknod "$DIR/dev/gpu$i" c 1 3; }
done

cat >"$DIR/slurm.conf" <<EOF
ClusterName=hpo-local
SlurmctldHost=$HOST(127.0.0.1)
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
# No cgroups in a container: track processes by parentage, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=10
GresTypes=gpu
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=4096 Gres=gpu:$GPUS State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
cat >"$DIR/gres.conf" <<EOF
AutoDetect=off
NodeName=$HOST Name=gpu File=$DIR/dev/gpu[0-$((GPUS - 1))]
EOF
if [[ ! -e /etc/slurm/slurm.conf ]]; then
    mkdir -p /etc/slurm
    ln -s "$DIR/slurm.conf" /etc/slurm/slurm.conf
    ln -sf "$DIR/gres.conf" /etc/slurm/gres.conf
fi

if [[ ! -s /etc/munge/munge.key ]]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key 2>/dev/null || true
chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
if ! munge -n >/dev/null 2>&1; then
    if id munge >/dev/null 2>&1; then runuser -u munge -- munged; else munged --force; fi
fi

stop
sleep 1
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 60); do
    if idle; then
        echo "slurm: node $HOST idle with gpu:$GPUS ($SLURM_CONF)"
        exit 0
    fi
    # a node left DOWN/DRAIN by an earlier start comes back once the config is right
    scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
    sleep 1
done
echo "slurm: the node did not become idle; see $DIR/slurmctld.log and $DIR/slurmd.log" >&2
sinfo -N -l >&2 || true
tail -n 20 "$DIR/slurmd.log" >&2 || true
exit 1
