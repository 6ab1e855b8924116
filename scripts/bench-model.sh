#!/usr/bin/env bash
# The I/O model on real programs (issue 32): sort, tar and a read alignment traced through a
# mount, profiled, replayed three times on the same configuration and once more on another, the
# replays' I/O time and shape against the originals'. Needs root, FUSE, bwa and samtools
# (installed here when missing).
# Usage: scripts/bench-model.sh [SCALE]   (default 1: about 100 MB per program; OUT=FILE keeps
# the JSON)
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in bwa samtools; do
  command -v $tool >/dev/null ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q bwa samtools >/dev/null
done
if [ -z "${TESSERA_BIN:-}" ]; then
  cargo build -q --release --locked -p tessera-cli
fi
exec python3 scripts/bench_model.py "${TESSERA_BIN:-$PWD/target/release/tessera}" "${1:-1}"
