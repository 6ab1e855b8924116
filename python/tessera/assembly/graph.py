"""A graph partition as columns (numpy arrays), and the messages partitions send each other
between supersteps.

A partition holds the vertices whose id hashes to it (``kmers.partition_of``): their ids
(sorted), sequences (2-bit codes, concatenated, with offsets), weights (the summed counts of
the k-mer edges compressed into the vertex), their out-edges and their in-edges (an edge is
kept at both ends, so degrees are local). A vertex id is the k-mer code of the vertex it
started as; a compressed vertex keeps the id of the head that absorbed the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

from . import kmers
from .store import Store

Arrays = Dict[str, np.ndarray]
U64 = np.uint64


def empty(dtype: type) -> np.ndarray:
    return np.zeros(0, dtype=dtype)


def locate(sorted_keys: np.ndarray, q: np.ndarray) -> np.ndarray:
    """For each of ``q``, its index in ``sorted_keys``, or -1 if absent."""
    if len(sorted_keys) == 0:
        return np.full(len(q), -1, dtype=np.int64)
    i = np.searchsorted(sorted_keys, q)
    i = np.minimum(i, len(sorted_keys) - 1)
    return np.where(sorted_keys[i] == q, i, -1).astype(np.int64)


def lookup(keys: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``locate`` for keys in any order."""
    if len(keys) == 0:
        return np.full(len(q), -1, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    i = locate(keys[order], q)
    return np.where(i >= 0, order[np.maximum(i, 0)], -1)


def pair_index(a1: np.ndarray, a2: np.ndarray, b1: np.ndarray, b2: np.ndarray) -> np.ndarray:
    """For each pair ``(b1[i], b2[i])``, the index of the equal pair among the distinct pairs
    ``(a1, a2)``, or -1: one sort of both sets, no per-pair Python."""
    n = len(a1)
    if len(b1) == 0:
        return empty(np.int64)
    k1 = np.concatenate([a1, b1])
    k2 = np.concatenate([a2, b2])
    tag = np.r_[np.zeros(n, np.int8), np.ones(len(b1), np.int8)]
    order = np.lexsort((tag, k2, k1))
    s1, s2 = k1[order], k2[order]
    new = np.r_[True, (s1[1:] != s1[:-1]) | (s2[1:] != s2[:-1])]
    start = np.maximum.accumulate(np.where(new, np.arange(len(order)), 0))
    first = order[start]
    found = np.where(first < n, first, -1)
    out = np.empty(len(b1), dtype=np.int64)
    is_b = order >= n
    out[order[is_b] - n] = found[is_b]
    return out


def gather(src: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The segments ``src[starts[i]:starts[i]+lens[i]]``, concatenated."""
    total = int(lens.sum())
    if total == 0:
        return empty(src.dtype.type)
    shift = starts - np.cumsum(lens) + lens
    return src[np.repeat(shift, lens) + np.arange(total)]


def rank_lists(u: np.ndarray, v: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """List ranking in memory by pointer jumping, over the links ``u[i] -> v[i]`` (at most one
    out of and one into any id): for each ``v[i]``, the first id of its list (its head), its
    place in the list (1 for the one after the head) and whether it ends the list. A cycle is
    cut before its least id, which becomes its head."""
    nodes = np.unique(np.concatenate([u, v]))
    n = len(nodes)
    ui, vi = locate(nodes, u), locate(nodes, v)
    prv = np.full(n, -1, dtype=np.int64)
    prv[vi] = ui
    rounds = max(1, int(n).bit_length()) + 1
    root, dist = _jump(prv, rounds)
    cyc = prv[root] >= 0  # never reached a vertex without a predecessor
    if cyc.any():
        # the least index on each cycle, by jumping with minimum, is cut from its predecessor
        idx = np.arange(n)
        least = np.where(cyc, idx, n)
        ptr = np.where(cyc, prv, idx)
        for _ in range(rounds):
            least = np.minimum(least, least[ptr])
            ptr = ptr[ptr]
        prv[cyc & (least == idx)] = -1
        root, dist = _jump(prv, rounds)
    has_next = np.zeros(n, dtype=bool)
    has_next[prv[prv >= 0]] = True
    return nodes[root[vi]], dist[vi], ~has_next[vi]


def _jump(prv: np.ndarray, rounds: int) -> Tuple[np.ndarray, np.ndarray]:
    """Pointer jumping along ``prv`` (-1: none): each index's farthest predecessor reached in
    ``rounds`` doublings, and how far it is."""
    idx = np.arange(len(prv))
    ptr = np.where(prv >= 0, prv, idx)
    dist = (prv >= 0).astype(np.int64)
    for _ in range(rounds):
        dist = dist + dist[ptr]
        ptr = ptr[ptr]
    return ptr, dist


@dataclass
class Part:
    k: int
    ids: np.ndarray
    off: np.ndarray
    seq: np.ndarray
    w: np.ndarray
    osrc: np.ndarray
    odst: np.ndarray
    ocnt: np.ndarray
    isrc: np.ndarray
    idst: np.ndarray
    icnt: np.ndarray

    FIELDS = ("ids", "off", "seq", "w", "osrc", "odst", "ocnt", "isrc", "idst", "icnt")

    @classmethod
    def of_kmers(cls, k: int, ids: np.ndarray) -> "Part":
        ids = np.unique(ids.astype(U64))
        n = len(ids)
        return cls(
            k, ids, np.arange(0, n * k + 1, k, dtype=np.int64),
            kmers.decode_many(ids, k).ravel(), np.zeros(n, np.int64),
            empty(U64), empty(U64), empty(np.int64), empty(U64), empty(U64), empty(np.int64),
        )

    @classmethod
    def load(cls, store: Store, name: str) -> "Part":
        a = store.load_arrays(name)
        a["seq"] = kmers.unpack_codes(a["seq"], int(a["off"][-1]))
        return cls(int(a["k"][0]), *(a[f] for f in cls.FIELDS))

    def save(self, store: Store, name: str) -> int:
        """The state as a file of arrays, the sequences 2 bits a base (a superstep reads
        and writes every partition's state, so its size is much of a superstep's I/O)."""
        arrays = {f: getattr(self, f) for f in self.FIELDS}
        arrays["seq"] = kmers.pack_codes(self.seq)
        arrays["k"] = np.array([self.k])
        return store.save_arrays(name, arrays)

    # -- views ---------------------------------------------------------------------------

    @property
    def lens(self) -> np.ndarray:
        return np.diff(self.off)

    def degrees(self) -> Tuple[np.ndarray, np.ndarray]:
        n = len(self.ids)
        ind = np.bincount(locate(self.ids, self.idst), minlength=n)
        outd = np.bincount(locate(self.ids, self.osrc), minlength=n)
        return ind, outd

    def sole_edge(self, ends: np.ndarray) -> np.ndarray:
        """For each vertex, the index of one edge whose end (in ``ends``) it is (the only one
        when its degree is 1), or -1."""
        idx = np.full(len(self.ids), -1, dtype=np.int64)
        idx[locate(self.ids, ends)] = np.arange(len(ends))
        return idx

    def sequences(self, idx: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Lengths and concatenated codes of vertices ``idx``."""
        lens = self.lens[idx]
        return lens, gather(self.seq, self.off[idx], lens)

    # -- changes ---------------------------------------------------------------------------

    def add_vertices(self, ids: np.ndarray) -> None:
        new = np.setdiff1d(ids.astype(U64), self.ids)
        if len(new) == 0:
            return
        extra = Part.of_kmers(self.k, new)
        all_ids = np.concatenate([self.ids, extra.ids])
        order = np.argsort(all_ids, kind="stable")
        src = np.concatenate([self.seq, extra.seq])
        starts = np.concatenate([self.off[:-1], extra.off[:-1] + len(self.seq)])[order]
        lens = np.concatenate([self.lens, extra.lens])[order]
        self.ids = all_ids[order]
        self.seq = gather(src, starts, lens)
        self.off = np.r_[0, np.cumsum(lens)].astype(np.int64)
        self.w = np.concatenate([self.w, extra.w])[order]

    def remove_vertices(self, gone: np.ndarray) -> None:
        """Drops vertices ``gone`` (ids; absent ones ignored) and the edges kept with them."""
        if len(gone) == 0:
            return
        g = np.unique(gone)
        keep = locate(g, self.ids) < 0
        lens = self.lens[keep]
        self.seq = gather(self.seq, self.off[:-1][keep], lens)
        self.off = np.r_[0, np.cumsum(lens)].astype(np.int64)
        self.ids, self.w = self.ids[keep], self.w[keep]
        ko = locate(g, self.osrc) < 0
        self.osrc, self.odst, self.ocnt = self.osrc[ko], self.odst[ko], self.ocnt[ko]
        ki = locate(g, self.idst) < 0
        self.isrc, self.idst, self.icnt = self.isrc[ki], self.idst[ki], self.icnt[ki]

    def drop_out(self, src: np.ndarray, dst: np.ndarray) -> None:
        i = pair_index(self.osrc, self.odst, src, dst)
        keep = np.ones(len(self.osrc), dtype=bool)
        keep[i[i >= 0]] = False
        self.osrc, self.odst, self.ocnt = self.osrc[keep], self.odst[keep], self.ocnt[keep]

    def drop_in(self, dst: np.ndarray, src: np.ndarray) -> None:
        i = pair_index(self.idst, self.isrc, dst, src)
        keep = np.ones(len(self.idst), dtype=bool)
        keep[i[i >= 0]] = False
        self.isrc, self.idst, self.icnt = self.isrc[keep], self.idst[keep], self.icnt[keep]

    def rename_in(self, dst: np.ndarray, old: np.ndarray, new: np.ndarray) -> None:
        i = pair_index(self.idst, self.isrc, dst, old)
        ok = i >= 0
        self.isrc = self.isrc.copy()
        self.isrc[i[ok]] = new[ok]

    def extend(self, idx: np.ndarray, add_lens: np.ndarray, add_codes: np.ndarray) -> None:
        """Appends to the sequence of each vertex ``idx[i]`` the next ``add_lens[i]`` codes of
        ``add_codes``."""
        n = len(self.ids)
        src = np.concatenate([self.seq, add_codes])
        add_start = len(self.seq) + np.cumsum(add_lens) - add_lens
        starts = np.concatenate([self.off[:-1], add_start])
        lens = np.concatenate([self.lens, add_lens])
        owner = np.concatenate([np.arange(n), idx])
        kind = np.r_[np.zeros(n, np.int8), np.ones(len(idx), np.int8)]
        order = np.lexsort((kind, owner))
        self.seq = gather(src, starts[order], lens[order])
        new_lens = self.lens.copy()
        np.add.at(new_lens, idx, add_lens)
        self.off = np.r_[0, np.cumsum(new_lens)].astype(np.int64)

    def text(self) -> bytes:
        """The partition as text: ``ID<TAB>SEQUENCE<TAB>WEIGHT<TAB>SUCC:COUNT,...``."""
        order = np.argsort(self.osrc, kind="stable")
        src, dst, cnt = self.osrc[order], self.odst[order], self.ocnt[order]
        bounds = np.searchsorted(src, self.ids, side="left").tolist()
        ends = np.searchsorted(src, self.ids, side="right").tolist()
        dst_l, cnt_l = dst.tolist(), cnt.tolist()
        codes = kmers.ascii_of(self.seq).decode()
        off = self.off.tolist()
        lines = []
        for i, (vid, w) in enumerate(zip(self.ids.tolist(), self.w.tolist())):
            succ = ",".join(f"{d}:{c}" for d, c in zip(dst_l[bounds[i]:ends[i]],
                                                       cnt_l[bounds[i]:ends[i]]))
            lines.append(f"{vid}\t{codes[off[i]:off[i + 1]]}\t{w}\t{succ}\n")
        return "".join(lines).encode()


class Outbox:
    """Messages from one partition, by destination partition and kind; each kind is a set of
    equally long columns (plus, for sequences, a column of codes of the summed lengths)."""

    def __init__(self, parts: int) -> None:
        self.parts = parts
        self.boxes: List[Dict[str, List[np.ndarray]]] = [{} for _ in range(parts)]

    def send(self, dest_ids: np.ndarray, columns: Dict[str, np.ndarray]) -> None:
        """Sends row ``i`` of ``columns`` to the partition of vertex ``dest_ids[i]``."""
        if len(dest_ids) == 0:
            return
        for q, sel in self.split(dest_ids):
            for name, col in columns.items():
                self.boxes[q].setdefault(name, []).append(col[sel])

    def split(self, dest_ids: np.ndarray) -> List[Tuple[int, np.ndarray]]:
        """The rows for each partition that vertices ``dest_ids`` go to (one sort, not a
        pass over the rows for each partition)."""
        dest = kmers.partition_of(dest_ids, self.parts)
        order = np.argsort(dest, kind="stable")
        bounds = np.searchsorted(dest[order], np.arange(self.parts + 1)).tolist()
        return [(q, order[bounds[q]:bounds[q + 1]]) for q in range(self.parts)
                if bounds[q + 1] > bounds[q]]

    def send_vertices(
        self, dest_ids: np.ndarray, part: "Part", idx: np.ndarray, columns: Dict[str, np.ndarray],
        prefix: str,
    ) -> None:
        """Like ``send``, with the sequences of vertices ``idx`` of ``part`` along (columns
        ``PREFIX_len`` and ``PREFIX_seq``)."""
        for q, sel in self.split(dest_ids):
            lens, codes = part.sequences(idx[sel])
            cols = {name: col[sel] for name, col in columns.items()}
            self.send_to(q, {**cols, f"{prefix}_len": lens, f"{prefix}_seq": codes})

    def send_to(self, q: int, columns: Dict[str, np.ndarray]) -> None:
        for name, col in columns.items():
            self.boxes[q].setdefault(name, []).append(col)

    def write(self, store: Store, step_dir: str, src: int) -> int:
        written = 0
        for q, box in enumerate(self.boxes):
            if box:
                arrays = {name: np.concatenate(cols) for name, cols in box.items()}
                written += store.save_arrays(f"{step_dir}/to-{q:05d}/from-{src:05d}.npz", arrays)
        return written


def inbox(store: Store, step_dir: str, p: int) -> Arrays:
    """Every message sent to partition ``p`` in the step at ``step_dir``, kind by kind, in
    the order of the senders."""
    got: Dict[str, List[np.ndarray]] = {}
    box = f"{step_dir}/to-{p:05d}"
    for name in store.names(box):
        for kind, col in store.load_arrays(f"{box}/{name}").items():
            got.setdefault(kind, []).append(col)
    return {kind: np.concatenate(cols) for kind, cols in got.items()}
