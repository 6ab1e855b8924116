"""What tracing costs at the mount (issue 31), tracing off and on alternated in one run.

One cluster, `tessera up --servers 4 --mount M` (release build), and a second mount of it,
`tessera mount M2 --attr-cache 0 --lease 0`, so that every stat reaches the mount. Each round
runs the same workloads with tracing off and on (switched on both running mounts with `tessera
trace start/stop`), in the order off-on, then on-off, then off-on...:

- 1 MiB sequential write of SIZE (fio, psync, fsync at the end) and read (page cache dropped);
- 4 KiB random reads for 5 s (fio, O_DIRECT: each one reaches the mount);
- creates (open O_CREAT + close) of N files and stats of them, through M2.

Prints per workload the median with tracing off and on, on / off, the nanoseconds an operation
gained, the CPU time the mount processes spent per operation (all their threads, the trace
writer's included: on a shared machine a steadier measure of what tracing costs than the rate),
the trace bytes per record, and a JSON object (also written to OUT if set).
Usage: python3 scripts/bench_trace.py TESSERA_BIN [ROUNDS] [SIZE_MIB] [FILES]
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench_procs import children, drop_caches

WORKLOADS = ["write_1m", "read_1m", "randread_4k", "create", "stat"]


def fio(path: Path, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        ["fio", "--name=t", f"--filename={path}", "--ioengine=psync", "--output-format=json",
         *args],
        capture_output=True, check=True, timeout=600,
    )
    job: dict[str, Any] = json.loads(out.stdout)["jobs"][0]
    return job


def ops_per_s(side: dict[str, Any]) -> tuple[float, int]:
    """(operations per second, operations) of a fio job's read or write side."""
    return float(side["iops"]), int(side["total_ios"])


def creates(d: Path, files: int) -> tuple[float, int]:
    """Creates `files` empty files in `d` (open O_CREAT, close); (creates/s, creates)."""
    t = time.perf_counter()
    for i in range(files):
        os.close(os.open(d / f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644))
    return files / (time.perf_counter() - t), files


def stats(d: Path, files: int) -> tuple[float, int]:
    """Stats the files `creates` made; (stats/s, stats)."""
    t = time.perf_counter()
    for i in range(files):
        os.stat(d / f"f{i}")
    return files / (time.perf_counter() - t), files


