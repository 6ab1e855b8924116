#!/usr/bin/env bash
# A shell-level workflow run twice, on a Tessera mount and on a local directory, with the
# results compared byte for byte: thousands of small files, cp -r, tar in and out, sort of a
# large file, sha256sum of everything.
# Usage: tests/posix/workflow.sh TESSERA_DIR LOCAL_DIR
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 TESSERA_DIR LOCAL_DIR" >&2; exit 2; }

steps() {
  local root=$1
  mkdir -p "$root/src/a/b" "$root/out"
  cd "$root"
  # About 30 MB of lines in a fixed shuffled order, cut into 3000 small files.
  seq -f "%09g" 1 3000000 | shuf --random-source=<(yes tessera) > big.txt
  split -l 1000 -a 4 big.txt src/part.
  mv src/part.aa* src/a/
  mv src/part.ab* src/a/b/
  cp -r src copy
  tar cf out/tree.tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner src
  mkdir unpacked
  tar xf out/tree.tar -C unpacked
  sort big.txt > out/sorted.txt
  sort -r -k1,1 src/a/part.aaa* > out/reversed.txt
  cat copy/a/b/* | wc -l > out/count.txt
  rm -r copy/a
  find . -type f ! -name manifest | LC_ALL=C sort | xargs sha256sum > manifest
}

time_steps() {
  local start=$EPOCHREALTIME
  (steps "$1")
  awk -v a="$start" -v b="$EPOCHREALTIME" -v d="$1" 'BEGIN { printf "%s: %.1f s\n", d, b - a }'
}

t=$1/workflow
l=$2/workflow
rm -rf "$t" "$l"
time_steps "$t"
time_steps "$l"
files=$(wc -l < "$l/manifest")
[ "$files" -gt 3000 ] || { echo "only $files files in the manifest" >&2; exit 1; }
diff "$t/manifest" "$l/manifest"
diff -r "$t" "$l"
echo "workflow: $files files identical on Tessera and on local disk"
rm -rf "$t" "$l"
