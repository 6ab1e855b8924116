"""Reading Tessera I/O traces (docs/TRACING.md) into pandas.

>>> from tessera import trace
>>> df = trace.read("/scratch/traces/node1-4242-1.ttrace")   # doctest: +SKIP
>>> df.groupby("op")["size"].sum()                             # doctest: +SKIP

A trace comes from a mount (``tessera mount --trace DIR``) or from a client
(``tessera.Client(trace=DIR)``); both have the same records. A trace cut short (its writer
was killed) reads up to its last whole chunk.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, Union

from . import _tessera

if TYPE_CHECKING:
    import pandas

# Column types, as ``tessera trace export --format parquet`` writes them (and pandas reads
# them back: text as ``str``, missing as NaN).
_DTYPES: Dict[str, str] = {
    "op": "str",
    "mode": "str",
    "exe": "str",
    "path": "str",
    "target": "str",
    "pid": "uint32",
    "uid": "uint32",
    "ino": "uint64",
    "offset": "uint64",
    "size": "uint64",
    "server_size": "UInt64",
    "flags": "uint32",
    "start_ns": "uint64",
    "end_ns": "uint64",
    "result": "int64",
    "via_handle": "bool",
}


def read(path: Union[str, "os.PathLike[str]"]) -> "pandas.DataFrame":
    """The records of the trace at ``path``, one row each, in the order they were written
    (each thread's in the order of its calls), with the columns of the Parquet export: ``op``,
    ``mode``, ``via_handle``, ``pid``, ``exe``, ``uid``, ``ino``, ``path``, ``target``,
    ``offset``, ``size``, ``server_size`` (nullable), ``flags``, ``start_ns``, ``end_ns``,
    ``result`` (at least 0: bytes or entries; below 0: the negated errno).

    ``df.attrs`` holds ``header`` (host, pid, source, mode, clock_unix_ns: the wall-clock
    time of time 0), ``gaps`` (records the writer had no room for: dropped, from_ns, to_ns)
    and ``end`` (the writer's (records, dropped) if it stopped cleanly, else None).
    """
    import pandas

    header, columns, gaps, end = _tessera.read_trace(os.fspath(path))
    df = pandas.DataFrame(columns)
    df = df.astype(_DTYPES)
    attrs: Dict[str, Any] = {"header": header, "gaps": gaps, "end": end}
    df.attrs.update(attrs)
    return df


__all__ = ["read"]
