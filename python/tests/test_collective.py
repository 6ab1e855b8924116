"""Collective output from Python: threads as writers, and MPI ranks (mpi4py, OpenMPI)."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest

import tessera
from tessera import Client, CollectiveError, CollectiveResult, LocalCluster

Records = List[Tuple[bytes, bytes]]
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "collective_mpi.py"


def records(rank: int, n: int) -> Records:
    rng = random.Random(rank)
    out = []
    for i in range(n):
        k = rng.randrange(300)
        out.append((k.to_bytes(8, "big"), f"w{rank} #{i} key {k}\n".encode()))
    return out


def reference(all_: List[Records], sorted_: bool = True, top: Optional[int] = None) -> bytes:
    flat = [r for recs in all_ for r in recs]
    if sorted_:
        flat.sort(key=lambda r: r[0])  # stable: ties by writer, then append order
    return b"".join(r for _, r in flat[:top])


def run_writers(
    n: int, body: Callable[[int], CollectiveResult]
) -> Dict[int, object]:
    """Runs ``body(rank)`` in ``n`` threads; the result or exception of each."""
    out: Dict[int, object] = {}

    def run(rank: int) -> None:
        try:
            out[rank] = body(rank)
        except Exception as e:  # noqa: BLE001 - handed to the test
            out[rank] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_threads_make_one_sorted_output(client: Client, base: str) -> None:
    all_ = [records(r, 2000 + 300 * r) for r in range(4)]
    path = f"{base}/sorted.txt"

    def body(rank: int) -> CollectiveResult:
        w = tessera.collective(
            path, 4, rank, client=client, sorted=True, threshold=20_000,
            coordinators_per_node=2, strategy="least-rr",
        )
        assert (w.rank, w.writers) == (rank, 4)
        w.append_many([r for _, r in all_[rank][:500]], [k for k, _ in all_[rank][:500]])
        for k, r in all_[rank][500:]:
            w.append(r, k)
        w.flush()
        w.wait()
        assert w.test()
        return w.finalize()

    results = run_writers(4, body)
    total = sum(len(r) for r in all_)
    for r in results.values():
        assert isinstance(r, CollectiveResult), r
        assert r.records == total and len(r.coordinators) == 2 and r.runs > 1
    assert client.cat(path) == reference(all_)
    assert client.ls(base, detail=False) == [path]


def test_unsorted_output_and_top(client: Client, base: str) -> None:
    all_ = [records(r, 1000) for r in range(3)]

    def plain(rank: int) -> CollectiveResult:
        with tessera.collective(f"{base}/plain", 3, rank, client=client) as w:
            for _, r in all_[rank]:
                w.append(r)
        return w.finalize()  # already done at the end of the block: the same result

    for r in run_writers(3, plain).values():
        assert isinstance(r, CollectiveResult), r
    assert client.cat(f"{base}/plain") == reference(all_, sorted_=False)

    def top(rank: int) -> CollectiveResult:
        w = tessera.collective(f"{base}/top", 3, rank, client=client, sorted=True, top=100)
        for k, r in all_[rank]:
            w.append(r, k)
        return w.finalize()

    for r in run_writers(3, top).values():
        assert isinstance(r, CollectiveResult) and r.records == 100, r
    assert client.cat(f"{base}/top") == reference(all_, top=100)
    assert tessera.collective.wait_output(f"{base}/top", client=client) == len(
        reference(all_, top=100)
    )


def test_arrival_order_keeps_every_record_and_each_writers_order(
    client: Client, base: str
) -> None:
    all_ = [records(r, 1500) for r in range(3)]

    def arrival(rank: int) -> CollectiveResult:
        w = tessera.collective(
            f"{base}/arrival", 3, rank, client=client, order="arrival", threshold=8 << 10
        )
        for _, r in all_[rank]:
            w.append(r)
        return w.finalize()

    for r in run_writers(3, arrival).values():
        assert isinstance(r, CollectiveResult) and r.records == 4500, r
        assert r.coordinators == [], r
    lines = client.cat(f"{base}/arrival").splitlines(keepends=True)
    assert sorted(lines) == sorted(rec for recs in all_ for _, rec in recs)
    for rank, recs in enumerate(all_):
        mine = [ln for ln in lines if ln.startswith(f"w{rank} #".encode())]
        assert mine == [rec for _, rec in recs], f"writer {rank}'s records out of order"
    with pytest.raises(ValueError, match="no order"):
        tessera.collective(f"{base}/bad", 2, 0, client=client, order="fastest")
    with pytest.raises(ValueError, match="arrival order"):
        tessera.collective(f"{base}/bad", 2, 0, client=client, order="arrival", top=3)


def test_a_writer_that_raises_fails_the_others(client: Client, base: str) -> None:
    path = f"{base}/failed"

    def body(rank: int) -> CollectiveResult:
        with tessera.collective(path, 3, rank, client=client, sorted=True) as w:
            for k, r in records(rank, 500):
                w.append(r, k)
            if rank == 2:
                raise RuntimeError("out of reads")
        return w.finalize()

    results = run_writers(3, body)
    assert isinstance(results[2], RuntimeError)
    for rank in (0, 1):
        err = results[rank]
        assert isinstance(err, CollectiveError), err
        assert "writer 2 left" in str(err) and "out of reads" in str(err)
    assert not client.exists(path)
    with pytest.raises(CollectiveError, match="writer 2 left"):
        tessera.collective.wait_output(path, client=client, timeout=30)
    with pytest.raises(ValueError):
        tessera.collective(f"{base}/x", 2, 2, client=client)  # rank out of range


def mpi_pythonpath(tmp: Path) -> Optional[str]:
    """A PYTHONPATH under which this interpreter imports mpi4py: none needed if it does
    already, else Debian's python3-mpi4py (built for the same Python version) alone."""
    if importlib.util.find_spec("mpi4py") is not None:
        return ""
    v = sys.version_info
    for d in ["/usr/lib/python3/dist-packages"]:
        pkg = Path(d) / "mpi4py"
        if pkg.is_dir() and list(pkg.glob(f"MPI.cpython-{v.major}{v.minor}*.so")):
            (tmp / "mpi4py").symlink_to(pkg)
            return str(tmp)
    return None