def cpu_ns(pids: list[int]) -> int:
    """Nanoseconds on a CPU of every thread of these processes so far."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return total


def wait_for(what: str, within: float, cond: Callable[[], bool]) -> None:
    t = time.monotonic()
    while not cond():
        if time.monotonic() - t > within:
            raise SystemExit(f"{what}: not within {within} s")
        time.sleep(0.1)


def records(bin_: str, trace: Path) -> int:
    out = subprocess.run([bin_, "trace", "summary", str(trace)], capture_output=True,
                         text=True, check=True).stdout
    m = re.search(r"^  (\d+) records, (\d+) lost", out, re.M)
    assert m, out
    if int(m.group(2)):
        print(f"warning: {trace} lost {m.group(2)} records", file=sys.stderr)
    return int(m.group(1))


def main() -> None:
    bin_ = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    size_mib = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
    files = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
    home = Path(tempfile.mkdtemp(prefix="tessera-bench-trace."))
    mnt, mnt2, traces = home / "m", home / "m2", home / "traces"
    for d in (mnt, mnt2, traces):
        d.mkdir()
    env = {**os.environ, "TESSERA_HOME": str(home), "TESSERA_SECRET": "bench-trace"}
    log = open(home / "up.log", "wb")
    up = subprocess.Popen(
        [bin_, "--manager", "127.0.0.1:17470", "up", "--http", "127.0.0.1:17471",
         "--servers", "4", "--memory", f"{max(1, size_mib * 2 // 4 // 1024 + 1)}GiB",
         "--mount", str(mnt)],
        env=env, stdout=log, stderr=log,
    )
    second: subprocess.Popen[bytes] | None = None
    results: dict[str, dict[str, list[float]]] = {w: {"off": [], "on": []} for w in WORKLOADS}
    # Mount CPU nanoseconds per operation, per workload and mode.
    cpu: dict[str, dict[str, list[float]]] = {w: {"off": [], "on": []} for w in WORKLOADS}
    traced_ops = 0
    traced_records = 0
    traced_bytes = 0
    try:
        wait_for("the cluster", 60,
                 lambda: (home / "cluster.toml").exists() and os.path.ismount(mnt))
        second = subprocess.Popen(
            [bin_, "mount", str(mnt2), "--attr-cache", "0", "--lease", "0"],
            env=env, stdout=log, stderr=log,
        )
        wait_for("the second mount", 60, lambda: os.path.ismount(mnt2))
        mounts = [*children(up.pid, "mount"), second.pid]
        assert len(mounts) == 2, mounts
        seq = mnt / "seq"

        def timed(w: str, mode: str, run: Callable[[], tuple[float, int]]) -> int:
            before = cpu_ns(mounts)
            rate, n = run()
            results[w][mode].append(rate)
            cpu[w][mode].append((cpu_ns(mounts) - before) / max(1, n))
            return n

        for r in range(rounds):
            for mode in (["off", "on"] if r % 2 == 0 else ["on", "off"]):
                tdir = traces / f"{r}-{mode}"
                if mode == "on":
                    for m in (mnt, mnt2):
                        subprocess.run([bin_, "trace", "start", str(m), "--dir", str(tdir)],
                                       check=True)
                ops = timed("write_1m", mode, lambda: ops_per_s(fio(
                    seq, "--rw=write", "--bs=1M", f"--size={size_mib}M", "--end_fsync=1")["write"]))
                drop_caches()
                ops += timed("read_1m", mode, lambda: ops_per_s(fio(
                    seq, "--rw=read", "--bs=1M", f"--size={size_mib}M")["read"]))
                ops += timed("randread_4k", mode, lambda: ops_per_s(fio(
                    seq, "--rw=randread", "--bs=4k", "--direct=1", f"--size={size_mib}M",
                    "--runtime=5", "--time_based")["read"]))
                meta = mnt2 / f"meta-{r}-{mode}"
                meta.mkdir()
                ops += timed("create", mode, lambda: creates(meta, files))
                ops += timed("stat", mode, lambda: stats(meta, files))
                shutil.rmtree(meta)
                seq.unlink()
                if mode == "on":
                    for m in (mnt, mnt2):
                        subprocess.run([bin_, "trace", "stop", str(m)], check=True)
                    for t in tdir.glob("*.ttrace"):
                        traced_records += records(bin_, t)
                        traced_bytes += t.stat().st_size
                    traced_ops += ops
                print(f"round {r} {mode}: " + ", ".join(
                    f"{w} {results[w][mode][-1]:.0f}/s" for w in WORKLOADS), flush=True)
    finally:
        if second is not None:
            second.send_signal(signal.SIGINT)
            second.wait(timeout=60)
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
        log.close()
    summary: dict[str, Any] = {"rounds": rounds, "size_mib": size_mib, "files": files}
    print(f"\n{'workload':<12} {'off ops/s':>10} {'on ops/s':>10} {'on/off':>7} {'ns/op':>8}"
          f" {'cpu off':>8} {'cpu on':>8} {'+cpu':>7} {'+cpu %':>7}  (medians; ns; ranges)")
    for w in WORKLOADS:
        off, on = statistics.median(results[w]["off"]), statistics.median(results[w]["on"])
        added = (1 / on - 1 / off) * 1e9
        c_off, c_on = statistics.median(cpu[w]["off"]), statistics.median(cpu[w]["on"])
        # What the extra CPU is of an operation's time, with tracing off.
        share = (c_on - c_off) / (1e9 / off) * 100
        summary[w] = {"off": off, "on": on, "ratio": on / off, "ns_per_op": added,
                      "cpu_ns_off": c_off, "cpu_ns_on": c_on, "cpu_added_pct": share,
                      "off_all": results[w]["off"], "on_all": results[w]["on"],
                      "cpu_off_all": cpu[w]["off"], "cpu_on_all": cpu[w]["on"]}
        print(f"{w:<12} {off:>10.0f} {on:>10.0f} {on / off:>7.3f} {added:>8.0f} "
              f"{c_off:>8.0f} {c_on:>8.0f} {c_on - c_off:>7.0f} {share:>6.2f}%  "
              f"({min(results[w]['off']):.0f}-{max(results[w]['off']):.0f}/s, "
              f"{min(results[w]['on']):.0f}-{max(results[w]['on']):.0f}/s; cpu "
              f"{min(cpu[w]['off']):.0f}-{max(cpu[w]['off']):.0f}, "
              f"{min(cpu[w]['on']):.0f}-{max(cpu[w]['on']):.0f})")
    summary["trace_records"] = traced_records
    summary["trace_bytes_per_record"] = traced_bytes / max(1, traced_records)
    summary["records_per_program_op"] = traced_records / max(1, traced_ops)
    print(f"\ntraces: {traced_records} records, {summary['trace_bytes_per_record']:.1f} bytes "
          f"each, {summary['records_per_program_op']:.2f} records per program operation")
    text = json.dumps(summary, indent=1)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
