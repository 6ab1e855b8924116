"""Tessera from Python: a client for the Tessera in-memory runtime file system, an fsspec file
system for ``tessera://`` URLs (pandas, Dask, pyarrow...), and a helper that starts a local
cluster for tests and notebooks.

>>> from tessera import LocalCluster
>>> with LocalCluster(servers=2, memory="256MiB") as cluster:   # doctest: +SKIP
...     c = cluster.client()
...     with c.open("/hello.txt", "wb") as f:
...         f.write(b"hi")
...     c.cat("/hello.txt")
b'hi'
"""

from . import trace
from ._client import Client, TesseraFile
from ._collective import Collective, CollectiveError, CollectiveResult, collective
from ._tessera import __version__, cluster_file
from .cluster import LocalCluster, find_binary

__all__ = [
    "Client",
    "TesseraFile",
    "LocalCluster",
    "find_binary",
    "cluster_file",
    "trace",
    "collective",
    "Collective",
    "CollectiveError",
    "CollectiveResult",
    "__version__",
]
