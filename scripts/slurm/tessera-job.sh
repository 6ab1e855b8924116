#!/usr/bin/env bash
# Brings Tessera up across a SLURM allocation for the length of a command, then down
# (docs/SLURM.md). Run it in a batch script, on the allocation's first node:
#
#   tessera-job.sh [--memory SIZE] [--servers N] [--mount DIR] [--port P] [--replication R]
#                  [--provision] [--bin PATH] -- COMMAND [ARG...]
#
# The manager runs on the first node of SLURM_JOB_NODELIST, a server on each of the first N
# nodes (default: all) offering SIZE (default: half of the node's available memory), and the
# cluster is mounted at DIR (default /tmp/tessera-$SLURM_JOB_ID) on every node. COMMAND runs
# with TESSERA_MANAGER, TESSERA_SECRET, TESSERA_MOUNT and TESSERA_JOB_DIR set (its own srun
# steps inherit them); its exit status is the script's. On exit, also on scancel or the time
# limit (SIGTERM), the mounts are undone and every process stopped. Logs are kept in
# TESSERA_JOB_DIR ($TMPDIR/tessera-job-$SLURM_JOB_ID on the first node) if something failed.
# --provision: `tessera scale --add N` (and --elastic policies) start servers on the
# allocation's nodes, each on the node with the fewest (scripts/slurm/tessera-grow.sh).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
memory=""
servers=""
mount=""
port=7070
replication=1
provision=""
bin=${TESSERA_BIN:-$(command -v tessera || true)}
while [ $# -gt 0 ]; do
  case "$1" in
    --memory) memory=$2; shift 2 ;;
    --servers) servers=$2; shift 2 ;;
    --mount) mount=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --replication) replication=$2; shift 2 ;;
    --provision) provision=1; shift ;;
    --bin) bin=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "tessera-job.sh: unknown option $1 (see the script's header)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "tessera-job.sh: no command given after --" >&2; exit 2; }
[ -n "${SLURM_JOB_ID:-}" ] || { echo "tessera-job.sh: not in a SLURM job" >&2; exit 2; }
[ -x "$bin" ] || { echo "tessera-job.sh: no tessera binary (--bin or TESSERA_BIN)" >&2; exit 2; }

mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
servers=${servers:-${#nodes[@]}}
[ "$servers" -ge 1 ] && [ "$servers" -le ${#nodes[@]} ] ||
  { echo "tessera-job.sh: --servers $servers, but the job has ${#nodes[@]} nodes" >&2; exit 2; }
# The manager's address as the other nodes reach it.
ip=$(getent ahostsv4 "${nodes[0]}" | awk 'NR == 1 { print $1 }')
[ -n "$ip" ] || { echo "tessera-job.sh: cannot resolve ${nodes[0]}" >&2; exit 2; }

export TESSERA_JOB_DIR=${TMPDIR:-/tmp}/tessera-job-$SLURM_JOB_ID
export TESSERA_MANAGER=$ip:$port
TESSERA_SECRET=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
export TESSERA_SECRET
export TESSERA_MOUNT=${mount:-/tmp/tessera-$SLURM_JOB_ID}
export TESSERA_BIN=$bin TESSERA_NODE_MEMORY=$memory
mkdir -p "$TESSERA_JOB_DIR"
chmod 700 "$TESSERA_JOB_DIR"

# `step N ...`: a task on each of N nodes. Steps that run for the whole job share the nodes'
# CPUs and memory with the job's own; the job's task count (SLURM_NTASKS) is not theirs.
step() {
  local n=$1
  shift
  srun --overlap --nodes="$n" --ntasks="$n" --ntasks-per-node=1 --kill-on-bad-exit=0 "$@"
}

manager=""
server_step=""
mount_step=""
teardown() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$mount_step" ]; then
    kill -TERM "$mount_step" 2>/dev/null || true
    wait "$mount_step" 2>/dev/null || true
    # A mount whose process was killed stays behind as a dead mount: undone.
    step ${#nodes[@]} sh -c \
      'if mountpoint -q "$TESSERA_MOUNT"; then "$TESSERA_BIN" umount "$TESSERA_MOUNT"; fi; rmdir "$TESSERA_MOUNT" 2>/dev/null; true' ||
      true
  fi
  local grown
  grown=$(cat "$TESSERA_JOB_DIR/steps" 2>/dev/null || true)
  for p in $grown $server_step $manager; do kill -TERM "$p" 2>/dev/null || true; done
  for p in $server_step $manager; do wait "$p" 2>/dev/null || true; done
  for p in $grown; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  # The logs stay for a job that failed.
  [ "$rc" != 0 ] || rm -rf "$TESSERA_JOB_DIR"
  exit "$rc"
}
trap teardown EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

grow=()
[ -z "$provision" ] || grow=(--provision "$here/tessera-grow.sh")
"$bin" manager --listen "$TESSERA_MANAGER" --http "$ip:$((port + 1))" --expect "$servers" \
  --replication "$replication" "${grow[@]}" > "$TESSERA_JOB_DIR/manager.log" 2>&1 &
manager=$!
printf '%s\n' "${nodes[@]:0:$servers}" > "$TESSERA_JOB_DIR/servers"
step "$servers" --nodelist="$(IFS=,; echo "${nodes[*]:0:$servers}")" \
  "$here/tessera-grow.sh" serve > "$TESSERA_JOB_DIR/servers.log" 2>&1 &
server_step=$!

# Ready when a client sees the root directory (the table is built once every server joined).
for i in $(seq 600); do
  "$bin" ls / > /dev/null 2>&1 && break
  if [ "$i" = 600 ] || ! kill -0 "$manager" 2>/dev/null; then
    echo "tessera-job.sh: the cluster did not come up; logs in $TESSERA_JOB_DIR" >&2
    cat "$TESSERA_JOB_DIR/manager.log" "$TESSERA_JOB_DIR/servers.log" >&2
    exit 1
  fi
  sleep 0.1
done
step ${#nodes[@]} sh -c 'mkdir -p "$TESSERA_MOUNT" && exec "$TESSERA_BIN" mount "$TESSERA_MOUNT"' \
  > "$TESSERA_JOB_DIR/mounts.log" 2>&1 &
mount_step=$!
if ! step ${#nodes[@]} sh -c \
  'for i in $(seq 300); do mountpoint -q "$TESSERA_MOUNT" && exit 0; sleep 0.1; done; exit 1'; then
  echo "tessera-job.sh: $TESSERA_MOUNT was not mounted on every node; logs in $TESSERA_JOB_DIR" >&2
  cat "$TESSERA_JOB_DIR/mounts.log" >&2
  exit 1
fi

"$@"
