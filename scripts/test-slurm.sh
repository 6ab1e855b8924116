#!/usr/bin/env bash
# SLURM (issue 35): a single-node SLURM of its own (munged, slurmctld and slurmd with a
# configuration written here, on free ports) runs `sbatch --wait` of a job that brings
# Tessera up with scripts/slurm/tessera-job.sh and runs tests/slurm/workflow.sh on the mount
# (and grows the cluster with --provision); the job's output is checked. Every daemon is
# stopped whatever happens. Needs root, /dev/fuse and Debian's slurm-wlm and munge
# (scripts/deps.sh).
# Usage: scripts/test-slurm.sh     Environment: TESSERA_BIN (default target/debug/tessera).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
if [ "$(id -u)" != 0 ] || [ ! -e /dev/fuse ]; then
  echo "test-slurm.sh needs root and /dev/fuse" >&2
  exit 1
fi
bin=${TESSERA_BIN:-$root/target/debug/tessera}

. scripts/lib/scratch.sh tessera-slurm
daemons=()
stop_daemons() {
  local p
  for p in "${daemons[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${daemons[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  done
  # What a job left running (its steps' processes) goes with slurmd; a dead mount stays.
  for m in /tmp/tessera-slurm-ci-*; do
    mountpoint -q "$m" && umount -l "$m"
    rmdir "$m" 2>/dev/null || true
  done
  cleanup
}
trap stop_daemons EXIT

show_logs() {
  for f in "$work"/*.log "$work"/job.out; do
    [ -e "$f" ] && { echo "== $f"; tail -n 40 "$f"; }
  done
  cat /tmp/tessera-job-*/manager.log /tmp/tessera-job-*/servers.log 2>/dev/null | tail -n 40 || true
}

mkdir -p "$work/munge" "$work/state" "$work/spool"
chmod 700 "$work/munge"
head -c 1024 /dev/urandom > "$work/munge/munge.key"
chmod 600 "$work/munge/munge.key"
munged --force --foreground --socket="$work/munge/socket" --key-file="$work/munge/munge.key" \
  --pid-file="$work/munge/pid" --seed-file="$work/munge/seed" --log-file="$work/munged.log" &
daemons+=($!)

export SLURM_CONF=$work/slurm.conf
cat > "$SLURM_CONF" <<EOF
ClusterName=tessera-ci
SlurmctldHost=localhost
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge/socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=ci Nodes=localhost Default=YES MaxTime=10 State=UP
EOF
for _ in $(seq 100); do [ -S "$work/munge/socket" ] && break; sleep 0.1; done
slurmctld -D -i -f "$SLURM_CONF" > "$work/slurmctld.out" 2>&1 &
daemons+=($!)
slurmd -D -N localhost -f "$SLURM_CONF" > "$work/slurmd.out" 2>&1 &
daemons+=($!)
up=""
for _ in $(seq 300); do
  if sinfo -h -o %T 2>/dev/null | grep -qx idle; then up=1; break; fi
  sleep 0.1
done
[ -n "$up" ] || { echo "SLURM did not come up in 30 s" >&2; show_logs; exit 1; }

cat > "$work/job.sh" <<EOF
#!/bin/bash
#SBATCH --nodes=1 --ntasks=2 --time=5 --output=$work/job.out
exec $root/scripts/slurm/tessera-job.sh --bin $bin --memory 256MiB --port $(free_port) \
  --mount /tmp/tessera-slurm-ci-\$SLURM_JOB_ID --provision -- $root/tests/slurm/workflow.sh
EOF
echo "== sbatch --wait: Tessera up for the job, a workflow on its mount"
if ! limit 300 sbatch --wait --quiet "$work/job.sh"; then
  echo "the job failed" >&2
  show_logs
  exit 1
fi
cat "$work/job.out"
grep -q "workflow: 2 tasks read the inputs back intact" "$work/job.out"
grep -q "workflow: grown to 2 servers, inputs intact" "$work/job.out"
if compgen -G "/tmp/tessera-slurm-ci-*" > /dev/null; then
  echo "the job left its mount point behind" >&2
  exit 1
fi
echo "slurm test passed"
