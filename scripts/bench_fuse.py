"""FUSE benchmark driver (run by scripts/bench-fuse.sh): fio sequential 1 MiB write and read
(into fio's own buffer, and into a page-aligned one), random 4 KiB reads, `dd` writing,
reading and re-reading the same size, reading back through a read-write handle, and a
metadata test (creates, stats, listings, probes of absent names, unlinks, saves: a small file
written and renamed over its target, and small outputs: 100 bytes written to a new file, then
removed; per second from 1 and 4 processes) on each directory given, printed as a table with
the last directory's ratios to the others; with the fio phase, loopback TCP's bandwidth (1 and
4 streams) in every round, and the last directory's ratios to it. A directory whose file system
fails a measure (an error, or no answer in STEP_TIMEOUT) is measured no further and shows as
failed, with the reason; so does one given as --failed NAME=REASON (a file system that did not
start).

Usage: python3 scripts/bench_fuse.py SIZE (NAME=DIR | --failed NAME=REASON) ...
Environment: PHASES (default "io,meta"): "meta" alone skips fio; ROUNDS (default 3): each
measure is the median of this many rounds, a round going through every directory in turn.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import socket
import statistics
import multiprocessing as mp
from multiprocessing import Pool, Process, Queue

META_FILES = 20000
# One save per this many files of the metadata test.
SAVES_PER = 4
# Seconds one step (a fio job, a dd, a metadata test) may take before its target counts as failed.
STEP_TIMEOUT = 1800


def fio(directory: str, rw: str, bs: str, size: str, extra: list[str]) -> dict[str, float]:
    cmd = [
        "fio", f"--name={rw}", f"--directory={directory}", "--filename=fio.dat", f"--rw={rw}",
        f"--bs={bs}", f"--size={size}", "--ioengine=psync", "--output-format=json", *extra,
    ]
    out = subprocess.run(
        cmd, check=True, capture_output=True, text=True, timeout=STEP_TIMEOUT
    ).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["write"] if rw == "write" else job["read"]
    return {"GB/s": side["bw_bytes"] / 1e9, "IOPS": side["iops"]}


def dd(directory: str, size: str) -> dict[str, float]:
    """GB/s of `dd` in 1 MiB blocks as programs do it: writing SIZE (a write-only open; fio's
    jobs open read-write), reading it, and reading it again (a second open: a mount may keep
    the pages of a file nobody changed)."""
    mib = int(size.rstrip("G")) * 1024 if size.endswith("G") else int(size.rstrip("M"))
    path = os.path.join(directory, "dd.dat")
    steps = {
        "dd write-only GB/s": ["if=/dev/zero", f"of={path}", "conv=fsync"],
        "dd read GB/s": [f"if={path}", "of=/dev/null"],
        "dd re-read GB/s": [f"if={path}", "of=/dev/null"],
    }
    out = {}
    for name, args in steps.items():
        t = time.perf_counter()
        subprocess.run(
            ["dd", "bs=1M", f"count={mib}", *args],
            check=True, capture_output=True, text=True, timeout=STEP_TIMEOUT,
        )
        out[name] = mib * (1 << 20) / (time.perf_counter() - t) / 1e9
    os.unlink(path)
    return out


def read_back(directory: str, mib: int = 64) -> dict[str, float]:
    """Reading back through the read-write handle that wrote the file, as temporary files,
    HDF5 and SQLite do: MIB written to a `w+b` file, then read in 8 KiB calls and at 2000
    random 4 KiB offsets (Python buffers reads by st_blksize)."""
    path = os.path.join(directory, "rw.dat")
    size = mib << 20
    with open(path, "w+b") as f:
        f.write(os.urandom(1 << 20) * mib)
        f.flush()
        f.seek(0)
        t = time.perf_counter()
        while f.read(8192):
            pass
        seq = size / (time.perf_counter() - t) / 1e9
        n = 2000
        t = time.perf_counter()
        for i in range(n):
            f.seek((i * 7919 * 4096) % size)
            f.read(4096)
        rand = n / (time.perf_counter() - t)
    os.unlink(path)
    return {"rw read-back GB/s": seq, "rw random 4K reads/s": rand}


def _meta_worker(args: tuple[str, int, int]) -> tuple[float, ...]:
    directory, worker, n = args
    d = os.path.join(directory, f"meta{worker}")
    os.makedirs(d, exist_ok=True)
    names = [os.path.join(d, f"f{i}") for i in range(n)]
    t0 = time.perf_counter()
    for p in names:
        os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
    t1 = time.perf_counter()
    for p in names:
        os.stat(p)
    t2 = time.perf_counter()
    # `ls -l`: a listing with every entry's attributes (readdirplus where the kernel uses it).
    listed = sum(1 for e in os.scandir(d) if e.stat(follow_symlinks=False).st_size == 0)
    assert listed == n, listed
    t3 = time.perf_counter()
    # Probes: a stat of a name that does not exist, each asked twice, as searches along PATH
    # or sys.path repeat (every Python start looks for the same absent modules).
    for _ in range(2):
        for p in names:
            os.path.exists(p + ".missing")
    t4 = time.perf_counter()
    for p in names:
        os.unlink(p)
    t5 = time.perf_counter()
    # Saves: a small temporary file written and renamed over the target, as editors and tools
    # replace a file atomically.
    target = os.path.join(d, "target")
    for i in range(n // SAVES_PER):
        tmp = os.path.join(d, f"t{i}")
        with open(tmp, "wb") as f:
            f.write(b"x" * 100)
        os.replace(tmp, target)
    t6 = time.perf_counter()
    os.unlink(target)
    # Small outputs: 100 bytes written to a new file and closed, as many tasks write their
    # results; then removed (unlinks of files with data).
    outputs = [os.path.join(d, f"o{i}") for i in range(n // SAVES_PER)]
    t7 = time.perf_counter()
    for p in outputs:
        fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        os.write(fd, b"y" * 100)
        os.close(fd)
    t8 = time.perf_counter()
    for p in outputs:
        os.unlink(p)
    t9 = time.perf_counter()
    os.rmdir(d)
    return (
        t1 - t0,
        t2 - t1,
        t5 - t4,
        t3 - t2,
        (t4 - t3) / 2,
        (t6 - t5) * SAVES_PER,
        (t8 - t7) * SAVES_PER,
        (t9 - t8) * SAVES_PER,
    )


def meta(directory: str, procs: int) -> dict[str, float]:
    n = META_FILES // procs
    with Pool(procs) as pool:
        times = pool.map_async(_meta_worker, [(directory, w, n) for w in range(procs)]).get(
            STEP_TIMEOUT
        )
    # Every phase ends when its slowest process does: files per second of the whole phase.
    total = n * procs
    return {
        "creates/s": total / max(t[0] for t in times),
        "stats/s": total / max(t[1] for t in times),
        "unlinks/s": total / max(t[2] for t in times),
        "listed/s": total / max(t[3] for t in times),
        "probes/s": total / max(t[4] for t in times),
        "saves/s": total / max(t[5] for t in times),
        "small writes/s": total / max(t[6] for t in times),
        "small removes/s": total / max(t[7] for t in times),
    }


def _echo(port_out: "Queue[int]") -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port_out.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while data := conn.recv(64):
        conn.sendall(data)


def tcp_round_trip_us(n: int = 20000) -> float:
    """The latency floor of any request: a 32-byte TCP ping-pong between two processes."""
    q: "Queue[int]" = Queue()
    echo = Process(target=_echo, args=(q,), daemon=True)
    echo.start()
    s = socket.create_connection(("127.0.0.1", q.get()))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t = time.perf_counter()
    for _ in range(n):
        s.sendall(b"x" * 32)
        s.recv(64)
    dt = time.perf_counter() - t
    s.close()
    echo.join(5)
    return dt / n * 1e6


def _sink(port_out: "Queue[int]", streams: int) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(streams)
    port_out.put(srv.getsockname()[1])
    conns = [srv.accept()[0] for _ in range(streams)]
    procs = [Process(target=_drain, args=(c,)) for c in conns]
    for p in procs:
        p.start()
    for p in procs:
        p.join()


def _drain(conn: socket.socket) -> None:
    buf = memoryview(bytearray(1 << 20))
    while conn.recv_into(buf):
        pass


def _pour(port: int, mib: int) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    block = os.urandom(1 << 20)
    for _ in range(mib):
        s.sendall(block)
    s.close()


def tcp_stream_gbps(streams: int, mib: int = 4096) -> float:
    """The ceiling of any networked file system's data path: MIB MiB sent over loopback TCP in
    1 MiB writes, split over STREAMS connections, each end its own process (iperf3's measure,
    with Tessera's stripe size)."""
    q: "Queue[int]" = Queue()
    sink = Process(target=_sink, args=(q, streams))
    sink.start()
    port = q.get()
    pourers = [Process(target=_pour, args=(port, mib // streams)) for _ in range(streams)]
    t = time.perf_counter()
    for p in pourers:
        p.start()
    for p in pourers:
        p.join()
    sink.join()
    return mib * (1 << 20) / (time.perf_counter() - t) / 1e9


def run_once(directory: str, size: str, phases: list[str]) -> dict[str, float]:
    r: dict[str, float] = {}
    if "io" in phases:
        r["write GB/s"] = fio(directory, "write", "1M", size, ["--end_fsync=1"])["GB/s"]
        # fio drops the file's cached pages first (invalidate=1): this reads the cluster.
        r["read GB/s"] = fio(directory, "read", "1M", size, [])["GB/s"]
        # fio's buffer sits 16 bytes into a page (malloc). Copying from a page-cache page to
        # an address a few bytes further into its page runs 3-4x slower on the development
        # VM's CPU than to an aligned one (BENCHMARKS.md), so every page-cache read above pays
        # that in its last copy. dd, cp and cat read into page-aligned buffers: so does this.
        r["read, aligned buffer GB/s"] = fio(
            directory, "read", "1M", size, ["--iomem_align=4k"]
        )["GB/s"]
        r["4K randread IOPS"] = fio(
            directory, "randread", "4k", size, ["--runtime=15", "--time_based"]
        )["IOPS"]
        os.unlink(os.path.join(directory, "fio.dat"))
        r.update(dd(directory, size))
        r.update(read_back(directory))
    for procs in (1, 4) if "meta" in phases else ():
        for k, v in meta(directory, procs).items():
            r[f"{k} ({procs}p)"] = v
    return r


def failure(e: Exception) -> str:
    """A failed step as one line: the command and the last line it printed, or the error."""
    if isinstance(e, subprocess.CalledProcessError):
        lines = (e.stderr or e.stdout or "").strip().splitlines()
        return f"{e.cmd[0]} exited with {e.returncode}: {lines[-1] if lines else 'no output'}"
    if isinstance(e, subprocess.TimeoutExpired):
        return f"{e.cmd[0]} did not finish in {e.timeout:.0f} s"
    if isinstance(e, mp.TimeoutError):
        return f"the metadata test did not finish in {STEP_TIMEOUT} s"
    return f"{type(e).__name__}: {e}"


def parse_targets(args: list[str]) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """(name, directory) in order, and the reasons of those given as --failed."""
    targets: list[tuple[str, str]] = []
    failed: dict[str, str] = {}
    it = iter(args)
    for a in it:
        if a == "--failed":
            name, reason = next(it).split("=", 1)
            failed[name] = f"did not start: {reason}"
            targets.append((name, ""))
        else:
            name, directory = a.split("=", 1)
            targets.append((name, directory))
    return targets, failed


def main() -> None:
    print(f"TCP round trip between two processes: {tcp_round_trip_us():.1f} us", flush=True)
    size = sys.argv[1]
    phases = os.environ.get("PHASES", "io,meta").split(",")
    rounds = int(os.environ.get("ROUNDS", "3"))
    targets, failed = parse_targets(sys.argv[2:])
    # Rounds go through every target in turn, so a swing of this VM's speed (its memory and
    # wake-ups vary by minutes) lands on all of them rather than on one.
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in targets}
    # Every byte Tessera reads or writes crosses loopback TCP once, to or from 4 servers: that
    # ceiling is measured in every round too.
    tcp_runs: list[dict[str, float]] = []
    for i in range(rounds):
        if "io" in phases:
            tcp_runs.append({"1 stream": tcp_stream_gbps(1), "4 streams": tcp_stream_gbps(4)})
            print(f"round {i + 1} loopback TCP GB/s: " + ", ".join(
                f"{k} {v:.2f}" for k, v in tcp_runs[-1].items()), flush=True)
        for name, d in targets:
            if name in failed:
                continue
            try:
                r = run_once(d, size, phases)
            # Whatever a file system under test does wrong fails that one target, not the run.
            except Exception as e:  # noqa: BLE001
                failed[name] = f"round {i + 1}: {failure(e)}"
                print(f"round {i + 1} {name}: failed: {failure(e)}", flush=True)
                continue
            runs[name].append(r)
            print(f"round {i + 1} {name}: " + ", ".join(f"{k} {v:,.2f}" for k, v in r.items()), flush=True)
    results = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        for name, rs in runs.items()
        if name not in failed
    }
    names = [n for n, _ in targets]
    last = names[-1]
    print()
    print_table(names, results, runs, failed, rounds)
    tcp = {k: statistics.median(r[k] for r in tcp_runs) for k in tcp_runs[0]} if tcp_runs else {}
    if tcp:
        gbps = ", ".join(f"{k} {v:.2f}" for k, v in tcp.items())
        print(f"loopback TCP, 1 MiB writes (GB/s): {gbps}")
        moved = ("write GB/s", "read GB/s", "read, aligned buffer GB/s")
        if last in results:
            print(f"{last} / loopback TCP, 4 streams: " + ", ".join(
                f"{k} {results[last][k] / tcp['4 streams']:.0%}" for k in moved
            ))
    with open(os.environ.get("OUT", "/tmp/bench-fuse.json"), "w") as f:
        json.dump(
            {"medians": results, "runs": runs, "failed": failed, "loopback TCP GB/s": tcp},
            f,
            indent=1,
        )


def print_table(
    names: list[str],
    results: dict[str, dict[str, float]],
    runs: dict[str, list[dict[str, float]]],
    failed: dict[str, str],
    rounds: int,
) -> None:
    """Medians per target, the last target's range in brackets, and its ratios to the others;
    a failed target's column says so (the reason in a first row)."""
    last = names[-1]
    measured = [n for n in names if n in results]
    if not measured:
        print("Every target failed: " + "; ".join(f"{n}: {r}" for n, r in failed.items()))
        return

    def ratio(k: str, n: str) -> str:
        if last not in results or n not in results or results[n][k] == 0:
            return "-"
        return f"{results[last][k] / results[n][k]:.0%}"

    def cell(k: str, n: str) -> str:
        if n not in results:
            return "failed"
        v = f"{results[n][k]:,.2f}"
        if n == last:
            spread = [r[k] for r in runs[last]]
            v += f" ({min(spread):,.2f}-{max(spread):,.2f})"
        return v

    print(f"Medians of {rounds} rounds (lowest-highest of {last} in brackets):")
    print("| measure | " + " | ".join(names) + " | " + " | ".join(f"{last}/{n}" for n in names[:-1]) + " |")
    print("|---" * (2 * len(names)) + "|")
    if failed:
        status = " | ".join(f"failed: {failed[n]}" if n in failed else "ok" for n in names)
        print(f"| status | {status} |" + " |" * (len(names) - 1))
    for k in results[measured[0]]:
        vals = " | ".join(cell(k, n) for n in names)
        ratios = " | ".join(ratio(k, n) for n in names[:-1])
        print(f"| {k} | {vals} | {ratios} |")


if __name__ == "__main__":
    main()
