"""One trace of a whole distributed run: every process traced its own Tessera calls
(``trace=DIR``); their records are put on one clock and in one table that ``tessera profile``
reads (the Parquet table of ``tessera trace export``)."""

from __future__ import annotations

import glob
import os
from typing import List


def merge_traces(directory: str, name: str = "assembly.parquet") -> str:
    """Merges the ``*.ttrace`` files of ``directory`` into ``directory/name``; returns its
    path. Each record's times move to the clock of the earliest trace, then all are sorted
    by start."""
    import pandas as pd
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    from .. import trace

    files = sorted(glob.glob(os.path.join(directory, "*.ttrace")))
    if not files:
        raise FileNotFoundError(f"no traces (*.ttrace) in {directory}")
    frames: List[pd.DataFrame] = [trace.read(f) for f in files]
    base = min(int(df.attrs["header"]["clock_unix_ns"]) for df in frames)
    for df in frames:
        shift = int(df.attrs["header"]["clock_unix_ns"]) - base
        df["start_ns"] = df["start_ns"] + shift
        df["end_ns"] = df["end_ns"] + shift
    merged = pd.concat(frames, ignore_index=True)
    merged = merged.sort_values(["start_ns", "end_ns"], kind="stable").reset_index(drop=True)
    merged.attrs = {}
    table = pa.Table.from_pandas(merged, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta.update({
        b"tessera.source": f"library python -m tessera.assembly ({len(files)} processes)".encode(),
        b"tessera.mode": b"library",
        b"tessera.clock_unix_ns": str(base).encode(),
    })
    out = os.path.join(directory, name)
    pq.write_table(table.replace_schema_metadata(meta), out, compression="snappy")
    return out
