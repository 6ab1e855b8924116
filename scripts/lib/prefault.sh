# Sourced by the benchmarks that start a cluster with `tessera up --prefault`: waits until the
# servers' pools of pre-faulted buffers stop growing (for at most 300 s), so the filling, which
# runs while the servers are idle, does not take CPU from what is measured next.
# Usage: wait_prefaulted TESSERA_BIN   (with the cluster's TESSERA_HOME or manager in the environment)
wait_prefaulted() {
  local bin=$1 last=-1 now=0
  for _ in $(seq 150); do
    now=$("$bin" status --json |
      python3 -c 'import json, sys; print(sum(n["stats"]["pooled"] for n in json.load(sys.stdin)["nodes"]))')
    [ "$now" -gt 0 ] && [ "$now" = "$last" ] && break
    last=$now
    sleep 2
  done
  echo "servers' pools: $((now >> 20)) MiB pre-faulted"
}
