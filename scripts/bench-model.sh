#!/usr/bin/env bash
# The I/O model on real programs (issue 32): sort, tar and a read alignment traced through a
# mount, profiled; in three rounds from cold caches the original, the replay of its model and fio's
# replay of its trace, timed by the mount, on two configurations. Needs root, FUSE, fio, bwa, samtools
# (installed here when missing).
# Usage: scripts/bench-model.sh [SCALE]   (default 1: about 100 MB per program; OUT=FILE keeps
# the JSON; THINK=burn|sleep replays with the time between requests; PROGS, ROUNDS: see
# bench_model.py)
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
