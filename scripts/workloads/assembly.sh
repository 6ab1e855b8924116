#!/bin/sh
# Genome assembly on a Dask cluster spread over the hosts, for `tessera evaluate --every-host
# --workload "sh assembly.sh"`: every host runs it at once in the same directory, each through
# its own mount.
#
# 1. Host 0 starts a Dask scheduler on its own address and writes its address into
#    scheduler.json (on the mount, so every host reads it); every host starts one Dask worker
#    on its own address that joins it.
# 2. Host 0 simulates reads from a random genome of ASSEMBLY_LENGTH bases (default 20000),
#    waits until the scheduler has a worker from every host, assembles the reads with
#    `python -m tessera.assembly run --scheduler` (reads, shuffle and contigs on Tessera), and
#    checks the contigs are those of the single-process reference on the same reads and that
#    tasks ran on every host's worker. It then writes done (ok, or why not).
# 3. Every host waits for done (at most ASSEMBLY_TIMEOUT s, default 600), stops its worker,
#    and fails if the assembly did.
#
# PYTHON is the interpreter with tessera and distributed (default python3); ASSEMBLY_THREADS
# the threads of each worker (default 2). Without tessera evaluate: TESSERA_HOST (default 0),
# TESSERA_HOSTS (default 1), TESSERA_DIR (default the working directory); the files are then
# plain local paths, so the hosts must share that directory.
set -eu

host=${TESSERA_HOST:-0}
hosts=${TESSERA_HOSTS:-1}
dir=${TESSERA_DIR:-$PWD}
py=${PYTHON:-python3}
timeout=${ASSEMBLY_TIMEOUT:-600}
length=${ASSEMBLY_LENGTH:-20000}
threads=${ASSEMBLY_THREADS:-2}
say() { echo "assembly: host $host: $*" >&2; }
deadline=$(($(date +%s) + timeout))

# This host's address: an emulated host's only interface is its link to the others.
addr=$(ip -4 -o addr show scope global 2>/dev/null | awk '{ split($4, a, "/"); print a[1]; exit }')
[ -n "$addr" ] || addr=127.0.0.1
# A file of the run directory as the workers open it: through Tessera itself, not a mount.
url() {
    if [ -n "${TESSERA_MOUNT:-}" ]; then echo "tessera://${1#"$TESSERA_MOUNT"/}"; else echo "$1"; fi
}

pids=""
stop() {
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    for p in $pids; do wait "$p" 2>/dev/null || true; done
}
trap stop EXIT
trap 'exit 1' INT TERM

sched="$dir/scheduler.json"
mkdir -p "$dir/logs"
if [ "$host" -eq 0 ]; then
    "$py" -m distributed.cli.dask_scheduler --host "$addr" --port 0 --dashboard-address :0 \
        --scheduler-file "$sched" >"$dir/logs/scheduler.log" 2>&1 &
    pids="$pids $!"
fi
# The worker reads the scheduler's address from the file, waiting for it to be written.
"$py" -m distributed.cli.dask_worker --scheduler-file "$sched" --host "$addr" --nworkers 1 \
    --nthreads "$threads" --no-dashboard --death-timeout "$timeout" \
    >"$dir/logs/worker-h$host.log" 2>&1 &
pids="$pids $!"

if [ "$host" -ne 0 ]; then
    while [ ! -e "$dir/done" ]; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            say "no result from host 0 within ${timeout}s"
            exit 1
        fi
        sleep 0.2
    done
    result=$(cat "$dir/done")
    [ "$result" = ok ] || { say "host 0: $result"; exit 1; }
    exit 0
fi

finish() { echo "$1" >"$dir/done.tmp" && mv "$dir/done.tmp" "$dir/done"; }
fail() {
    say "$1"
    tail -n 30 "$dir"/logs/*.log >&2 || true
    finish "$1"
    exit 1
}

# Reads with errors, so that the supersteps have tips and bubbles to remove.
"$py" -m tessera.assembly simulate --length "$length" --coverage 20 --error-rate 0.003 \
    --seed 7 --genome "$dir/genome.fa" --reads "$dir/reads.fq" || fail "simulate failed"
set -- -k 21 --min-count 1 --parts 4 --seed 3 --rounds 2

# Every host's worker, then the scheduler's address; the task stream is recorded from here.
scheduler=$("$py" - "$sched" "$hosts" "$((deadline - $(date +%s)))" <<'EOF'
import sys
import time

from distributed import Client

sched, hosts, left = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
end = time.monotonic() + left
client = Client(scheduler_file=sched, timeout=left)
client.wait_for_workers(hosts, timeout=max(1.0, end - time.monotonic()))
where = {w.rsplit(":", 1)[0] for w in client.scheduler_info()["workers"]}
if len(where) != hosts:
    sys.exit(f"{hosts} workers but on {len(where)} addresses: {sorted(where)}")
client.get_task_stream()  # starts the scheduler's record of tasks
print(client.scheduler.address)
client.close()
EOF
) || fail "the workers did not all join within ${timeout}s (logs in $dir/logs)"
say "scheduler $scheduler, $hosts workers"

"$py" -m tessera.assembly run "$(url "$dir/reads.fq")" --work "$(url "$dir/asm")" \
    --scheduler "$scheduler" --block-size 65536 --no-progress --json "$dir/report.json" "$@" \
    || fail "the assembly failed"
"$py" -m tessera.assembly reference "$dir/reads.fq" -o "$dir/reference.fa" "$@" \
    || fail "the reference failed"
cmp -s "$dir/asm/contigs.fa" "$dir/reference.fa" \
    || fail "the contigs differ from the reference's ($dir/asm/contigs.fa, $dir/reference.fa)"
[ -s "$dir/reference.fa" ] || fail "no contigs"

# Which workers ran the assembly's tasks: every host's.
ran=$("$py" - "$sched" <<'EOF'
import collections
import sys

from distributed import Client

client = Client(scheduler_file=sys.argv[1], timeout=60)
tasks = collections.Counter(t["worker"] for t in client.get_task_stream())
print(" ".join(f"{w}={n}" for w, n in sorted(tasks.items())))
client.close()
EOF
) || fail "could not read the task stream"
say "tasks by worker: $ran"
[ "$(echo "$ran" | wc -w)" -eq "$hosts" ] || fail "tasks ran on $ran, not on all $hosts hosts"
finish ok
