"""The Python face of the Tessera client: :class:`Client` and :class:`TesseraFile`."""

from __future__ import annotations

import atexit
import io
import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import _tessera

PathLike = Union[str, "os.PathLike[str]"]
Buffer = Union[bytes, bytearray, memoryview]


def _as_bytes(data: Any) -> bytes:
    """``data`` as a ``bytes`` object: no copy for ``bytes``, one for other buffers."""
    if type(data) is bytes:
        return data
    return bytes(memoryview(data))


class TesseraFile(io.RawIOBase):
    """An open file of a Tessera cluster, in a binary mode.

    A standard ``io`` raw file: ``read``, ``readinto``, ``readline``, ``write``, ``seek``,
    ``tell``, ``truncate``, ``flush``, ``close``, iteration and ``with`` blocks all work.
    Reads and writes release the GIL while data moves; ``read`` copies the data once, from
    the network's buffers into the returned ``bytes``.

    Writes are asynchronous until ``flush`` or ``close`` (as NFS): a failed write (a full
    cluster: ``OSError`` with ``errno.ENOSPC``) is reported by the next write, ``flush`` or
    ``close``. What a handle wrote is visible to whoever opens the file after it was closed or
    flushed (close-to-open consistency).
    """

    def __init__(self, raw: _tessera.File, fs: Any = None) -> None:
        super().__init__()
        self._raw = raw
        self.fs = fs

    # -- identity ------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The file's path in the cluster (``/dir/name``)."""
        return self._raw.path

    @property
    def name(self) -> str:
        return self._raw.path

    @property
    def mode(self) -> str:
        return self._raw.mode

    @property
    def size(self) -> int:
        """The size as this handle sees it: at open, plus its own writes and truncates."""
        return self._raw.size

    def info(self) -> Dict[str, Any]:
        """Fresh attributes of the open file (as :meth:`Client.info`)."""
        return self._raw.info()

    def readable(self) -> bool:
        return self._raw.readable()

    def writable(self) -> bool:
        return self._raw.writable()

    def seekable(self) -> bool:
        return True

    # -- data ----------------------------------------------------------------------------

    def read(self, size: Optional[int] = -1) -> bytes:
        """Up to ``size`` bytes from the cursor (all the rest if ``size`` is negative)."""
        self._check_open()
        return self._raw.read(-1 if size is None else size)

    def readall(self) -> bytes:
        self._check_open()
        return self._raw.read(-1)

    def read1(self, size: int = -1) -> bytes:
        return self.read(size)

    def readinto(self, buffer: Any) -> int:
        self._check_open()
        view = memoryview(buffer).cast("B")
        data = self._raw.read(len(view))
        view[: len(data)] = data
        return len(data)

    def write(self, data: Any) -> int:
        """Writes ``data`` (any bytes-like object) at the cursor; returns its length."""
        self._check_open()
        return self._raw.write(_as_bytes(data))

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._check_open()
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        self._check_open()
        return self._raw.tell()

    def truncate(self, size: Optional[int] = None) -> int:
        self._check_open()
        return self._raw.truncate(size)

    def flush(self) -> None:
        """Waits until everything written is stored and publishes the size."""
        if self.closed:
            raise ValueError("I/O operation on closed file")
        self._raw.flush()

    def close(self) -> None:
        """Flushes and releases the handle; raises if a write failed. Idempotent."""
        if self.closed:
            return
        try:
            self._raw.close()
        finally:
            super().close()

    # fsspec transactions: writes here are never deferred.
    def commit(self) -> None:
        """Nothing to do: Tessera writes are not deferred (fsspec transaction protocol)."""

    def discard(self) -> None:
        """Nothing to undo (fsspec transaction protocol)."""

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")

    def __repr__(self) -> str:
        return f"<TesseraFile {self._raw.path!r} mode={self._raw.mode!r}>"


