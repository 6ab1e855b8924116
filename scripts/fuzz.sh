#!/usr/bin/env bash
# Fuzzes every decoder of bytes from the network (fuzz/: cargo-fuzz targets over
# tessera_proto::fuzzing: frames, messages, the handshake, the partition table) for SECONDS each
# (default 60), with libFuzzer and the address sanitizer. Installs cargo-fuzz if missing.
# cargo-fuzz passes nightly flags: on a stable toolchain RUSTC_BOOTSTRAP=1 lets them through;
# SANITIZER=none runs without the sanitizer where it cannot be built.
# A crash stops the run and leaves its input in fuzz/artifacts/TARGET/; replay it with
#   (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run TARGET artifacts/TARGET/crash-...)
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-60}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
sanitizer=${SANITIZER:-address}
cargo fuzz build --sanitizer "$sanitizer"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for target in $(cargo fuzz list); do
  echo "== $target: $secs s"
  mkdir -p "corpus/$target"
  if ! cargo fuzz run --sanitizer "$sanitizer" "$target" "corpus/$target" -- \
    -max_total_time="$secs" -print_final_stats=1 >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "== $target failed: its input is in fuzz/artifacts/$target/"
    exit 1
  fi
  grep -E '^(Done|stat::number_of_executed_units|stat::new_units_added)' "$log" || true
done
