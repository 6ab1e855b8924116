#!/usr/bin/env bash
# Collective output benchmark (issue 33), as root: 2, 4 and 8 writer processes emit 100-byte
# SAM-like records keyed by position into one output: naive N-to-1 appends through the mount,
# N sorted files then `sort -m` through the mount, and `tessera collect` (the library; with
# its aggregation time on its own), against N-to-N unsorted writes; a local cluster of 4
# servers and its mount. Prints a Markdown table (scripts/bench_collective.py).
# Usage: scripts/bench-collective.sh [TOTAL]   (record bytes per run, default 64MiB)
# Environment: WRITERS (default 2,4,8), ROUNDS (default 3: medians), VERBOSE (1: each collective's
# writers' times), TESSERA_BIN (another tessera binary), WAYS (a subset: see bench_collective.py).
set -euo pipefail
cd "$(dirname "$0")/.."
total=${1:-64MiB}
bytes=$(python3 -c "
import re, sys
m = re.fullmatch(r'(\d+)([KMG]i?B)?', sys.argv[1])
print(int(m.group(1)) * {None: 1, 'KiB': 1 << 10, 'MiB': 1 << 20, 'GiB': 1 << 30}[m.group(2)])" "$total")
if [ -z "${TESSERA_BIN:-}" ]; then
  cargo build -q --release --locked -p tessera-cli
fi
bin=${TESSERA_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/tessera}

. scripts/lib/scratch.sh tessera-bench-collective
mkdir -p "$work/mnt"
mounts+=("$work/mnt")
"$bin" --manager "127.0.0.1:$(free_port)" up --http "127.0.0.1:$(free_port)" --servers 4 \
  --memory 2GiB > "$work/up.log" 2>&1 &
pids+=($!)
wait_cluster_file
"$bin" mount "$work/mnt" > "$work/mount.log" 2>&1 &
pids+=($!)
wait_mounted "$work/mnt"

echo "$total of records per run; $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD)"
python3 scripts/bench_collective.py "$bin" "$work/mnt" "$bytes" "${WRITERS:-2,4,8}"
