#!/bin/sh
# A shuffle shaped like TeraSort, for `tessera evaluate --every-host --workload "sh shuffle.sh"`:
# every host runs it at once in the same directory, each through its own mount.
#
# 1. Map: host i makes its share of SHUFFLE_MB (default 128, all hosts together) of 100-byte
#    records with random keys and writes them into one file per key range, map/h<i>-r<range>,
#    a range per host; then map/h<i>.sums (per range: records and sums of the key's halves) and
#    the marker done/h<i>.
# 2. Barrier: wait until every host's marker is there (at most SHUFFLE_TIMEOUT s, default 600).
# 3. Reduce: host i sorts range i from every host's files into out/r<i> and checks it: sorted,
#    every key in the range, every record whole, and as many records and the same key sums as
#    the hosts wrote into that range.
#
# Without tessera evaluate: TESSERA_HOST (default 0), TESSERA_HOSTS (default 1), TESSERA_DIR
# (default the working directory).
set -eu

host=${TESSERA_HOST:-0}
hosts=${TESSERA_HOSTS:-1}
dir=${TESSERA_DIR:-$PWD}
mb=${SHUFFLE_MB:-128}
timeout=${SHUFFLE_TIMEOUT:-600}
say() { echo "shuffle: host $host: $*" >&2; }

mkdir -p "$dir/map" "$dir/done" "$dir/out"

# Map. A key is 8 hex digits, as two 16-bit halves (exact in any awk); the record carries its
# host, its number and its key again, so a record damaged or cut is seen.
records=$((mb * 1048576 / 100 / hosts))
awk -v host="$host" -v hosts="$hosts" -v records="$records" -v out="$dir/map" '
BEGIN {
    srand(host * 7919 + 17)
    fill = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
    for (p = 0; p < hosts; p++) {
        file[p] = out "/h" host "-r" p
        printf "" > file[p]
        n[p] = 0; hi[p] = 0; lo[p] = 0
    }
    for (r = 0; r < records; r++) {
        a = int(rand() * 65536); b = int(rand() * 65536)
        p = int((a * 65536 + b) * hosts / 4294967296)
        key = sprintf("%04x%04x", a, b)
        # 8 + 1 + 90 + newline: 100 bytes.
        printf "%s h%05d r%010d k%s %s\n", key, host, r, key, fill > file[p]
        n[p]++; hi[p] += a; lo[p] += b
    }
    for (p = 0; p < hosts; p++) {
        close(file[p])
        printf "%d %d %.0f %.0f\n", p, n[p], hi[p], lo[p] > (out "/h" host ".sums")
    }
    close(out "/h" host ".sums")
}'
: > "$dir/done/h$host"

# Barrier.
deadline=$(($(date +%s) + timeout))
while :; do
    mapped=$(ls "$dir/done" | wc -l)
    [ "$mapped" -ge "$hosts" ] && break
    if [ "$(date +%s)" -ge "$deadline" ]; then
        say "only $mapped of $hosts hosts finished their map within ${timeout}s"
        exit 1
    fi
    sleep 0.2
done

# Reduce: range $host from every host.
inputs=""
h=0
while [ "$h" -lt "$hosts" ]; do
    inputs="$inputs $dir/map/h$h-r$host"
    h=$((h + 1))
done
# shellcheck disable=SC2086 # the inputs are words, each a path without spaces
LC_ALL=C sort -o "$dir/out/r$host" $inputs
want=$(cat "$dir"/map/h*.sums | awk -v p="$host" '$1 == p { n += $2; hi += $3; lo += $4 }
    END { printf "%d %.0f %.0f", n, hi, lo }')
got=$(awk -v p="$host" -v hosts="$hosts" '
    {
        # As strings: a key such as 12e45678 would compare as a number.
        key = "" $1
        if (length($0) != 99 || $4 != "k" key) { bad = "a damaged record at line " NR; exit }
        if (NR > 1 && key < last) { bad = "out of order at line " NR; exit }
        a = 0; b = 0
        for (i = 1; i <= 4; i++) a = a * 16 + index("0123456789abcdef", substr(key, i, 1)) - 1
        for (i = 5; i <= 8; i++) b = b * 16 + index("0123456789abcdef", substr(key, i, 1)) - 1
        if (int((a * 65536 + b) * hosts / 4294967296) != p) { bad = "key " key " is not in range " p; exit }
        last = key; n++; hi += a; lo += b
    }
    END { if (bad != "") { print bad; exit 1 } printf "%d %.0f %.0f", n, hi, lo }' "$dir/out/r$host") || { say "out/r$host: $got"; exit 1; }
if [ "$got" != "$want" ]; then
    say "range $host has (records, key sums) $got; the hosts wrote $want"
    exit 1
fi
