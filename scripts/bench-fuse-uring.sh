#!/usr/bin/env bash
# The FUSE transport's ceiling, /dev/fuse against io_uring (issue 34, item 3), as root: the
# probe (crates/fuse/examples/uring_probe.rs, a file system answering from nothing) mounted one
# way then the other, rounds alternated, each timing `stat`s and 4 KiB direct reads by THREADS
# threads. Prints the medians and the ring's ratio to /dev/fuse. The fuse module's
# `enable_uring` is set to Y for the ring runs and put back as it was on exit.
# Usage: scripts/bench-fuse-uring.sh [ROUNDS] [SECONDS]   (defaults 5 and 3)
# Environment: THREADS (default "1 2 4"), PROBE_BIN (a built probe; default: built here).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
secs=${2:-3}
param=/sys/module/fuse/parameters/enable_uring
if [ ! -w "$param" ]; then
  echo "bench-fuse-uring: $param is missing or not writable: this kernel (or user) cannot serve FUSE over io_uring" >&2
  exit 2
fi
if [ -z "${PROBE_BIN:-}" ]; then
  cargo build -q --release --locked -p tessera-fuse --example uring_probe
  PROBE_BIN=$PWD/target/release/examples/uring_probe
fi
was=$(cat "$param")
mnt=$(mktemp -d /tmp/fuse-uring.XXXXXX)
out=$(mktemp /tmp/fuse-uring.XXXXXX.json)
cleanup() {
  echo "$was" >"$param"
  umount -l "$mnt" 2>/dev/null || true
  rmdir "$mnt" 2>/dev/null || true
  rm -f "$out"
}
trap cleanup EXIT
for r in $(seq "$rounds"); do
  for t in ${THREADS:-1 2 4}; do
    for mode in dev uring; do
      if [ "$mode" = uring ]; then echo Y >"$param"; else echo N >"$param"; fi
      timeout $((secs * 4 + 30)) "$PROBE_BIN" "$mode" "$mnt" "$secs" "$t" >>"$out"
    done
  done
  echo "round $r of $rounds done" >&2
done
echo "$(nproc) CPUs; kernel $(uname -r); $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD); $rounds rounds of $secs s"
python3 - "$out" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print("| threads | stats/s /dev/fuse | stats/s io_uring | ratio | 4 KiB reads/s /dev/fuse | 4 KiB reads/s io_uring | ratio |")
print("|---|---|---|---|---|---|---|")
for t in sorted({r["threads"] for r in runs}):
    med = {}
    for mode in ("dev", "uring"):
        mine = [r for r in runs if r["threads"] == t and r["mode"] == mode]
        med[mode] = {k: statistics.median(r[k] for r in mine) for k in ("stats_per_s", "reads_4k_per_s")}
        if mode == "uring":
            assert all(r["served_on_rings"] > 0 for r in mine), "a ring run served nothing on its rings"
    cells = []
    for k in ("stats_per_s", "reads_4k_per_s"):
        d, u = med["dev"][k], med["uring"][k]
        cells += [f"{d / 1000:.1f} K", f"{u / 1000:.1f} K", f"{u / d:.2f}x"]
    print(f"| {t} | " + " | ".join(cells) + " |")
EOF
