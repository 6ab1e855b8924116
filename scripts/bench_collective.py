"""Collective output benchmark driver (run by scripts/bench-collective.sh): N writer processes
each emit 100-byte SAM-like records keyed by position into one output, four ways:

- naive N-to-1: every process appends each record to one file through the mount
  (`O_APPEND`, one `write` per record); the file is interleaved, not sorted;
- N files + `sort -m`: every process sorts its own records and writes its own file through
  the mount, then `sort -m -s -k4,4n` merges them into one file through the mount (the merge is
  the aggregation);
- collective: N `tessera collect --key 4n` processes fed the records on standard input (the
  library; aggregation = from every writer's marker in to the output in place, as the writers
  report it), with one coordinator and with two;
- for reference, N-to-N unsorted: every process writes its own file through the mount,
  `tessera cp -j N` of the N files (the library, one process), and N `tessera cp` processes
  of a file each (the library, started as the collective's writers are); and the collective without keys (each
  writer writes its own part at its offset, no merge), with the default threshold (16 MiB:
  runs spilled and copied), with one above a writer's records (no run), and in arrival order
  (each 16 MiB buffer written once, at once, at a reservation at the output's end);
- fixed-size records placed by key (`tessera collect --record-size 100 --key-range 0:R`, R the
  records in all): writer r owns a block of consecutive keys, given in a random order
  ("blocks"), or every key k with k % N == r ("interleaved"); the output must be the records in
  key order (checked).

The sorted outputs of `sort -m` and of the collective must be identical (checked). Each timed
phase starts after a `sync` and a second's pause (what the phase before left in the background
otherwise lands on the next: half a second on the first collective). Times start
when the processes are ready (records in memory) for the mount runs; the `tessera` runs include
starting the processes and connecting. Every figure is the median of ROUNDS rounds (default
3). Prints a Markdown table; VERBOSE=1 also prints each collective's writers' times; WAYS (a
comma-separated subset of naive, files, sorted, unsorted, fixed, nton; default all) runs only
those ways.

Usage: python3 scripts/bench_collective.py TESSERA MOUNT TOTAL_BYTES WRITERS[,WRITERS...]
"""

from __future__ import annotations

import filecmp
import json
import multiprocessing as mp
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

RECORD = 100
ALL_WAYS = ("naive", "files", "sorted", "unsorted", "fixed", "nton")
WAYS = set(os.environ.get("WAYS", ",".join(ALL_WAYS)).split(","))


def records(rank: int, n: int) -> List[bytes]:
    """`n` SAM-like lines of exactly 100 bytes, positions at random (ties happen)."""
    rng = random.Random(rank)
    out = []
    for i in range(n):
        pos = rng.randrange(1, 50_000_000)
        head = f"r{rank}.{i}\t0\tchr1\t{pos}\t60\t36M\t*\t0\t0\t"
        out.append((head + "ACGT" * 20)[: RECORD - 1].encode() + b"\n")
    return out


def keyed(k: int) -> bytes:
    """The 100-byte fixed-size record of key `k` (the key its first field)."""
    head = f"{k:>9}\tr{k}\t0\tchr1\t{k * 7}\t60\t36M\t*\t0\t0\t"
    return (head + "ACGT" * 20)[: RECORD - 1].encode() + b"\n"


def fixed_keys(rank: int, n: int, per: int, interleaved: bool) -> List[int]:
    """The keys writer `rank` of `n` gives, `per` of them."""
    if interleaved:
        return list(range(rank, n * per, n))
    keys = list(range(rank * per, (rank + 1) * per))
    random.Random(rank).shuffle(keys)
    return keys


def position(line: bytes) -> int:
    return int(line.split(b"\t", 4)[3])


def in_processes(n: int, prepare: Callable[[int], Callable[[], None]]) -> float:
    """In `n` processes, `prepare(rank)` gives the work, which all start together once every
    one is ready; seconds the work took."""
    ready, go = mp.Barrier(n + 1), mp.Event()

    def run(rank: int) -> None:
        work = prepare(rank)
        ready.wait()
        go.wait()
        work()

    procs = [mp.Process(target=run, args=(r,)) for r in range(n)]
    for p in procs:
        p.start()
    ready.wait()
    t = time.perf_counter()
    go.set()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a writer failed ({p.exitcode})")
    return time.perf_counter() - t


def settle() -> None:
    """Lets what the last phase left in the background (the mount's and the servers' work on
    what it wrote) finish before the next is timed."""
    os.sync()
    time.sleep(1)