class Client:
    """A connection to a Tessera cluster. Thread-safe: share one per process.

    ``manager`` (``HOST:PORT``) and ``secret`` come from the arguments, else the environment
    (``TESSERA_MANAGER``, ``TESSERA_SECRET``), else the configuration file (``config`` or
    ``TESSERA_CONFIG``), else the cluster file ``tessera up`` writes
    (``$TESSERA_HOME/cluster.toml``, by default ``~/.tessera/cluster.toml``): the command
    line's order. ``timeout`` bounds how long to wait for a cluster that is still starting.

    Paths are absolute in the cluster (``/data/x``); ``tessera://data/x`` and
    ``tessera:/data/x`` name the same file. Errors are the built-in exceptions:
    ``FileNotFoundError``, ``FileExistsError``, ``IsADirectoryError``,
    ``NotADirectoryError``, ``PermissionError``, ``OSError`` with ``errno`` (``ENOSPC`` for a
    full cluster, ``ENOTEMPTY``...), ``ConnectionError`` when the cluster cannot be reached.

    ``trace`` (a directory, created if missing) records every call this client makes, and
    every call on the files it opens, into a new trace file there (docs/TRACING.md): read it
    with :func:`tessera.trace.read` or ``tessera trace summary``. The trace is finished at
    exit or by :meth:`stop_trace`.
    """

    def __init__(
        self,
        manager: Optional[str] = None,
        secret: Optional[str] = None,
        config: Optional[PathLike] = None,
        timeout: float = 30.0,
        trace: Optional[PathLike] = None,
    ) -> None:
        self._inner = _tessera.Client(
            manager,
            secret,
            None if config is None else os.fspath(config),
            timeout,
            None if trace is None else os.fspath(trace),
        )
        if trace is not None:
            atexit.register(self._inner.stop_trace)

    @property
    def trace_file(self) -> Optional[str]:
        """The trace file this client records its calls in (``trace=``), or None."""
        path = self._inner.trace_file
        return None if path is None else os.fspath(path)

    def flush_trace(self) -> None:
        """Writes out the trace's records so far (done every 250 ms anyway)."""
        self._inner.flush_trace()

    def stop_trace(self) -> None:
        """Finishes the trace: later calls are not recorded."""
        self._inner.stop_trace()

    @property
    def manager(self) -> str:
        """The manager address in use."""
        return self._inner.manager

    @property
    def stripe_size(self) -> int:
        """The cluster's stripe size in bytes."""
        return self._inner.stripe_size

    def open(self, path: str, mode: str = "rb") -> TesseraFile:
        """Opens ``path`` in a binary mode: ``rb``, ``wb``, ``ab``, ``xb``, ``r+b``, ``w+b``,
        ``a+b``, ``x+b``. Use it in a ``with`` block."""
        return TesseraFile(self._inner.open(path, mode))

    def info(self, path: str, follow: bool = True) -> Dict[str, Any]:
        """Attributes of ``path``: ``name``, ``size``, ``type`` (``file``, ``directory``,
        ``link``), ``mode``, ``ino``, ``nlink``, ``uid``, ``gid``, ``mtime``, ``atime``,
        ``ctime`` (seconds), ``islink``. Symbolic links are followed unless ``follow`` is
        false."""
        return self._inner.info(path, follow)

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        return self._inner.exists(path)

    def isdir(self, path: str) -> bool:
        try:
            return bool(self._inner.info(path)["type"] == "directory")
        except (FileNotFoundError, NotADirectoryError):
            return False

    def isfile(self, path: str) -> bool:
        try:
            return bool(self._inner.info(path)["type"] == "file")
        except (FileNotFoundError, NotADirectoryError):
            return False

    def ls(self, path: str = "/", detail: bool = True) -> List[Any]:
        """Entries of the directory ``path``, sorted by name: ``info`` dicts with
        ``detail``, else full paths."""
        return self._inner.ls(path, detail)

    def mkdir(self, path: str, parents: bool = False, exist_ok: bool = False) -> None:
        """Creates a directory (and its missing parents with ``parents``)."""
        self._inner.mkdir(path, parents, exist_ok)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Creates a directory and its missing parents."""
        self._inner.mkdir(path, True, exist_ok)

    def rm(self, path: str, recursive: bool = False) -> None:
        """Removes a file, or a whole tree with ``recursive`` (a directory without it is an
        ``IsADirectoryError``)."""
        self._inner.rm(path, recursive)

    def rmdir(self, path: str) -> None:
        """Removes an empty directory."""
        self._inner.rmdir(path)

    def mv(self, src: str, dst: str) -> None:
        """Renames ``src`` to ``dst``, replacing a file or an empty directory there."""
        self._inner.mv(src, dst)

    def copy(self, src: str, dst: str) -> None:
        """Copies the file ``src`` to ``dst`` within the cluster."""
        self._inner.copy(src, dst)

    def chmod(self, path: str, mode: int) -> None:
        self._inner.chmod(path, mode)

    def cat(self, path: str, start: Optional[int] = None, end: Optional[int] = None) -> bytes:
        """The bytes of ``path`` between ``start`` and ``end`` (negative: from the end)."""
        return self._inner.cat(path, start, end)

    def pipe(self, path: str, data: Buffer) -> None:
        """Creates or replaces the file ``path`` with ``data``."""
        self._inner.pipe(path, _as_bytes(data))

    def usage(self) -> Dict[str, int]:
        """``capacity``, ``used`` (bytes), ``inodes`` and ``nodes`` of the cluster."""
        return self._inner.usage()

    # -- many files at once ----------------------------------------------------------------

    def cat_many(
        self,
        paths: Sequence[str],
        starts: Optional[Sequence[Optional[int]]] = None,
        ends: Optional[Sequence[Optional[int]]] = None,
        concurrency: int = 32,
    ) -> List[Union[bytes, Exception]]:
        """Reads many files (or ranges) at once, ``concurrency`` in flight; for every path its
        bytes or the exception reading it raised."""
        return self._inner.cat_many(
            list(paths),
            None if starts is None else list(starts),
            None if ends is None else list(ends),
            concurrency,
        )

    def pipe_many(
        self, items: Iterable[Tuple[str, Buffer]], concurrency: int = 32
    ) -> List[Optional[Exception]]:
        """Writes many files at once; for every item None or its exception."""
        return self._inner.pipe_many([(p, _as_bytes(d)) for p, d in items], concurrency)

    def put_many(
        self, pairs: Iterable[Tuple[PathLike, str]], concurrency: int = 32
    ) -> List[Optional[Exception]]:
        """Copies local files to the cluster, ``(local, remote)`` pairs, ``concurrency`` at
        once; remote parents must exist. For every pair None or its exception."""
        return self._inner.put_many([(os.fspath(lp), rp) for lp, rp in pairs], concurrency)

    def get_many(
        self, pairs: Iterable[Tuple[str, PathLike]], concurrency: int = 32
    ) -> List[Optional[Exception]]:
        """Copies cluster files to local files, ``(remote, local)`` pairs, ``concurrency`` at
        once; local parents must exist. For every pair None or its exception."""
        return self._inner.get_many([(rp, os.fspath(lp)) for rp, lp in pairs], concurrency)

    def __repr__(self) -> str:
        inner = getattr(self, "_inner", None)
        return f"<tessera.Client manager={inner.manager if inner else None}>"


def raise_first(outcomes: Sequence[Optional[BaseException]]) -> None:
    """Raises the first exception of a batch's outcomes, if any."""
    for o in outcomes:
        if o is not None:
            raise o
