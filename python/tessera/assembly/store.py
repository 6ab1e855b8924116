"""Where the pipeline's files live: any fsspec URL (``tessera://...`` by default, a local
directory for the shuffle in benchmarks), with the file systems cached per process so that a
Dask worker opens one Tessera client and traces (``trace=DIR``) through it."""

from __future__ import annotations

import json
import posixpath
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

import fsspec
import numpy as np

_OPEN: Dict[Tuple[str, Tuple[Tuple[str, Any], ...]], Any] = {}


@dataclass(frozen=True)
class Store:
    """A directory named by URL, with the storage options its file system takes (for
    ``tessera://``: manager, secret, trace)."""

    url: str
    options: Dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def fs(self) -> Any:
        protocol = self.url.split("://", 1)[0] if "://" in self.url else "file"
        opts = self.options if protocol == "tessera" else {}
        key = (protocol, tuple(sorted(opts.items())))
        fs = _OPEN.get(key)
        if fs is None:
            fs = fsspec.filesystem(protocol, skip_instance_cache=True, **opts)
            _OPEN[key] = fs
        return fs

    @property
    def root(self) -> str:
        path: str = self.fs._strip_protocol(self.url)
        return path.rstrip("/") or "/"

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *[p for p in parts if p])

    def sub(self, *parts: str) -> "Store":
        base = self.url.rstrip("/")
        return Store("/".join([base, *parts]), self.options)

    def write(self, name: str, data: bytes) -> None:
        path = self.path(name)
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        with self.fs.open(path, "wb") as f:
            f.write(data)

    def read(self, name: str) -> bytes:
        data: bytes = self.fs.cat_file(self.path(name))
        return data

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self.path(name)))

    def names(self, name: str) -> List[str]:
        """The names in directory ``name`` (empty if it does not exist)."""
        path = self.path(name)
        if not self.fs.exists(path):
            return []
        return sorted(posixpath.basename(p.rstrip("/")) for p in self.fs.ls(path, detail=False))

    def remove(self, name: str) -> None:
        path = self.path(name)
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def size(self, name: str) -> int:
        return int(self.fs.info(self.path(name))["size"])

    def save_arrays(self, name: str, arrays: Dict[str, np.ndarray]) -> int:
        data = pack(arrays)
        self.write(name, data)
        return len(data)

    def load_arrays(self, name: str) -> Dict[str, np.ndarray]:
        return unpack(self.read(name), f"{self.url}/{name}")


_MAGIC = b"TASM1\n"


def pack(arrays: Dict[str, np.ndarray]) -> bytes:
    """Named one-dimensional arrays as bytes: a magic, the length of a JSON list of (name,
    dtype, length), the list, then the arrays' bytes, each 8-byte aligned (npz is slow to
    open: a zip, and a header parsed per array)."""
    cols = [(k, np.ascontiguousarray(v).reshape(-1)) for k, v in arrays.items()]
    head = json.dumps([[k, v.dtype.str, len(v)] for k, v in cols]).encode()
    parts = [_MAGIC, struct.pack("<I", len(head)), head]
    size = len(_MAGIC) + 4 + len(head)
    for _, v in cols:
        pad = -size % 8
        parts.append(b"\0" * pad)
        parts.append(v.tobytes())
        size += pad + v.nbytes
    return b"".join(parts)


def unpack(data: bytes, what: str = "arrays") -> Dict[str, np.ndarray]:
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + 4:
        raise ValueError(f"{what} is not a file of arrays")
    (n,) = struct.unpack_from("<I", data, len(_MAGIC))
    pos = len(_MAGIC) + 4
    head = json.loads(data[pos : pos + n])
    pos += n
    buf = bytearray(data)  # writable arrays
    out: Dict[str, np.ndarray] = {}
    for name, dtype, length in head:
        pos += -pos % 8
        dt = np.dtype(dtype)
        if pos + dt.itemsize * length > len(buf):
            raise ValueError(f"{what} is cut short")
        out[name] = np.frombuffer(buf, dtype=dt, count=length, offset=pos)
        pos += dt.itemsize * length
    return out


def close_filesystems() -> None:
    """Forgets the file systems this process opened, ending their traces (a traced run's
    last act on each worker, so that its trace is whole before the traces are merged)."""
    for fs in _OPEN.values():
        client = getattr(fs, "client", None)
        if client is not None and client.trace_file is not None:
            client.stop_trace()
    _OPEN.clear()
