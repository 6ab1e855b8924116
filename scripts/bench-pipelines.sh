#!/usr/bin/env bash
# Real pipelines benchmark (issue #34), as root: BLAST over a split database, bwa + samtools,
# velvet and Montage, from Debian's packages, run unmodified on local disk, tmpfs, a
# pass-through FUSE mount (bindfs, page cache on) and a Tessera mount of a local cluster with
# 4 servers, in one run, stage by stage; prints a table with Tessera's ratios to each and
# checks that every directory produced the same outputs.
# Usage: scripts/bench-pipelines.sh
# Environment: ROUNDS, PIPELINES, SCALE, CACHE, OUT (see scripts/bench_pipelines.py),
# MOUNT_ARGS (extra flags for `tessera mount`), TESSERA_BIN (another tessera binary), LOCAL
# (the local-disk directory's parent, default /var/tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
need=(seqkit makeblastdb blastp bwa samtools velveth mProjExec bindfs)
for c in "${need[@]}"; do
  command -v "$c" >/dev/null || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q seqkit ncbi-blast+ bwa samtools velvet \
      montage bindfs >/dev/null
    break
  }
done
if [ -z "${TESSERA_BIN:-}" ]; then
  cargo build -q --release --locked -p tessera-cli
fi
bin=${TESSERA_BIN:-$PWD/target/release/tessera}

. scripts/lib/scratch.sh tessera-bench-pipelines
local_dir=$(mktemp -d "${LOCAL:-/var/tmp}/tessera-pipelines-local.XXXXXX")
trap 'cleanup; rm -rf "$local_dir"' EXIT
mkdir -p "$work/tmpfs" "$work/bindfs" "$work/mnt"
mounts+=("$work/tmpfs" "$work/bindfs" "$work/mnt")
mount -t tmpfs -o size=50% tmpfs "$work/tmpfs"
mkdir "$work/tmpfs/plain" "$work/tmpfs/under-bindfs"
bindfs "$work/tmpfs/under-bindfs" "$work/bindfs"
"$bin" --manager "127.0.0.1:$(free_port)" up --http "127.0.0.1:$(free_port)" --servers 4 \
  --memory 2GiB > "$work/up.log" 2>&1 &
pids+=($!)
wait_cluster_file
# shellcheck disable=SC2086
"$bin" mount "$work/mnt" ${MOUNT_ARGS:-} > "$work/mount.log" 2>&1 &
pids+=($!)
wait_mounted "$work/mnt"

echo "$(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD); mount flags: ${MOUNT_ARGS:-none}; scale ${SCALE:-1}"
python3 scripts/bench_pipelines.py local="$local_dir" tmpfs="$work/tmpfs/plain" \
  bindfs="$work/bindfs" tessera="$work/mnt" || { tail -n 20 "$work"/*.log >&2; exit 1; }
