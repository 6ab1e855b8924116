#!/usr/bin/env bash
# Servers within a SLURM allocation, for tessera-job.sh and as the manager's provisioner
# (`tessera manager --provision scripts/slurm/tessera-grow.sh`, docs/SLURM.md):
#   serve   runs a server on this node (offering TESSERA_NODE_MEMORY, default half of the
#           node's available memory) until it is retired or stopped;
#   add     starts one more server, on the allocation's node that has the fewest (an srun
#           step that shares the node with the job's others);
#   remove  forgets the retired server at TESSERA_NODE_ADDR (it exited by itself, and its
#           step with it).
# Keeps which node has how many servers in $TESSERA_JOB_DIR/servers, a node name per server,
# and the steps it started in $TESSERA_JOB_DIR/steps (tessera-job.sh stops them at the end).
set -euo pipefail
state=$TESSERA_JOB_DIR/servers
case "${1:-}" in
  serve)
    memory=${TESSERA_NODE_MEMORY:-$(awk '/MemAvailable/ { printf "%d", $2 * 512 }' /proc/meminfo)}
    exec "$TESSERA_BIN" server --memory "$memory"
    ;;
  add)
    exec 9>> "$state"
    flock 9
    node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk -v state="$state" '
      BEGIN { while ((getline n < state) > 0) count[n]++ }
      { c = count[$1] + 0; if (best == "" || c < least) { best = $1; least = c } }
      END { print best }')
    echo "$node" >> "$state"
    # Detached from this script, which the manager waits for.
    setsid srun --overlap --nodes=1 --ntasks=1 --nodelist="$node" --kill-on-bad-exit=0 \
      "$0" serve >> "$TESSERA_JOB_DIR/servers.log" 2>&1 < /dev/null &
    echo $! >> "$TESSERA_JOB_DIR/steps"
    ;;
  remove)
    exec 9>> "$state"
    flock 9
    ip=${TESSERA_NODE_ADDR%:*}
    gone=""
    while read -r node; do
      if [ -z "$gone" ] && getent ahostsv4 "$node" | awk '{ print $1 }' | grep -qxF "$ip"; then
        gone=$node
      else
        echo "$node"
      fi
    done < "$state" > "$state.new"
    mv "$state.new" "$state"
    ;;
  *)
    echo "usage: tessera-grow.sh serve|add|remove" >&2
    exit 2
    ;;
esac
