"""Darshan logs into Tessera's I/O model (docs/MODEL.md, "From Darshan").

A Darshan log recorded with DXT (``DXT_ENABLE_IO_TRACE=1``) holds every POSIX read and write of
the job: where, how much, and when, per file and per rank. This module turns those segments
into the table of records that ``tessera profile`` reads, so a job traced with Darshan on any
cluster can be modelled, reported on and replayed on Tessera::

    python -m tessera.darshan job.darshan -o job.parquet
    tessera profile job.parquet

Each segment becomes a ``read`` or ``write`` record of its rank (as ``pid``), with the log's
file record id as ``ino`` and its name as ``path``. Darshan's DXT keeps no metadata operations,
so the model has data phases only; the standard streams (``<STDOUT>`` and the like) are left
out. Needs PyDarshan: ``pip install "tessera[darshan]"``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

from .cluster import find_binary
from .trace import _DTYPES

if TYPE_CHECKING:
    import pandas

PathLike = Union[str, "os.PathLike[str]"]

_COLUMNS = list(_DTYPES)


def table(log: PathLike) -> "pandas.DataFrame":
    """The DXT segments of Darshan log ``log`` as a table of trace records, in order of start."""
    import darshan  # type: ignore[import-untyped]
    import pandas as pd

    report = darshan.DarshanReport(os.fspath(log), read_all=True)
    if "DXT_POSIX" not in report.records:
        raise ValueError(
            f"{os.fspath(log)} has no DXT records: run the job with DXT_ENABLE_IO_TRACE=1"
        )
    names: Dict[int, str] = dict(report.name_records)
    uid = int(report.metadata.get("job", {}).get("uid", 0))
    exe = os.path.basename(str(report.metadata.get("exe", "")).split(" ")[0]) or None
    parts: List[pd.DataFrame] = []
    for rec in report.records["DXT_POSIX"].to_df():
        name = names.get(rec["id"], "")
        if not name or name.startswith("<"):
            continue
        for op, key in (("read", "read_segments"), ("write", "write_segments")):
            seg = rec[key]
            if len(seg) == 0:
                continue
            parts.append(
                pd.DataFrame(
                    {
                        "op": op,
                        "pid": rec["rank"],
                        "ino": rec["id"] & 0xFFFF_FFFF_FFFF_FFFF,
                        "path": name,
                        "offset": seg["offset"],
                        "size": seg["length"],
                        "result": seg["length"],
                        "start_ns": (seg["start_time"] * 1e9).round(),
                        "end_ns": (seg["end_time"] * 1e9).round(),
                    }
                )
            )
    if parts:
        df = pd.concat(parts, ignore_index=True)
    else:
        df = pd.DataFrame({c: pd.Series(dtype="object") for c in _COLUMNS})
    df["mode"] = "library"
    df["via_handle"] = False
    df["exe"] = exe
    df["uid"] = uid
    df["target"] = None
    df["server_size"] = None
    df["flags"] = 0
    df = df[_COLUMNS].astype(_DTYPES)
    return df.sort_values(["start_ns", "end_ns"], kind="stable").reset_index(drop=True)


def to_parquet(log: PathLike, out: PathLike) -> int:
    """Writes the table of ``log``'s segments to ``out`` (Parquet); returns its rows."""
    df = table(log)
    df.to_parquet(os.fspath(out), index=False, compression="snappy")
    return len(df)


def profile(log: PathLike, binary: Optional[PathLike] = None) -> Dict[str, Any]:
    """The I/O model of Darshan log ``log`` (``tessera profile`` of its table), as a dict."""
    with tempfile.TemporaryDirectory(prefix="tessera-darshan-") as tmp:
        rows = os.path.join(tmp, "records.parquet")
        to_parquet(log, rows)
        out = subprocess.run(
            [os.fspath(find_binary(binary)), "profile", rows, "-o", "-"],
            check=True,
            capture_output=True,
            text=True,
        )
    model: Dict[str, Any] = json.loads(out.stdout)
    return model


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tessera.darshan",
        description="Turn a Darshan log's DXT segments into records for `tessera profile`.",
    )
    parser.add_argument("log", help="a Darshan log recorded with DXT_ENABLE_IO_TRACE=1")
    parser.add_argument("-o", "--output", required=True, help="the Parquet table to write")
    args = parser.parse_args(argv)
    try:
        rows = to_parquet(args.log, args.output)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"python -m tessera.darshan: {e}", file=sys.stderr)
        return 1
    print(f"{rows} records written to {args.output}; next: tessera profile {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
