#!/usr/bin/env bash
# Python benchmark (BENCHMARKS.md, issue #6): release builds of the tessera binary and of the
# Python extension, then scripts/bench_python.py: `tessera bench` (Rust client), the same
# sequential and small-file work through Python, and local tmpfs, in one run on one cluster.
# Usage: scripts/bench-python.sh [SIZE_BYTES] [FILES]   (default 2 GiB, 10000)
# Environment: ROUNDS (default 2), OUT_JSON, SERVER_MEMORY (default 1536MiB x 4 servers).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${TESSERA_VENV:-.venv}
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r python/requirements-test.txt
cargo build --release -q --locked -p tessera-cli
export TESSERA_BIN=$PWD/target/release/tessera
VIRTUAL_ENV=$PWD/$venv "$venv/bin/maturin" develop -q --release --locked
exec "$venv/bin/python" scripts/bench_python.py "$@"
