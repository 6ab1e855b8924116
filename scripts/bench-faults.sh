#!/usr/bin/env bash
# Failures through `tessera up` (issue 29): time to detect a dead server and to restore two
# copies per GiB held, read throughput during the rebuild, time for a killed manager to be
# started again and recover the cluster, and a read loop's longest stall meanwhile.
# Usage: scripts/bench-faults.sh [SIZE_GIB] [DEAD_AFTER_S]   (root, FUSE; defaults 2 and 2;
# OUT=FILE keeps the JSON)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${TESSERA_BIN:-}" ]; then
  cargo build -q --release --locked -p tessera-cli
fi
exec python3 scripts/bench_faults.py "${TESSERA_BIN:-$PWD/target/release/tessera}" "${1:-2}" "${2:-2}"
