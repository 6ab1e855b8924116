# Sourced by the scripts that start local clusters and mounts: a scratch directory ($work) and
# a cleanup on exit that first runs the commands given to `on_exit` (the last given first),
# then stops what was started (add pids to `pids`), unmounts what was mounted (add directories
# to `mounts`) and removes the directory.
# Usage: . scripts/lib/scratch.sh NAME
work=$(mktemp -d "/tmp/$1.XXXXXX")
chmod 755 "$work"
export TESSERA_HOME=$work/home
pids=()
mounts=()
exit_hooks=()
# Usage: on_exit COMMAND [ARG...]
on_exit() { exit_hooks+=("$(printf '%q ' "$@")"); }
# Runs the commands given to on_exit since the first N of them, the last given first, and drops them.
unwind_exit_hooks() {
  local i
  for ((i = ${#exit_hooks[@]} - 1; i >= $1; i--)); do
    eval "${exit_hooks[i]}" || true
    unset 'exit_hooks[i]'
  done
}
cleanup() {
  # A second Ctrl-C must not leave daemons, mounts or state behind half-removed.
  trap '' INT TERM
  unwind_exit_hooks 0
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# Waits up to 30 s for DIR to become a mount point.
wait_mounted() {
  for _ in $(seq 300); do
    mountpoint -q "$1" && return 0
    sleep 0.1
  done
  echo "$1 was not mounted in 30 s" >&2
  cat "$work"/*.log >&2 || true
  exit 1
}

# Waits up to 30 s for `tessera up` to write its cluster file.
wait_cluster_file() {
  for _ in $(seq 300); do
    [ -e "$TESSERA_HOME/cluster.toml" ] && return 0
    sleep 0.1
  done
  echo "the cluster did not come up in 30 s" >&2
  cat "$work"/*.log >&2 || true
  exit 1
}

# Runs a command for at most SECONDS, then fails. A request stuck in a FUSE file system leaves
# its caller unkillable, so past the limit the connections of the mounts in `mounts` are
# aborted first (every request then fails at once).
limit() {
  local secs=$1
  shift
  "$@" &
  local pid=$!
  (
    sleep "$secs" </dev/null >/dev/null 2>&1
    echo "timed out after ${secs}s: $*" >&2
    abort_mounts
    kill "$pid" 2>/dev/null
  ) &
  local watchdog=$!
  local rc=0
  wait "$pid" || rc=$?
  kill "$watchdog" 2>/dev/null || true
  return "$rc"
}

abort_mounts() {
  mountpoint -q /sys/fs/fuse/connections ||
    mount -t fusectl none /sys/fs/fuse/connections 2>/dev/null || true
  local m dev
  for m in "${mounts[@]}"; do
    dev=$(mountpoint -d "$m" 2>/dev/null) || continue
    echo 1 > "/sys/fs/fuse/connections/${dev#*:}/abort" 2>/dev/null || true
  done
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Stops a process: SIGTERM, then SIGKILL past SECONDS (20 by default); reaps it if it is a child.
stop_pid() {
  kill -TERM "$1" 2>/dev/null || return 0
  local i
  for ((i = 0; i < ${2:-20} * 10; i++)); do
    case $(ps -o stat= -p "$1" 2>/dev/null) in '' | Z*) break ;; esac
    sleep 0.1
  done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
