"""Tracing through the client library (docs/TRACING.md): `Client(trace=DIR)`, the fsspec
`trace` storage option, `tessera.trace.read`, and a traced program killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import fsspec
import pandas
import pytest

import tessera
from tessera import LocalCluster, find_binary


def the_trace(directory: Path) -> Path:
    files = list(directory.glob("*.ttrace"))
    assert len(files) == 1, files
    return files[0]


def test_a_client_records_each_call_as_it_was_made(cluster: LocalCluster, tmp_path: Path) -> None:
    c = cluster.client(trace=tmp_path)
    assert c.trace_file is not None and Path(c.trace_file).parent == tmp_path
    base = f"/tr-{uuid.uuid4().hex[:8]}"
    c.mkdir(base)
    with c.open(f"{base}/a", "wb") as f:
        for _ in range(3):
            f.write(b"x" * 1000)
    assert c.info(f"{base}/a")["size"] == 3000
    assert [e["name"] for e in c.ls(base)] == [f"{base}/a"]
    c.mv(f"{base}/a", f"{base}/b")
    assert c.cat(f"{base}/b") == b"x" * 3000
    with pytest.raises(FileNotFoundError):
        c.info(f"{base}/missing")
    c.rm(base, recursive=True)
    c.stop_trace()

    df = tessera.trace.read(c.trace_file)
    assert df.attrs["header"]["mode"] == "library"
    assert df.attrs["end"] == (len(df), 0)
    assert df.attrs["gaps"] == []
    assert set(df["mode"]) == {"library"}
    assert set(df["pid"]) == {os.getpid()}
    assert (df["end_ns"] >= df["start_ns"]).all()
    ops = list(zip(df["op"], df["path"]))
    assert ("mkdir", base) in ops[:2]  # Python's mkdir looks first
    # The handle's calls: a create, three writes, a release (close flushes).
    mine = df[df["path"] == f"{base}/a"]
    assert list(mine["op"]) == ["create", "write", "write", "write", "release", "getattr", "rename"]
    writes = mine[mine["op"] == "write"]
    assert list(writes["offset"]) == [0, 1000, 2000]
    assert list(writes["size"]) == [1000, 1000, 1000]
    assert list(writes["result"]) == [1000, 1000, 1000]
    # Small writes wait in the handle: the servers are asked for the bytes once, at the close.
    asked = mine["server_size"].fillna(0).sum()
    assert asked == 3000, mine[["op", "server_size"]]
    assert writes["server_size"].sum() == 0
    created = mine[mine["op"] == "create"].iloc[0]
    assert created["flags"] & os.O_CREAT and created["flags"] & os.O_TRUNC
    assert created["ino"] != 0
    renamed = mine[mine["op"] == "rename"].iloc[0]
    assert renamed["target"] == f"{base}/b"
    listed = df[df["op"] == "readdir"].iloc[0]
    assert listed["path"] == base and listed["result"] == 1
    reads = df[(df["op"] == "read") & (df["path"] == f"{base}/b")]
    assert reads["result"].sum() == 3000
    assert reads["server_size"].sum() >= 3000
    missing = df[df["path"] == f"{base}/missing"].iloc[0]
    assert missing["op"] == "getattr" and missing["result"] == -2  # ENOENT
    removed = df[df["path"] == base].iloc[-1]
    assert removed["op"] == "rmdir"


def test_the_dataframe_matches_the_parquet_export(cluster: LocalCluster, tmp_path: Path) -> None:
    c = cluster.client(trace=tmp_path / "t")
    p = f"/pq-{uuid.uuid4().hex[:8]}"
    c.pipe(p, b"y" * 5000)
    assert c.cat(p, 100, 200) == b"y" * 100
    c.rm(p)
    c.stop_trace()
    trace = the_trace(tmp_path / "t")
    out = tmp_path / "t.parquet"
    subprocess.run(
        [str(find_binary()), "trace", "export", str(trace), "--format", "parquet", "-o", str(out)],
        check=True,
    )
    ours = tessera.trace.read(trace)
    theirs = pandas.read_parquet(out)
    assert len(ours) > 0
    pandas.testing.assert_frame_equal(ours, theirs, check_dtype=False)


def test_the_fsspec_storage_option_traces_a_dataframe_write(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    assert cluster.manager is not None and cluster.secret is not None
    opts = {"manager": cluster.manager, "secret": cluster.secret, "trace": str(tmp_path)}
    path = f"/fs-{uuid.uuid4().hex[:8]}.csv"
    pandas.DataFrame({"a": range(100)}).to_csv(
        f"tessera://{path}", index=False, storage_options=opts
    )
    fs = fsspec.filesystem("tessera", **opts)  # the instance pandas used: fsspec keeps it
    assert fs.cat(path).startswith(b"a\n0\n")
    fs.rm(path)
    fs.client.stop_trace()
    df = tessera.trace.read(the_trace(tmp_path))
    ours = df[df["path"] == path]
    assert {"create", "write", "release", "unlink"} <= set(ours["op"])
    written = ours[ours["op"] == "write"]["result"].sum()
    assert written == len(fs_bytes := b"a\n" + b"".join(b"%d\n" % i for i in range(100)))
    assert fs_bytes


def test_a_traced_program_killed_keeps_what_it_flushed(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    assert cluster.manager is not None and cluster.secret is not None
    base = f"/kill-{uuid.uuid4().hex[:8]}"
    program = textwrap.dedent(
        f"""
        import sys, time, tessera
        c = tessera.Client({cluster.manager!r}, {cluster.secret!r}, trace={str(tmp_path)!r})
        c.mkdir({base!r})
        for i in range(200):
            c.pipe(f"{base}/f{{i}}", b"z" * 100)
        c.flush_trace()
        print("flushed", flush=True)
        while True:
            c.info({base!r})
            time.sleep(0.001)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "flushed"
        time.sleep(0.3)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    df = tessera.trace.read(the_trace(tmp_path))
    assert df.attrs["end"] is None  # killed: no end marker
    assert (df["op"] == "mkdir").sum() == 1
    for i in range(200):
        created = df[(df["path"] == f"{base}/f{i}") & (df["op"] == "create")]
        assert len(created) == 1, i
    assert (df["op"] == "getattr").any()
    c = cluster.client()
    c.rm(base, recursive=True)