def test_mpi4py_ranks_are_the_writers(
    cluster: LocalCluster, client: Client, base: str, tmp_path: Path
) -> None:
    mpirun = shutil.which("mpirun")
    pythonpath = mpi_pythonpath(tmp_path)
    if mpirun is None or pythonpath is None:
        pytest.skip("needs OpenMPI and mpi4py (scripts/deps.sh installs them)")
    env = {**os.environ, **cluster.env}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    path = f"{base}/aligned.sam"
    out = subprocess.run(
        [mpirun, *root, "--oversubscribe", "-n", "4", sys.executable, str(EXAMPLE), path, "3000"],
        env=env, capture_output=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    made = json.loads(out.stdout.decode().strip().splitlines()[-1])
    assert made["records"] == 4 * 3000

    spec = importlib.util.spec_from_file_location("collective_mpi", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    expect = reference([list(example.alignments(r, 3000)) for r in range(4)])
    assert client.cat(path) == expect


def fixed_record(key: int, size: int = 24) -> bytes:
    return f"key {key} ".encode().ljust(size - 1, b"#") + b"\n"


def test_fixed_size_records_go_in_place_by_key(client: Client, base: str) -> None:
    lo, hi, size = 50, 2050, 24
    path = f"{base}/fixed.bin"

    def body(rank: int) -> CollectiveResult:
        w = tessera.collective(
            path, 3, rank, client=client, record_size=size, key_range=range(lo, hi),
            threshold=2000,
        )
        keys = [k for k in range(lo, hi) if k % 4 == rank]
        random.Random(rank).shuffle(keys)
        half = len(keys) // 2
        for k in keys[:half]:
            w.put(k, fixed_record(k))
        if rank == 0:
            w.put_many(keys[half:], b"".join(fixed_record(k) for k in keys[half:]))
        else:
            w.put_many(keys[half:], [fixed_record(k) for k in keys[half:]])
        return w.finalize()

    results = run_writers(3, body)
    given = sum(1 for k in range(lo, hi) if k % 4 != 3)
    for r in results.values():
        assert isinstance(r, CollectiveResult), r
        assert r.size == (hi - lo) * size and r.records == given
    want = b"".join(
        fixed_record(k) if k % 4 != 3 else bytes(size) for k in range(lo, hi)
    )
    assert client.cat(path) == want

    # Bad keys and records are refused; the writer goes on.
    with tessera.collective(
        f"{base}/one.bin", 1, 0, client=client, record_size=4, key_range=(0, 3)
    ) as w:
        with pytest.raises(ValueError, match="outside the key range"):
            w.put(3, b"abcd")
        with pytest.raises(ValueError, match="a record of 3 bytes"):
            w.put(0, b"abc")
        with pytest.raises(ValueError, match="not 2 records of 4 bytes"):
            w.put_many([0, 1], b"abcdefg")
        with pytest.raises(ValueError):
            w.append(b"not keyed")
        w.put(1, b"one!")
    assert client.cat(f"{base}/one.bin") == bytes(4) + b"one!" + bytes(4)

    for bad in [
        dict(record_size=(4 << 30) + 1, key_range=(0, 3)),
        dict(record_size=0, key_range=(0, 3)),
        dict(record_size=4, key_range=(3, 3)),
        dict(record_size=4),
        dict(record_size=4, key_range=(0, 3), sorted=True),
        dict(record_size=4, key_range=range(0, 10, 2)),
    ]:
        with pytest.raises(ValueError):
            tessera.collective(f"{base}/never", 1, 0, client=client, **bad)  # type: ignore[arg-type]


def test_a_key_given_twice_fails_every_writer(client: Client, base: str) -> None:
    path = f"{base}/dup.bin"

    def body(rank: int) -> CollectiveResult:
        w = tessera.collective(path, 2, rank, client=client, record_size=8, key_range=(0, 100))
        for k in range(rank * 40, rank * 40 + 50):  # keys 40..49 from both writers
            w.put(k, k.to_bytes(8, "big"))
        return w.finalize()

    results = run_writers(2, body)
    for rank in (0, 1):
        err = results[rank]
        assert isinstance(err, CollectiveError), err
        assert "key 40 given twice (by writers 0 and 1)" in str(err)
    assert not client.exists(path)

    def twice(rank: int) -> CollectiveResult:
        with tessera.collective(
            f"{base}/twice.bin", 2, rank, client=client, record_size=8, key_range=(0, 100)
        ) as w:
            w.put(rank, bytes(8))
            if rank == 1:
                w.put(1, bytes(8))
        return w.finalize()

    results = run_writers(2, twice)
    for rank in (0, 1):
        err = results[rank]
        assert isinstance(err, CollectiveError), err
        assert "key 1 given twice (both times by writer 1)" in str(err), err
