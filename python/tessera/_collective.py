"""Collective output: N writers (threads, processes, MPI ranks, nodes) append records to one
output, and finalisation makes it one ordinary Tessera file holding all of them, sorted by key
when records carry keys (docs/SEMANTICS.md, "Collective output").

>>> import tessera
>>> w = tessera.collective("/out/hits.tsv", writers=4, rank=rank, sorted=True)  # doctest: +SKIP
>>> for key, line in results:                                                   # doctest: +SKIP
...     w.append(line, key)
>>> w.finalize()                                                                # doctest: +SKIP
{'size': ..., 'records': ..., ...}

Keys are bytes compared bytewise: encode numbers so that byte order is numeric order, e.g.
``pos.to_bytes(8, "big")`` for non-negative integers.

Fixed-size records placed by key need no sort and no merge: with ``record_size=S`` and
``key_range=(LO, HI)``, ``w.put(k, record)`` puts the record of key ``k`` at offset
``(k - LO) * S`` of the output, written in place as buffers fill; a key nobody gave reads as
zeros, a key given twice fails every writer.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import TracebackType
from typing import List, Optional, Sequence, Tuple, Type, Union

from . import _tessera
from ._client import Buffer, Client, _as_bytes

CollectiveError = _tessera.CollectiveError


@dataclass(frozen=True)
class CollectiveResult:
    """What finalisation made: the output's ``size`` (bytes) and ``records``, the
    ``coordinators`` (ranks, in range order), this writer's ``coordinator`` index (or None),
    the ``runs`` it wrote, and times in seconds: ``waited`` for the other writers,
    ``aggregation`` from then until the output was in place, this writer's own ``merge``
    (if a coordinator) and its merge ``passes``."""

    path: str
    size: int
    records: int
    coordinators: List[int]
    coordinator: Optional[int]
    runs: int
    waited: float
    aggregation: float
    merge: Optional[float]
    passes: Optional[int]


class Collective:
    """One writer of a collective output (made by :func:`tessera.collective`). Use it from
    one thread; other threads are other writers, with writers of their own.

    ``append`` buffers (no I/O); at ``threshold`` bytes the buffer is sorted and written out
    as a run in the background while the caller goes on (``flush`` starts that now, ``wait``
    waits for it, ``test`` says whether it is done). ``finalize`` waits for every writer and
    returns once the output is in place. In a ``with`` block, the writer finalises at the end,
    or aborts if the block raises: the other writers then fail with
    :class:`CollectiveError` naming it. A writer dropped without either aborts too.
    """

    def __init__(self, raw: _tessera.Collective) -> None:
        self._raw = raw
        self._result: Optional[CollectiveResult] = None

    @property
    def path(self) -> str:
        return self._raw.path

    @property
    def rank(self) -> int:
        return self._raw.rank

    @property
    def writers(self) -> int:
        return self._raw.writers

    def append(self, record: Buffer, key: Optional[Buffer] = None) -> None:
        """Appends ``record`` (bytes), with its ``key`` (bytes) if the output is sorted."""
        self._raw.append(_as_bytes(record), None if key is None else _as_bytes(key))

    def append_many(
        self, records: Sequence[Buffer], keys: Optional[Sequence[Buffer]] = None
    ) -> None:
        """Appends many records at once (and their keys, one per record)."""
        self._raw.append_many(
            [_as_bytes(r) for r in records],
            None if keys is None else [_as_bytes(k) for k in keys],
        )

    def put(self, key: int, record: Buffer) -> None:
        """Puts the fixed-size ``record`` of ``key`` (an output opened with ``record_size``
        and ``key_range``). A key outside the range or a record of another size raises
        ``ValueError``; a key given twice raises :class:`CollectiveError` here and in every
        other writer."""
        self._raw.put(key, _as_bytes(record))

    def put_many(self, keys: Sequence[int], records: Union[Sequence[Buffer], Buffer]) -> None:
        """Puts many fixed-size records, one per key: a sequence of records, or one
        bytes-like object holding them one after another."""
        if isinstance(records, (bytes, bytearray, memoryview)):
            self._raw.put_packed(list(keys), _as_bytes(records))
        else:
            self._raw.put_many(list(keys), [_as_bytes(r) for r in records])

    def flush(self) -> None:
        """Starts writing the buffer now, as a run or in place (ARCFlush)."""
        self._raw.flush()

    def wait(self) -> None:
        """Waits until every run issued is written (ARCWait)."""
        self._raw.wait()

    def test(self) -> bool:
        """Whether every run issued is written, without waiting (ARCTest)."""
        return self._raw.test()

    def finalize(self) -> CollectiveResult:
        """Writes what is left, waits for every writer and takes part in aggregation;
        returns once the output is in place. Raises :class:`CollectiveError` if a writer
        died, left or failed: the output then never appears."""
        if self._result is None:
            d = self._raw.finalize()
            self._result = CollectiveResult(path=self.path, **d)
        return self._result

    def abort(self, reason: str = "aborted") -> None:
        """Leaves without finishing: every other writer fails, naming this one and
        ``reason``."""
        self._raw.abort(reason)

    def __enter__(self) -> "Collective":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if exc is not None:
            self.abort(f"{exc_type.__name__ if exc_type else 'error'}: {exc}")
        else:
            self.finalize()

    def __repr__(self) -> str:
        return f"<tessera.Collective {self.path!r} rank {self.rank} of {self.writers}>"


def _key_range(keys: Union[Tuple[int, int], range, None]) -> Optional[Tuple[int, int]]:
    if isinstance(keys, range):
        if keys.step != 1:
            raise ValueError(f"a key range has a step of 1, not {keys.step}")
        return (keys.start, keys.stop)
    return keys


_default: Optional[Client] = None
_default_lock = threading.Lock()


def _client(client: Optional[Client]) -> Client:
    global _default
    if client is not None:
        return client
    with _default_lock:
        if _default is None:
            _default = Client()
        return _default


class _CollectiveApi:
    """``tessera.collective(path, writers, rank, ...)`` joins a collective output;
    ``tessera.collective.wait_output(path)`` waits for one."""

    def __call__(
        self,
        path: str,
        writers: int,
        rank: int,
        *,
        client: Optional[Client] = None,
        sorted: bool = False,
        threshold: int = 16 << 20,
        top: Optional[int] = None,
        strategy: str = "least-loaded",
        coordinators_per_node: int = 1,
        memory: int = 64 << 20,
        timeout: float = 10.0,
        join_timeout: float = 300.0,
        record_size: Optional[int] = None,
        key_range: Union[Tuple[int, int], range, None] = None,
        order: str = "rank",
    ) -> Collective:
        """Joins the collective output ``path`` (its directory must exist) as writer
        ``rank`` of ``writers``. Every writer must pass the same ``writers``, ``sorted``,
        ``order``, ``top``, ``strategy`` and ``coordinators_per_node``.

        ``sorted``: records carry keys and the output is sorted by them (ties: by rank,
        then append order); ``threshold``: bytes buffered before a run is written;
        ``top``: keep only the first ``top`` records; ``strategy``: how coordinators are
        chosen, ``least-loaded``, ``least`` / ``most`` (least / most local data, ARC_LEAST /
        ARC_MOST), ``least-rr`` / ``most-rr`` (the same, nodes in turn);
        ``coordinators_per_node``: coordinators per node (host name); ``memory``: a
        coordinator's merge buffers; ``timeout``: seconds of silence after which a writer is
        taken for dead; ``join_timeout``: seconds finalisation waits for a writer that never
        joined. ``record_size`` and ``key_range`` (``(LO, HI)`` or ``range(LO, HI)``, HI
        excluded): fixed-size records put by key (:meth:`Collective.put`), each at offset
        ``(key - LO) * record_size``; neither ``sorted`` nor ``top`` then. ``order``, for
        records without keys: ``rank`` (rank after rank, the same output every time) or
        ``arrival`` (each buffer written once, at once, where the output ends when it
        arrives: faster, writers' buffers interleaved; not with ``top``). ``client``: the
        connection (default: one shared client, configured as :class:`tessera.Client` is
        without arguments)."""
        raw = _client(client)._inner.collective(
            path,
            writers,
            rank,
            sorted,
            threshold,
            top,
            strategy,
            coordinators_per_node,
            memory,
            timeout,
            join_timeout,
            record_size,
            _key_range(key_range),
            order,
        )
        return Collective(raw)

    def wait_output(
        self, path: str, *, client: Optional[Client] = None, timeout: Optional[float] = None
    ) -> int:
        """Waits until the collective output ``path`` is in place and returns its size;
        raises :class:`CollectiveError` with the reason its writers left if they failed, or
        if ``timeout`` seconds pass first. A file already at ``path`` before its writers
        joined counts as in place."""
        return _client(client)._inner.wait_output(path, timeout)


collective = _CollectiveApi()
