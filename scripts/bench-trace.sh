#!/usr/bin/env bash
# What tracing costs at the mount (issue 31): 1 MiB sequential writes and reads, 4 KiB random
# reads, creates and stats, with tracing off and on alternated on one cluster; then the rate the
# trace writer takes records at, producers flat out, and whether it dropped any.
# Usage: scripts/bench-trace.sh [ROUNDS] [SIZE_MIB] [FILES]   (root, FUSE; OUT=FILE keeps the JSON)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v fio >/dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q fio >/dev/null
if [ -z "${TESSERA_BIN:-}" ]; then
  cargo build -q --release --locked -p tessera-cli
fi
python3 scripts/bench_trace.py "${TESSERA_BIN:-$PWD/target/release/tessera}" "${1:-5}" "${2:-1024}" "${3:-2000}"
cargo run -q --release --locked -p tessera-trace --example writer_rate
