#!/usr/bin/env bash
# A/B of two `tessera` builds on the same boot, alternated A B A B ...: each round starts a
# 4-server cluster with a mount (`tessera up`), runs `tessera bench --size 1GiB --files 5000`
# (client library, loopback TCP measured in the same run), then through the mount a 1 GiB dd
# write (fsync) and read with the page cache dropped before each, and one Python process writing
# and reading 5,000 4 KiB files and appending 5,000 lines with open-append-close.
# Usage: scripts/bench-ab.sh BIN_A BIN_B [ROUNDS]   (root, FUSE; results in $OUT or a temp dir)
set -euo pipefail
a=$1 b=$2 rounds=${3:-3}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"

round() {
  local bin=$1 tag=$2 home mnt up w r s
  home=$(mktemp -d); mnt=$home/m; mkdir -p "$mnt"
  TESSERA_HOME=$home "$bin" up --servers 4 --memory 2GiB --manager 127.0.0.1:17270 \
    --http 127.0.0.1:17271 --mount "$mnt" >"$home/up.log" 2>&1 &
  up=$!
  for _ in $(seq 600); do [ -f "$home/cluster.toml" ] && mountpoint -q "$mnt" && break; sleep 0.1; done
  TESSERA_HOME=$home "$bin" bench --size 1GiB --files 5000 --json "$out/$tag-bench.json" \
    >"$out/$tag-bench.txt" 2>&1
  sync; echo 3 >/proc/sys/vm/drop_caches
  w=$(/usr/bin/time -f %e -o /dev/stdout dd if=/dev/zero of="$mnt/big" bs=1M count=1024 conv=fsync status=none)
  echo 3 >/proc/sys/vm/drop_caches
  r=$(/usr/bin/time -f %e -o /dev/stdout dd if="$mnt/big" of=/dev/null bs=1M status=none)
  s=$(/usr/bin/time -f %e -o /dev/stdout python3 -c "
import os
d = '$mnt/small'
os.mkdir(d)
for i in range(5000):
    with open(f'{d}/f{i}', 'wb') as f: f.write(b'x' * 4096)
for i in range(5000):
    with open(f'{d}/f{i}', 'rb') as f: f.read()
for i in range(5000):
    with open(f'{d}/log', 'a') as f: f.write('line %d\n' % i)
")
  printf '%s  mount: dd write 1 GiB %s s, dd read %s s, small files + appends %s s;  library: %s\n' \
    "$tag" "$w" "$r" "$s" \
    "$(grep -E 'sequential write|sequential read|creates|stats|unlinks' "$out/$tag-bench.txt" |
       sed -E 's/ +/ /g; s/ \(.*of loopback TCP\)//' | tr '\n' ';')" | tee -a "$out/summary.txt"
  kill -INT "$up"; wait "$up" 2>/dev/null || true
  rm -rf "$home"
}

for i in $(seq "$rounds"); do round "$a" "A$i"; round "$b" "B$i"; done
echo "results: $out/summary.txt"
