#!/usr/bin/env bash
# FUSE benchmark (issue #3), as root: fio and a metadata test on tmpfs, on a pass-through FUSE
# mount over tmpfs (bindfs -o direct_io: the FUSE ceiling) and on a Tessera mount of a local
# cluster with 4 servers, in one run; prints a table with Tessera's ratios to both.
# Usage: scripts/bench-fuse.sh [SIZE]   (fio file size, default 4G)
# Environment: OUT (JSON results, default /tmp/bench-fuse.json), MOUNT_ARGS (extra flags for
# `tessera mount`, e.g. "--writeback-cache").
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-4G}
command -v fio >/dev/null && command -v bindfs >/dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q fio bindfs >/dev/null
cargo build -q --release --locked -p tessera-cli
bin=$PWD/target/release/tessera

work=$(mktemp -d /tmp/tessera-bench-fuse.XXXXXX)
mkdir -p "$work/tmpfs" "$work/bindfs" "$work/tessera" "$work/mnt"
export TESSERA_HOME=$work/home
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  umount -l "$work/mnt" 2>/dev/null || true
  umount -l "$work/bindfs" 2>/dev/null || true
  umount -l "$work/tmpfs" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

mount -t tmpfs -o size=80% tmpfs "$work/tmpfs"
mkdir "$work/tmpfs/plain" "$work/tmpfs/under-bindfs"
bindfs -o direct_io "$work/tmpfs/under-bindfs" "$work/bindfs"
"$bin" up --servers 4 --memory 2GiB > "$work/up.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do [ -e "$TESSERA_HOME/cluster.toml" ] && break; sleep 0.1; done
# shellcheck disable=SC2086
"$bin" mount "$work/mnt" ${MOUNT_ARGS:-} > "$work/mount.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do mountpoint -q "$work/mnt" && break; sleep 0.1; done
mountpoint -q "$work/mnt" || { cat "$work"/*.log; exit 1; }

echo "fio file $size; $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ); mount flags: ${MOUNT_ARGS:-none}"
python3 scripts/bench_fuse.py "$size" tmpfs="$work/tmpfs/plain" bindfs="$work/bindfs" \
  tessera="$work/mnt"
