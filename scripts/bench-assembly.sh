#!/usr/bin/env bash
# Genome assembly benchmark (issue #36): release builds of the tessera binary and of the Python
# extension, the simulator, ABySS and minimap2 installed when missing (Debian: dwgsim, abyss,
# minimap2), then scripts/bench_assembly.py: the pipeline on Dask with the shuffle on Tessera,
# local disk and tmpfs, beside ABySS on the same reads, contigs aligned back with minimap2.
# Usage: scripts/bench-assembly.sh [GENOME_LENGTH] [COVERAGE]   (default 1000000, 30)
# Environment: OUT_JSON (default bench-assembly.json), PROFILE=debug to use debug builds.
set -euo pipefail
cd "$(dirname "$0")/.."
want=()
command -v dwgsim >/dev/null || want+=(dwgsim)
command -v abyss-pe >/dev/null || want+=(abyss)
command -v minimap2 >/dev/null || want+=(minimap2)
if [ ${#want[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${want[@]}" >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q "${want[@]}" >/dev/null; }
fi
venv=${TESSERA_VENV:-.venv}
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r python/requirements-test.txt
if [ "${PROFILE:-release}" = debug ]; then
  cargo build -q --locked -p tessera-cli
  export TESSERA_BIN=$PWD/target/debug/tessera
  VIRTUAL_ENV=$PWD/$venv "$venv/bin/maturin" develop -q --locked
else
  cargo build --release -q --locked -p tessera-cli
  export TESSERA_BIN=$PWD/target/release/tessera
  VIRTUAL_ENV=$PWD/$venv "$venv/bin/maturin" develop -q --release --locked
fi
exec "$venv/bin/python" scripts/bench_assembly.py "$@"
