"""An fsspec file system for ``tessera://`` URLs, registered through the ``fsspec.specs``
entry point, so ``fsspec.open("tessera://data/x.csv")``, ``pandas.read_csv``,
``DataFrame.to_parquet`` and ``dask.dataframe.read_csv("tessera://data/*.csv")`` work.

``tessera://data/x`` and ``tessera:///data/x`` both name ``/data/x`` (there is no host part:
the cluster is found as the command line finds it, or from ``storage_options`` ``manager`` /
``secret`` / ``config``).

Bulk operations run many files at once in the Rust client with the GIL released: ``cat`` and
``cat_ranges`` of several paths, ``pipe`` of a dict, ``put`` and ``get`` of many files.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from fsspec.callbacks import DEFAULT_CALLBACK, Callback
from fsspec.spec import AbstractFileSystem
from fsspec.utils import stringify_path

from ._client import Client, TesseraFile, _as_bytes, raise_first


class TesseraFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """fsspec file system over a Tessera cluster.

    Parameters: ``manager`` (``HOST:PORT``), ``secret``, ``config`` (a configuration file),
    ``timeout`` (seconds to wait for a starting cluster), ``concurrency`` (files in flight in
    batch operations), ``auto_mkdir`` (create missing parents when a file is opened for
    writing), ``trace`` (a directory to trace this file system's calls into, see
    :class:`tessera.Client`). Unset ``manager``/``secret`` are found as the command line
    finds them.
    """

    protocol = ("tessera",)
    root_marker = "/"

    def __init__(
        self,
        manager: Optional[str] = None,
        secret: Optional[str] = None,
        config: Optional[str] = None,
        timeout: float = 30.0,
        concurrency: int = 32,
        auto_mkdir: bool = False,
        trace: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.client = Client(manager, secret, config, timeout, trace)
        self.concurrency = concurrency
        self.auto_mkdir = auto_mkdir
        self._batch = threading.local()

    # -- paths -------------------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        for prefix in ("tessera://", "tessera:"):
            if path.startswith(prefix):
                path = path[len(prefix) :]
                break
        path = path.strip("/")
        return "/" + path

    def unstrip_protocol(self, name: str) -> str:
        return "tessera://" + name.lstrip("/")

    # -- metadata ------------------------------------------------------------------------------

    def info(self, path: str, **kwargs: Any) -> Dict[str, Any]:
        return self.client.info(self._strip_protocol(path))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> List[Any]:
        path = self._strip_protocol(path)
        try:
            return self.client.ls(path, detail)
        except NotADirectoryError:
            info = self.client.info(path)
            return [info] if detail else [info["name"]]

    def exists(self, path: str, **kwargs: Any) -> bool:
        return self.client.exists(self._strip_protocol(path))

    def isdir(self, path: str) -> bool:
        return self.client.isdir(self._strip_protocol(path))

    def isfile(self, path: str) -> bool:
        return self.client.isfile(self._strip_protocol(path))

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        self.client.mkdir(self._strip_protocol(path), parents=create_parents)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.client.mkdir(self._strip_protocol(path), parents=True, exist_ok=exist_ok)

    def rmdir(self, path: str) -> None:
        self.client.rmdir(self._strip_protocol(path))

    def rm_file(self, path: str) -> None:
        self.client.rm(self._strip_protocol(path))

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def rm(
        self, path: Any, recursive: bool = False, maxdepth: Optional[int] = None
    ) -> None:
        if (
            isinstance(path, str)
            and recursive
            and maxdepth is None
            and not any(c in path for c in "*?[")
        ):
            self.client.rm(self._strip_protocol(path), recursive=True)
            return
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        for p in reversed(paths):
            try:
                kind = self.client.info(p, follow=False)["type"]
            except FileNotFoundError:
                continue
            if kind == "directory":
                if not recursive:
                    raise IsADirectoryError(p)
                self.client.rmdir(p)
            else:
                self.client.rm(p)

    def mv(
        self,
        path1: Any,
        path2: Any,
        recursive: bool = False,
        maxdepth: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        if (
            isinstance(path1, str)
            and isinstance(path2, str)
            and not any(c in path1 for c in "*?[")
            and maxdepth is None
        ):
            src = self._strip_protocol(path1)
            dst = self._strip_protocol(path2)
            if src == dst:
                return
            if self.client.isdir(src) and not recursive:
                # fsspec moves a directory only when asked to (copy semantics)
                super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth)
                return
            if self.client.isdir(dst):
                dst = dst.rstrip("/") + "/" + src.rsplit("/", 1)[-1]
            self.client.mv(src, dst)
            return
        super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        src = self._strip_protocol(path1)
        dst = self._strip_protocol(path2)
        if self.client.isdir(src):
            self.makedirs(dst, exist_ok=True)
            return
        self.makedirs(self._parent(dst), exist_ok=True)
        self.client.copy(src, dst)

    def created(self, path: str) -> Any:
        import datetime

        t = self.info(path)["ctime"]
        return datetime.datetime.fromtimestamp(t, tz=datetime.timezone.utc)

    def modified(self, path: str) -> Any:
        import datetime

        t = self.info(path)["mtime"]
        return datetime.datetime.fromtimestamp(t, tz=datetime.timezone.utc)

    def ukey(self, path: str) -> str:
        i = self.info(path)
        return f"{i['ino']:x}-{i['size']}-{i['mtime']}"

    def chmod(self, path: str, mode: int) -> None:
        self.client.chmod(self._strip_protocol(path), mode)

    # -- data ----------------------------------------------------------------------------------

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: Optional[int] = None,
        autocommit: bool = True,
        cache_options: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> TesseraFile:
        path = self._strip_protocol(path)
        if self.auto_mkdir and "r" not in mode:
            self.makedirs(self._parent(path), exist_ok=True)
        return TesseraFile(self.client._inner.open(path, mode), fs=self)

    def cat_file(
        self, path: str, start: Optional[int] = None, end: Optional[int] = None, **kwargs: Any
    ) -> bytes:
        return self.client.cat(self._strip_protocol(path), start, end)

    def pipe_file(self, path: str, value: Any, mode: str = "overwrite", **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        if mode == "create" and self.client.exists(path):
            raise FileExistsError(path)
        if self.auto_mkdir:
            self.makedirs(self._parent(path), exist_ok=True)
        self.client.pipe(path, value)

    def pipe(self, path: Any, value: Any = None, **kwargs: Any) -> None:
        if isinstance(path, dict) and kwargs.get("mode", "overwrite") == "overwrite":
            items = [(self._strip_protocol(k), _as_bytes(v)) for k, v in path.items()]
            if self.auto_mkdir:
                for parent in sorted({self._parent(p) for p, _ in items}):
                    self.makedirs(parent, exist_ok=True)
            raise_first(self.client.pipe_many(items, self.concurrency))
            return
        super().pipe(path, value, **kwargs)

    def cat(
        self, path: Any, recursive: bool = False, on_error: str = "raise", **kwargs: Any
    ) -> Any:
        paths = self.expand_path(path, recursive=recursive, **kwargs)
        if len(paths) > 1 or isinstance(path, list) or paths[0] != self._strip_protocol(path):
            files = [p for p in paths if not self.client.isdir(p)] if recursive else paths
            got = self.client.cat_many(files, concurrency=self.concurrency)
            out: Dict[str, Any] = {}
            for p, v in zip(files, got):
                if isinstance(v, Exception):
                    if on_error == "raise":
                        raise v
                    if on_error == "omit":
                        continue
                out[p] = v
            return out
        return self.cat_file(paths[0], **kwargs)

    def cat_ranges(
        self,
        paths: List[str],
        starts: Any,
        ends: Any,
        max_gap: Optional[int] = None,
        on_error: str = "return",
        **kwargs: Any,
    ) -> List[Any]:
        if max_gap is not None:
            raise NotImplementedError
        if not isinstance(paths, list):
            raise TypeError
        if not isinstance(starts, list):
            starts = [starts] * len(paths)
        if not isinstance(ends, list):
            ends = [ends] * len(paths)
        if len(starts) != len(paths) or len(ends) != len(paths):
            raise ValueError
        got = self.client.cat_many(
            [self._strip_protocol(p) for p in paths], starts, ends, self.concurrency
        )
        if on_error != "return":
            raise_first([v if isinstance(v, Exception) else None for v in got])
        return got

    # put/get: fsspec's own put/get work out the target paths (globs, trailing slashes,
    # recursion); put_file/get_file only collect the pairs, which then go to the cluster
    # `concurrency` at a time.

    def _pending(self) -> Optional[List[Tuple[str, str]]]:
        return getattr(self._batch, "pairs", None)

    def put_file(
        self,
        lpath: Any,
        rpath: Any,
        callback: Callback = DEFAULT_CALLBACK,
        mode: str = "overwrite",
        **kwargs: Any,
    ) -> None:
        rpath = self._strip_protocol(rpath)
        if mode == "create" and self.client.exists(rpath):
            raise FileExistsError(rpath)
        lpath = os.fspath(lpath)
        if os.path.isdir(lpath):
            self.makedirs(rpath, exist_ok=True)
            return
        pending = self._pending()
        if pending is not None:
            pending.append((lpath, rpath))
            return
        self.makedirs(self._parent(rpath), exist_ok=True)
        raise_first(self.client.put_many([(lpath, rpath)]))

    def put(self, lpath: Any, rpath: Any, recursive: bool = False, **kwargs: Any) -> None:
        self._batched("put", lpath, rpath, recursive, **kwargs)

    def get_file(
        self,
        rpath: Any,
        lpath: Any,
        callback: Callback = DEFAULT_CALLBACK,
        outfile: Any = None,
        **kwargs: Any,
    ) -> None:
        rpath = self._strip_protocol(rpath)
        if outfile is None and not isinstance(lpath, (str, os.PathLike)):
            outfile = lpath
        if outfile is not None:
            with self.open(rpath, "rb") as f:
                while True:
                    data = f.read(self.client.stripe_size)
                    if not data:
                        return
                    outfile.write(data)
        lpath = os.fspath(lpath)
        if self.client.isdir(rpath):
            os.makedirs(lpath, exist_ok=True)
            return
        pending = self._pending()
        if pending is not None:
            pending.append((rpath, lpath))
            return
        parent = os.path.dirname(lpath)
        if parent:
            os.makedirs(parent, exist_ok=True)
        raise_first(self.client.get_many([(rpath, lpath)]))

    def get(self, rpath: Any, lpath: Any, recursive: bool = False, **kwargs: Any) -> None:
        self._batched("get", rpath, lpath, recursive, **kwargs)

    def _batched(self, op: str, src: Any, dst: Any, recursive: bool, **kwargs: Any) -> None:
        if self._pending() is not None:  # nested: let the outer call batch
            getattr(super(), op)(src, dst, recursive=recursive, **kwargs)
            return
        pairs: List[Tuple[str, str]] = []
        self._batch.pairs = pairs
        try:
            getattr(super(), op)(src, dst, recursive=recursive, **kwargs)
        finally:
            self._batch.pairs = None
        if not pairs:
            return
        if op == "put":
            for parent in sorted({self._parent(r) for _, r in pairs}):
                self.makedirs(parent, exist_ok=True)
            raise_first(self.client.put_many(pairs, self.concurrency))
        else:
            for parent in sorted({os.path.dirname(lp) for _, lp in pairs}):
                if parent:
                    os.makedirs(parent, exist_ok=True)
            raise_first(self.client.get_many(pairs, self.concurrency))

    def __reduce__(self) -> Any:
        return _make, (type(self), self.storage_args, self.storage_options)


def _make(cls: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
    return cls(*args, **kwargs)

