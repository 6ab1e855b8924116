#!/usr/bin/env bash
# Runs SEEDS simulation seeds (default 2000) from START (default 0) in release and prints
# seeds/s and any failing seed with its replay command. Replay one seed with its schedule:
#   TESSERA_SIM_SEED=N cargo test --release -p tessera-sim --test seeds -- --nocapture
# TESSERA_SIM_MANAGER_RESTARTS=1 lets the nemesis restart the manager too.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${1:-2000}
START=${2:-0}
TESSERA_SIM_SEEDS=$SEEDS TESSERA_SIM_START=$START \
  cargo test --release -p tessera-sim --test seeds seeds_keep_every_invariant -- --nocapture 2>&1 |
  grep -E '^(FAILED|  |[0-9]+ seeds)|seeds/s|test result'
