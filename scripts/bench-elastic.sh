#!/usr/bin/env bash
# Reproduces BENCHMARKS.md for issue #5 (release build, one machine):
#  (a) migration: `tessera bench --stream` (one reader, one writer, 1 MiB requests, each timed)
#      on 3 servers; `tessera scale --add 1` after 8 s; throughput before, during and after the
#      move, failed requests, slowest request.
#  (b) MemFS Table I at small scale: a workload that writes 64 MiB files (one a second) up to
#      3 GiB, then deletes them in four stages, run on a static cluster of 8 servers x 512 MiB
#      and under two elastic policies (Policy 1: start with 4 and never below, step 2, marks
#      90/50; Policy 2: start with 2, step 2, marks 80/40); the manager's memory history gives
#      allocated and used GiB-seconds.
# Usage: scripts/bench-elastic.sh   (OUT=dir keeps the results)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p tessera-cli
. scripts/lib/scratch.sh tessera-bench-elastic
out=${OUT:-$work}
mkdir -p "$out"
bin=$PWD/target/release/tessera
export TESSERA_SECRET=bench-elastic

# up NAME ARGS...: starts a cluster in the background; sets TESSERA_MANAGER and http.
up() {
  local name=$1
  shift
  export TESSERA_MANAGER=127.0.0.1:$(free_port)
  http=127.0.0.1:$(free_port)
  export TESSERA_HOME=$work/home-$name
  "$bin" up --manager "$TESSERA_MANAGER" --http "$http" "$@" >"$work/$name-up.log" 2>&1 &
  cluster=$!
  pids+=("$cluster")
  wait_cluster_file
}
down() {
  kill -INT "$cluster" 2>/dev/null || true
  wait "$cluster" 2>/dev/null || true
}

echo "== (a) a scale-out under a streaming reader and writer"
up migrate --servers 3 --memory 2GiB
"$bin" bench --stream 24s --size 512MiB --json "$out/stream.json" >"$out/stream.txt" &
bench=$!
sleep 8
t0=$(date +%s.%N)
"$bin" scale --add 1 >/dev/null
t1=$(date +%s.%N)
wait "$bench"
down
python3 - "$out/stream.json" "$t0" "$t1" <<'PY'
import json, sys
tl = json.load(open(sys.argv[1]))
took = float(sys.argv[3]) - float(sys.argv[2])
sec = tl["seconds"]
tot = lambda s: s["read_mbps"] + s["write_mbps"]
before = [tot(s) for s in sec if 1 <= s["t"] < 8]
during = [tot(s) for s in sec if 8 <= s["t"] <= 8 + took]
after = [tot(s) for s in sec if s["t"] > 9 + took]
mean = lambda v: sum(v) / len(v) if v else float("nan")
b = mean(before)
print(f"scale-out (3 -> 4 servers) took {took:.2f} s")
print(f"read+write MB/s: before {b:.0f}, during {mean(during):.0f} (worst second {min(during, default=float('nan')):.0f}), after {mean(after):.0f}")
print(f"dip: mean {1 - mean(during) / b:.0%}, worst second {1 - min(during, default=b) / b:.0%}")
print(f"failed requests: {tl['failed']}, slowest request: {tl['max_latency_ms']:.1f} ms")
PY

# workload NAME: the growing-then-shrinking data set; prints its runtime.
workload() {
  local name=$1 start retries=0
  head -c $((64 << 20)) /dev/urandom >"$work/blob"
  "$bin" mkdir tessera:/w
  start=$(date +%s.%N)
  for i in $(seq 48); do
    local t=$(date +%s.%N)
    # A full cluster (the policy not caught up yet) is retried, as a workflow engine would;
    # any other error ends the run.
    until "$bin" cp "$work/blob" "tessera:/w/f$i" 2>"$work/cp.err"; do
      grep -q "no space" "$work/cp.err" || { cat "$work/cp.err" >&2; exit 1; }
      retries=$((retries + 1))
      [ $retries -lt 200 ] || { echo "gave up: cluster stayed full" >&2; exit 1; }
      sleep 0.5
    done
    sleep "$(python3 -c "import time; print(max(0, 1 - (time.time() - $t)))")"
  done
  for stage in 0 1 2 3; do
    sleep 6
    for i in $(seq $((stage * 12 + 1)) $((stage * 12 + 12))); do "$bin" rm "tessera:/w/f$i"; done
  done
  sleep 6
  python3 -c "import time; print(round(time.time() - $start, 2))" >"$out/$name-runtime"
  echo "$retries" >"$out/$name-retries"
  curl -s -H "Authorization: Bearer $TESSERA_SECRET" "http://$http/history" >"$out/$name-history.json"
}

echo "== (b) MemFS Table I: static vs two elastic policies"
up static --servers 8 --memory 512MiB
workload static
down
up policy1 --servers 4 --memory 512MiB --elastic --scale-step 2 --scale-high 90% --scale-low 50% --min-nodes 4 --max-nodes 8 --scale-cooldown 2s
workload policy1
down
up policy2 --servers 2 --memory 512MiB --elastic --scale-step 2 --scale-high 80% --scale-low 40% --min-nodes 2 --max-nodes 8 --scale-cooldown 2s
workload policy2
down
python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
runs = {}
for n in ["static", "policy1", "policy2"]:
    h = json.load(open(f"{d}/{n}-history.json"))
    runtime = float(open(f"{d}/{n}-runtime").read())
    retries = int(open(f"{d}/{n}-retries").read())
    s = h["samples"]
    span = s[-1]["t_ms"] - s[0]["t_ms"] if len(s) > 1 else 1
    half = sum((b["t_ms"] - a["t_ms"]) for a, b in zip(s, s[1:]) if a["nodes"] <= 4)
    runs[n] = (h["stats"], runtime, retries, half / span, max(x["nodes"] for x in s))
st = runs["static"][0]
print("| run | runtime s | overhead | allocated GiB*s | used GiB*s | waste GiB*s | improvement | time with <= 4 of 8 servers | peak servers | writes retried (full) |")
print("|---|---|---|---|---|---|---|---|---|---|")
G = 1 << 30
for n, (s, rt, rtr, half, peak) in runs.items():
    imp = 1 - s["waste_byte_seconds"] / st["waste_byte_seconds"]
    ovh = rt / runs["static"][1] - 1
    print(f"| {n} | {rt:.1f} | {ovh:+.0%} | {s['allocated_byte_seconds'] / G:.0f} | {s['used_byte_seconds'] / G:.0f} | "
          f"{s['waste_byte_seconds'] / G:.0f} | {imp:.1%} | {half:.0%} | {peak} | {rtr} |")
PY
echo "results: $out"
