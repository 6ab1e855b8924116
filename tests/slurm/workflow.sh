#!/usr/bin/env bash
# A small workflow on the mount, run by scripts/test-slurm.sh through sbatch and
# scripts/slurm/tessera-job.sh: inputs written on the mount, every task of the job (srun)
# checksums them there and writes its result next to them, the results are compared; then the
# cluster grows by one server within the allocation (--provision).
set -euo pipefail
m=$TESSERA_MOUNT
mkdir -p "$m/in" "$m/out"
for i in 1 2 3 4; do
  head -c $((i * 1048576 + 7)) /dev/urandom > "$TESSERA_JOB_DIR/part$i"
  cp "$TESSERA_JOB_DIR/part$i" "$m/in/"
done
(cd "$TESSERA_JOB_DIR" && sha256sum part*) > "$TESSERA_JOB_DIR/expected"
srun --overlap --ntasks="$SLURM_NTASKS" sh -c \
  'cd "$TESSERA_MOUNT/in" && sha256sum part* > "$TESSERA_MOUNT/out/sums.$SLURM_PROCID"'
for f in "$m"/out/sums.*; do cmp "$f" "$TESSERA_JOB_DIR/expected"; done
echo "workflow: $(ls "$m/out" | wc -l) tasks read the inputs back intact"

"$TESSERA_BIN" scale --add 1
live=$("$TESSERA_BIN" status --json |
  python3 -c 'import json, sys; print(sum(n["alive"] for n in json.load(sys.stdin)["nodes"]))')
[ "$live" = 2 ] || { echo "workflow: $live servers after scale --add 1" >&2; exit 1; }
(cd "$m/in" && sha256sum part*) | cmp - "$TESSERA_JOB_DIR/expected"
echo "workflow: grown to $live servers, inputs intact"
