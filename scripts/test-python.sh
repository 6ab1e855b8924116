#!/usr/bin/env bash
# The Python package's tests (issue #6): builds the extension into a virtualenv, type-checks
# the package (mypy --strict), and runs pytest against real local clusters started with
# `tessera up` (and a FUSE mount when run as root with /dev/fuse).
# Usage: scripts/test-python.sh [pytest args...]
# Environment: PYTHON (interpreter for a new venv, default python3), TESSERA_VENV (default
# .venv), TESSERA_BIN (the tessera binary; default: built here, target/debug/tessera).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${TESSERA_VENV:-.venv}
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r python/requirements-test.txt
if [ -z "${TESSERA_BIN:-}" ]; then
  cargo build -q --locked -p tessera-cli
  export TESSERA_BIN=$PWD/target/debug/tessera
fi
# The extension, built with the workspace's dev profile into the venv (editable). A plain
# `pip install .` builds the same package as a release wheel.
VIRTUAL_ENV=$PWD/$venv "$venv/bin/maturin" develop -q --locked
"$venv/bin/mypy" python/tessera
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
