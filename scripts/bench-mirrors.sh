#!/usr/bin/env bash
# Reproduces BENCHMARKS.md for issue #4, the CEFT-PVFS experiment on one machine: a manager and
# 4 servers (release build), `tessera bench` writing then reading one large file, with
# replication 1 and 2, first unloaded, then with server 1 turned into a hot spot (every stripe
# request it serves waits DELAY, as a node under a disk or CPU hog would), and with replication 2
# under both write protocols. Loopback TCP is measured in the same runs by `tessera bench`.
# Usage: scripts/bench-mirrors.sh [SIZE] [DELAY]   (defaults 2GiB, 10ms)
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-2GiB}
delay=${2:-10ms}
cargo build --release -q -p tessera-cli
. scripts/lib/scratch.sh tessera-bench-mirrors
out=${OUT:-$work}
mkdir -p "$out"
bin=$PWD/target/release/tessera
export TESSERA_SECRET=bench-mirrors

# run NAME REPLICATION HOT(0|1) WRITE_ACK: one fresh cluster, one `tessera bench`.
run() {
  local name=$1 r=$2 hot=$3 ack=$4 port
  port=$(free_port)
  export TESSERA_MANAGER=127.0.0.1:$port
  "$bin" manager --listen "$TESSERA_MANAGER" --http 127.0.0.1:0 --expect 4 --replication "$r" \
    >"$work/$name-manager.log" 2>&1 &
  local started=($!)
  for i in 1 2 3 4; do
    local extra=()
    if [ "$hot" = 1 ] && [ "$i" = 1 ]; then extra=(--fault-delay "$delay"); fi
    "$bin" server --listen "127.0.0.$((i + 1)):0" --memory 3GiB "${extra[@]}" \
      >"$work/$name-server$i.log" 2>&1 &
    started+=($!)
  done
  pids+=("${started[@]}")
  echo "== $name: replication $r, hot spot $hot, write-ack $ack"
  "$bin" --write-ack "$ack" bench --size "$size" --files 200 --json "$out/$name.json" |
    grep -Ei "write|read" || true
  for p in "${started[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  for p in "${started[@]}"; do wait "$p" 2>/dev/null || true; done
}

run r1 1 0 all
run r1-hot 1 1 all
run r2 2 0 all
run r2-hot 2 1 all
run r2-primary 2 0 primary

python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
r = {n: json.load(open(f"{d}/{n}.json")) for n in ["r1", "r1-hot", "r2", "r2-hot", "r2-primary"]}
tcp = sum(v["loopback_tcp_gbps"] for v in r.values()) / len(r)
print(f"\nloopback TCP (mean of the runs): {tcp:.2f} GB/s")
print("| run | write GB/s | read GB/s | read / TCP | lone 1 MiB reads GB/s (ms each) |")
print("|---|---|---|---|---|")
for n, v in r.items():
    print(f"| {n} | {v['write_gbps']:.2f} | {v['read_gbps']:.2f} | {v['read_gbps'] / v['loopback_tcp_gbps']:.0%} "
          f"| {v['lone_read_gbps']:.2f} ({v['lone_read_ms']:.2f}) |")
for k in ["r1", "r2"]:
    print(f"read slowdown with a hot spot, {k}: {r[k]['read_gbps'] / r[k + '-hot']['read_gbps']:.2f}x")
print(f"r2 / r1 unloaded: sequential read {r['r2']['read_gbps'] / r['r1']['read_gbps']:.2f}x, "
      f"lone reads (double read parallelism) {r['r2']['lone_read_gbps'] / r['r1']['lone_read_gbps']:.2f}x")
print(f"write cost of mirrors: r2 all / r1 = {r['r2']['write_gbps'] / r['r1']['write_gbps']:.2f}, "
      f"r2 primary / r1 = {r['r2-primary']['write_gbps'] / r['r1']['write_gbps']:.2f}")
PY
echo "results: $out"
