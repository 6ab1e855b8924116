"""Darshan logs into the I/O model (docs/MODEL.md, "From Darshan"): the DXT example log that
PyDarshan ships becomes a table of records and, through `tessera profile`, a model whose
bytes, requests and files are the log's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

darshan = pytest.importorskip("darshan", reason="PyDarshan is the `darshan` extra")

from tessera import darshan as tdarshan  # noqa: E402


def dxt_log() -> Path:
    from darshan.examples import example_logs  # type: ignore[import-untyped]

    return Path(os.path.dirname(example_logs.__file__)) / "dxt.darshan"


def segments(log: Path) -> tuple[int, int, int, int, set[str]]:
    """Bytes and requests read and written, and the files, as PyDarshan reports them."""
    report = darshan.DarshanReport(str(log), read_all=True)
    names = dict(report.name_records)
    read = written = reads = writes = 0
    files: set[str] = set()
    for rec in report.records["DXT_POSIX"].to_df():
        name = names[rec["id"]]
        if name.startswith("<"):
            continue
        r, w = rec["read_segments"], rec["write_segments"]
        if len(r) + len(w):
            files.add(name)
        read += int(r["length"].sum()) if len(r) else 0
        written += int(w["length"].sum()) if len(w) else 0
        reads, writes = reads + len(r), writes + len(w)
    return read, written, reads, writes, files


def test_a_dxt_log_profiles_into_a_model_of_its_segments(tmp_path: Path) -> None:
    log = dxt_log()
    read, written, reads, writes, files = segments(log)
    assert reads + writes > 1000, "a log with something to model"
    df = tdarshan.table(log)
    assert len(df) == reads + writes
    assert list(df["start_ns"]) == sorted(df["start_ns"])
    model = tdarshan.profile(log)
    app = model["application"]
    assert (app["bytes_read"], app["bytes_written"]) == (read, written)
    assert (app["reads"], app["writes"]) == (reads, writes)
    assert {f["path"] for f in model["files"]} == files
    assert sum(p["ops"] for p in model["phases"]) == reads + writes
    assert app["processes"] == 1, "the log's one rank"


def test_the_command_writes_a_table_and_refuses_a_log_without_dxt(tmp_path: Path) -> None:
    out = tmp_path / "job.parquet"
    ok = subprocess.run(
        [sys.executable, "-m", "tessera.darshan", str(dxt_log()), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert out.stat().st_size > 0 and "tessera profile" in ok.stdout
    plain = Path(os.path.dirname(dxt_log())) / "example.darshan"
    bad = subprocess.run(
        [sys.executable, "-m", "tessera.darshan", str(plain), "-o", str(tmp_path / "x")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "DXT_ENABLE_IO_TRACE" in bad.stderr, bad.stderr
