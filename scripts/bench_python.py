"""Python-side benchmark (issue #6), run by scripts/bench-python.sh.

One `tessera up` cluster (4 servers); in the same run and on the same memory:
  * `tessera bench` (the Rust client: sequential write/read of one file, 1 MiB requests;
    creates/stats/unlinks of empty files from 8 tasks);
  * Python through tessera.Client: sequential write and read of one file, 1 MiB requests
    (`f.write(buf)`, one copy into the client's stripe buffers; `f.read(1 MiB)`, which returns
    the `bytes` object the stripe was received into from the socket);
    10 000 small files written and read one at a time (`pipe`, `cat`) and in one batch call
    (`pipe_many`, `cat_many`, 32 in flight);
  * the same Python loops against local tmpfs (/dev/shm) with the built-in `open`.
Rounds alternate Rust and Python so both see warm, reused server memory; the first round
only warms up. Prints each round, the median Python/Rust ratios over the rounds, and writes
JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

from tessera import LocalCluster

GB = 1e9
MIB = 1 << 20


def timed(f: Callable[[], Any]) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def python_large(open_: Callable[[str, str], Any], path: str, size: int) -> Dict[str, float]:
    buf = os.urandom(MIB)

    def write() -> None:
        with open_(path, "wb") as f:
            for _ in range(size // MIB):
                f.write(buf)

    def read() -> None:
        n = 0
        with open_(path, "rb") as f:
            while True:
                b = f.read(MIB)
                if not b:
                    break
                n += len(b)
        assert n == size, n

    w = timed(write)
    r = timed(read)
    return {"write_gbps": size / w / GB, "read_gbps": size / r / GB}


def python_small_tessera(c: Any, root: str, n: int, each: int) -> Dict[str, float]:
    data = os.urandom(each)
    c.mkdir(f"{root}/one")
    c.mkdir(f"{root}/batch")
    one = [f"{root}/one/f{i}" for i in range(n)]
    batch = [f"{root}/batch/f{i}" for i in range(n)]
    w1 = timed(lambda: [c.pipe(p, data) for p in one])
    r1 = timed(lambda: [c.cat(p) for p in one])
    wb = timed(lambda: c.pipe_many([(p, data) for p in batch]))
    rb = timed(lambda: c.cat_many(batch))
    assert all(b == data for b in c.cat_many(batch[:10]))
    c.rm(f"{root}/one", recursive=True)
    c.rm(f"{root}/batch", recursive=True)
    return {
        "small_write_per_s": n / w1,
        "small_read_per_s": n / r1,
        "small_write_batch_per_s": n / wb,
        "small_read_batch_per_s": n / rb,
    }


def python_small_local(root: str, n: int, each: int) -> Dict[str, float]:
    data = os.urandom(each)
    os.makedirs(root, exist_ok=True)
    paths = [f"{root}/f{i}" for i in range(n)]

    def write() -> None:
        for p in paths:
            with open(p, "wb") as f:
                f.write(data)

    def read() -> None:
        for p in paths:
            with open(p, "rb") as f:
                f.read()

    w = timed(write)
    r = timed(read)
    shutil.rmtree(root)
    return {"small_write_per_s": n / w, "small_read_per_s": n / r}


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 2 << 30
    files = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    each = 4096
    rounds = int(os.environ.get("ROUNDS", "3"))
    out_path = os.environ.get("OUT_JSON", "bench-python.json")
    servers = 4
    memory = os.environ.get("SERVER_MEMORY", "1536MiB")
    results: Dict[str, Any] = {"size": size, "files": files, "file_bytes": each, "rounds": []}
    shm = tempfile.mkdtemp(prefix="tessera-bench-", dir="/dev/shm")
    with LocalCluster(servers=servers, memory=memory) as cl:
        c = cl.client()
        env = {**os.environ, **cl.env}

        def rust() -> Dict[str, float]:
            with tempfile.NamedTemporaryFile(suffix=".json") as j:
                subprocess.run(
                    [str(cl.binary), "bench", "--size", str(size), "--files", str(files),
                     "--json", j.name],
                    env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
                r: Dict[str, float] = json.load(open(j.name))
                return r

        rust()  # warm-up: server memory touched once
        python_large(c.open, "/warm", size)
        c.rm("/warm")
        for k in range(rounds):
            rnd: Dict[str, Any] = {"rust": rust()}
            c.mkdir("/pybench")
            rnd["python"] = python_large(c.open, "/pybench/seq", size)
            c.rm("/pybench/seq")
            rnd["python"].update(python_small_tessera(c, "/pybench", files, each))
            c.rm("/pybench", recursive=True)
            rnd["tmpfs"] = python_large(open, f"{shm}/seq", size)
            os.remove(f"{shm}/seq")
            rnd["tmpfs"].update(python_small_local(f"{shm}/small", files, each))
            results["rounds"].append(rnd)
            r, p, t = rnd["rust"], rnd["python"], rnd["tmpfs"]
            print(f"round {k + 1}:")
            print(f"  loopback TCP (tessera bench)   {r['loopback_tcp_gbps']:6.2f} GB/s")
            for what in ("write", "read"):
                print(
                    f"  {what:5} {size >> 20} MiB: rust {r[what + '_gbps']:5.2f} GB/s  "
                    f"python {p[what + '_gbps']:5.2f} GB/s "
                    f"({100 * p[what + '_gbps'] / r[what + '_gbps']:3.0f} % of rust)  "
                    f"tmpfs {t[what + '_gbps']:5.2f} GB/s"
                )
            print(
                f"  {files} x {each} B files/s: python write {p['small_write_per_s']:7.0f} "
                f"(batch {p['small_write_batch_per_s']:7.0f}), read {p['small_read_per_s']:7.0f} "
                f"(batch {p['small_read_batch_per_s']:7.0f}); tmpfs write "
                f"{t['small_write_per_s']:7.0f}, read {t['small_read_per_s']:7.0f}; rust creates "
                f"(empty, 8 tasks) {r['creates_per_s']:7.0f}, stats {r['stats_per_s']:7.0f}"
            )
            sys.stdout.flush()
    shutil.rmtree(shm, ignore_errors=True)
    medians = {}
    for what in ("write", "read"):
        key = what + "_gbps"
        ratios = [r["python"][key] / r["rust"][key] for r in results["rounds"]]
        medians[what] = statistics.median(ratios)
        print(f"median over {len(ratios)} rounds: python {what} {100 * medians[what]:3.0f} % of rust")
    results["median_python_over_rust"] = medians
    with open(out_path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"results: {out_path}")


if __name__ == "__main__":
    main()
