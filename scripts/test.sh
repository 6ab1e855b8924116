#!/usr/bin/env bash
# The test command (README): formatting, lints, then every unit, property and integration test.
# Integration tests start real manager/server/worker processes on 127.0.0.x.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
rustup component add rustfmt clippy >/dev/null 2>&1 || true
./scripts/deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Integration tests look for the binaries next to themselves.
cargo build --workspace --bins --locked
cargo test --workspace --locked --no-fail-fast
# The Python package (PyO3 extension, fsspec file system) against real local clusters.
./scripts/test-python.sh
# The FUSE mount under POSIX suites, fsx and a shell workflow (needs root and /dev/fuse).
TESSERA_BIN=$PWD/target/debug/tessera ./scripts/test-mount.sh
# Tessera for the length of a SLURM job, on a single-node SLURM started here (needs root).
TESSERA_BIN=$PWD/target/debug/tessera ./scripts/test-slurm.sh