def measure(
    tessera: str, mnt: str, local: str, env: Dict[str, str], n: int, per: int, size: int
) -> Dict[str, float]:
    """One round of every way with `n` writers of `per` records each; seconds each took."""
    res: Dict[str, float] = {}

    def naive(rank: int) -> Callable[[], None]:
        lines = records(rank, per)

        def go() -> None:
            fd = os.open(f"{mnt}/naive.sam", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            for line in lines:
                os.write(fd, line)
            os.close(fd)

        return go

    if "naive" in WAYS:
        res["naive N-to-1 (mount) s"] = in_processes(n, naive)
        assert os.path.getsize(f"{mnt}/naive.sam") == size

    def own_file(sort: bool, name: str) -> Callable[[int], Callable[[], None]]:
        def make(rank: int) -> Callable[[], None]:
            lines = records(rank, per)

            def go() -> None:
                out = sorted(lines, key=position) if sort else lines
                with open(f"{mnt}/{name}{rank}.sam", "wb", buffering=1 << 20) as f:
                    f.write(b"".join(out))

            return go

        return make

    if WAYS & {"files", "sorted"}:
        settle()
        write = in_processes(n, own_file(True, "part"))
        t = time.perf_counter()
        parts = [f"{mnt}/part{r}.sam" for r in range(n)]
        subprocess.run(
            ["sort", "-m", "-s", "-t", "\t", "-k4,4n", "-o", f"{mnt}/merged.sam", *parts],
            check=True, env={**env, "LC_ALL": "C"},
        )
        merge = time.perf_counter() - t
        res["N files + sort -m (mount) s"] = write + merge
        res["sort -m alone s"] = merge

    def collect(name: str, args: List[str], inputs: str = "w") -> Tuple[float, float]:
        settle()
        t = time.perf_counter()
        procs = []
        for r in range(n):
            with open(f"{local}/{inputs}{r}.sam", "rb") as stdin:
                procs.append(subprocess.Popen(
                    [tessera, "collect", f"/bench/{name}", "--writers", str(n),
                     "--rank", str(r), "--json", *args],
                    stdin=stdin, stdout=subprocess.PIPE, env=env,
                ))
        outs = [json.loads(p.communicate()[0]) for p in procs]
        took = time.perf_counter() - t
        if os.environ.get("VERBOSE"):
            phases = [(o["waited_secs"], o["aggregation_secs"]) for o in outs]
            print(f"{name}: {took:.3f} s; (waited, aggregation) s: {phases}", file=sys.stderr)
        if any(p.returncode for p in procs):
            raise RuntimeError(f"tessera collect {name} failed")
        assert all(o["size"] == size for o in outs), outs
        return took, max(o["aggregation_secs"] for o in outs)

    if "sorted" in WAYS:
        took, agg = collect("coll1.sam", ["--key", "4n"])
        res["collective, 1 coordinator s"] = took
        res["collective, 1 coordinator: aggregation s"] = agg
        took, agg = collect("coll2.sam", ["--key", "4n", "--coordinators-per-node", "2"])
        res["collective, 2 coordinators s"] = took
        res["collective, 2 coordinators: aggregation s"] = agg
        for name in ("coll1.sam", "coll2.sam"):
            if not filecmp.cmp(f"{mnt}/merged.sam", f"{mnt}/bench/{name}", shallow=False):
                raise RuntimeError(f"{name} differs from sort -m's output")
    if "unsorted" in WAYS:
        took, agg = collect("plain.sam", [])
        res["collective unsorted s"] = took
        res["collective unsorted: aggregation s"] = agg
        took, agg = collect("plain1.sam", ["--threshold", "1GiB"])
        res["collective unsorted, no run s"] = took
        res["collective unsorted, no run: aggregation s"] = agg
        took, agg = collect("arrival.sam", ["--order", "arrival"])
        res["collective unsorted, arrival order s"] = took
        res["collective unsorted, arrival order: aggregation s"] = agg
    fixed = ["--record-size", str(RECORD), "--key-range", f"0:{n * per}"]
    for kind in ("blocks", "interleaved") if "fixed" in WAYS else ():
        took, agg = collect(f"fixed-{kind}.bin", fixed, inputs=kind)
        res[f"collective fixed-size, {kind} s"] = took
        res[f"collective fixed-size, {kind}: aggregation s"] = agg
        if not filecmp.cmp(f"{local}/keyed.bin", f"{mnt}/bench/fixed-{kind}.bin", shallow=False):
            raise RuntimeError(f"fixed-{kind}.bin is not the records in key order")

    if "nton" in WAYS:
        settle()
        res["N-to-N unsorted (mount) s"] = in_processes(n, own_file(False, "nn"))
        os.mkdir(f"{mnt}/cp")
        settle()
        t = time.perf_counter()
        subprocess.run(
            [tessera, "cp", "-j", str(n), *[f"{local}/w{r}.sam" for r in range(n)],
             "tessera:/cp/"],
            check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        res["N-to-N unsorted (library, cp -j N) s"] = time.perf_counter() - t
        # Started as the collective's writers are: N processes, each its own records.
        os.mkdir(f"{mnt}/cpn")
        settle()
        t = time.perf_counter()
        copies = [
            subprocess.Popen(
                [tessera, "cp", f"{local}/w{r}.sam", f"tessera:/cpn/w{r}.sam"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            for r in range(n)
        ]
        if any(c.wait() for c in copies):
            raise RuntimeError("a tessera cp failed")
        res["N-to-N unsorted (library, N tessera cp) s"] = time.perf_counter() - t

    for p in os.listdir(mnt):
        if p != "bench":
            path = f"{mnt}/{p}"
            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
    for p in os.listdir(f"{mnt}/bench"):
        os.unlink(f"{mnt}/bench/{p}")
    return res


def main() -> None:
    if not WAYS <= set(ALL_WAYS):
        sys.exit(f"WAYS: unknown {sorted(WAYS - set(ALL_WAYS))}; known: {', '.join(ALL_WAYS)}")
    tessera, mnt, total, writers = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    local = tempfile.mkdtemp(prefix="bench-collective-", dir="/dev/shm")
    env = dict(os.environ)
    rows: List[Tuple[str, Dict[str, float]]] = []
    os.makedirs(f"{mnt}/bench", exist_ok=True)
    try:
        for n in [int(x) for x in writers.split(",")]:
            per = total // RECORD // n
            size = per * RECORD * n
            for r in range(n):
                with open(f"{local}/w{r}.sam", "wb") as f:
                    f.write(b"".join(records(r, per)))
                for kind in ("blocks", "interleaved"):
                    with open(f"{local}/{kind}{r}.sam", "wb") as f:
                        keys = fixed_keys(r, n, per, kind == "interleaved")
                        f.write(b"".join(keyed(k) for k in keys))
            with open(f"{local}/keyed.bin", "wb") as f:
                f.write(b"".join(keyed(k) for k in range(n * per)))
            rounds = [
                measure(tessera, mnt, local, env, n, per, size)
                for _ in range(int(os.environ.get("ROUNDS", "3")))
            ]
            res: Dict[str, float] = {"writers": n, "MB": size / 1e6}
            for k in rounds[0]:
                res[k] = statistics.median(r[k] for r in rounds)
            for name in os.listdir(local):
                os.unlink(f"{local}/{name}")
            rows.append((str(n), res))
            print(json.dumps(res), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(local, ignore_errors=True)

    keys = [k for k in rows[0][1] if k.endswith(" s")]
    print("| measure | " + " | ".join(f"{n} writers" for n, _ in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for k in keys:
        cells = []
        for _, res in rows:
            secs = res[k]
            cells.append(f"{secs:.2f} s, {res['MB'] / secs:.0f} MB/s")
        print(f"| {k[:-2]} | " + " | ".join(cells) + " |")
    for name, base in [
        ("collective (1 coordinator) vs naive N-to-1", "naive N-to-1 (mount) s"),
        ("collective (1 coordinator) vs N files + sort -m", "N files + sort -m (mount) s"),
        ("collective (1 coordinator) vs N-to-N unsorted (mount)", "N-to-N unsorted (mount) s"),
    ]:
        if any(k not in rows[0][1] for k in (base, "collective, 1 coordinator s")):
            continue
        ratios = [res[base] / res["collective, 1 coordinator s"] for _, res in rows]
        print(f"| speed-up: {name} | " + " | ".join(f"{r:.2f}x" for r in ratios) + " |")
    for name, way in [
        ("collective unsorted", "collective unsorted s"),
        ("collective unsorted, no run", "collective unsorted, no run s"),
        ("collective unsorted, arrival order", "collective unsorted, arrival order s"),
        ("fixed-size, blocks", "collective fixed-size, blocks s"),
        ("fixed-size, interleaved", "collective fixed-size, interleaved s"),
    ]:
        base = "N-to-N unsorted (library, N tessera cp) s"
        if base not in rows[0][1] or way not in rows[0][1]:
            continue
        ratios = [res[base] / res[way] for _, res in rows]
        name = f"{name} vs N-to-N unsorted (library)"
        print(f"| speed-up: {name} | " + " | ".join(f"{r:.2f}x" for r in ratios) + " |")


if __name__ == "__main__":
    mp.set_start_method("fork")
    main()
