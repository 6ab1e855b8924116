#!/usr/bin/env bash
# Reproduces BENCHMARKS.md for issue #2: the loopback-TCP ceiling (iperf3, one stream, 1 MiB
# writes), then `tessera bench` against a fresh `tessera up` cluster of 4 servers: once on fresh
# server memory (first touch), once more on memory the servers already used.
# Usage: scripts/bench.sh [SIZE]   (default 4GiB)
# Environment: OUT (where the JSON results go), UP_ARGS (extra flags for `tessera up`, e.g.
# "--prefault 1GiB": the first bench then waits until the servers' pools are full), TESSERA_BIN
# (another tessera binary; none is built then).
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-4GiB}
if ! command -v iperf3 >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 >/dev/null
fi
if [ -z "${TESSERA_BIN:-}" ]; then
  cargo build --release -q -p tessera-cli
fi
bin=${TESSERA_BIN:-target/release/tessera}
export TESSERA_HOME=$(mktemp -d)
out=${OUT:-$TESSERA_HOME}
mkdir -p "$out"

iperf3 -s -1 -B 127.0.0.1 -p 15201 >/dev/null 2>&1 &
sleep 0.5
echo "== loopback TCP, iperf3, 1 stream, 1 MiB writes, 5 s"
iperf3 -c 127.0.0.1 -p 15201 -t 5 -l 1M | grep receiver

read -ra up_args <<< "${UP_ARGS:-}"
$bin up --servers 4 --manager 127.0.0.1:17170 --http 127.0.0.1:17171 "${up_args[@]}" >"$TESSERA_HOME/up.log" 2>&1 &
up=$!
trap 'kill -INT $up 2>/dev/null; wait $up 2>/dev/null || true' EXIT
for _ in $(seq 600); do [ -f "$TESSERA_HOME/cluster.toml" ] && break; sleep 0.1; done
[ -f "$TESSERA_HOME/cluster.toml" ] || { cat "$TESSERA_HOME/up.log"; exit 1; }
if [[ " ${up_args[*]} " == *" --prefault "* ]]; then
  . scripts/lib/prefault.sh
  wait_prefaulted "$bin"
fi
echo "== tessera bench --size $size (fresh server memory)"
$bin bench --size "$size" --json "$out/bench-fresh.json"
echo "== tessera bench --size $size (memory reused)"
$bin bench --size "$size" --json "$out/bench-reused.json"
echo "results: $out/bench-fresh.json $out/bench-reused.json"
