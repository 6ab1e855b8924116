"""Graph construction, PGA's MapReduce job: map tasks turn blocks of FASTQ into counted edges
and write one file per reduce partition (the shuffle, as files, so it is visible I/O on
whatever file system holds it); reduce tasks sum each partition's edges and write the de Bruijn
graph as adjacency lists.

Shuffle file: ``n`` (uint64), then ``n`` edge codes (uint64), then ``n`` counts (uint32).
Graph file, a line per vertex with out-edges: ``KMER<TAB>B:COUNT,B:COUNT...`` where ``B`` is
the base the next k-mer ends with (``ACGT<TAB>C:12`` is the edge ACGT -> CGTC seen 12 times).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

from . import kmers
from .graph import gather
from .store import Store

_TAIL = 1 << 16


@dataclass(frozen=True)
class Block:
    """A byte range of a FASTQ file: the records that start in it."""

    store: Store
    name: str
    start: int
    end: int
    size: int


def blocks(store: Store, names: List[str], block_size: int) -> List[Block]:
    out: List[Block] = []
    for name in names:
        size = store.size(name)
        for start in range(0, max(size, 1), block_size):
            out.append(Block(store, name, start, min(size, start + block_size), size))
    return out


def read_block(b: Block) -> bytes:
    """The whole records that start in ``b``: the range, widened to record boundaries."""
    fs, path = b.store.fs, b.store.path(b.name)
    lo = max(0, b.start - 1)
    tail = _TAIL
    while True:
        hi = min(b.size, b.end + tail)
        data: bytes = fs.cat_file(path, lo, hi)
        first = kmers.record_start(data, b.start - lo) if b.start > 0 else 0
        stop = kmers.record_start(data, b.end - lo) if b.end < b.size else len(data)
        if stop < len(data) or hi >= b.size:
            return data[first:stop]
        tail *= 4


def shuffle_name(m: int, r: int) -> str:
    return f"map-{m:05d}/part-{r:05d}.bin"


def graph_name(r: int) -> str:
    return f"part-{r:05d}.txt"


def map_task(
    m: int, block: Block, k: int, parts: int, shuffle: Store, combine: bool = True
) -> Dict[str, int]:
    """Edges of one block's reads on both strands, counted (the combiner) and written to one
    file per partition."""
    seqs = kmers.fastq_sequences(read_block(block))
    kept = kmers.acgt_only(seqs)
    edges = kmers.edges_of(kmers.both_strands(kept), k)
    if combine:
        uniq, counts = kmers.count(edges)
    else:
        uniq, counts = edges, np.ones(len(edges), dtype=np.uint32)
    dest = kmers.partition_of(uniq >> np.uint64(2), parts)
    order = np.argsort(dest, kind="stable")
    bounds = np.searchsorted(dest[order], np.arange(parts + 1))
    written = 0
    for r in range(parts):
        sel = order[bounds[r] : bounds[r + 1]]
        data = np.uint64(len(sel)).tobytes() + uniq[sel].tobytes() + counts[sel].tobytes()
        shuffle.write(shuffle_name(m, r), data)
        written += len(data)
    return {
        "reads": len(seqs),
        "reads_kept": len(kept),
        "bases": sum(len(s) for s in kept),
        "edges": len(edges),
        "shuffle_records": len(uniq),
        "shuffle_bytes": written,
    }


def _read_shuffle(data: bytes) -> Tuple[np.ndarray, np.ndarray]:
    n = int(np.frombuffer(data[:8], dtype=np.uint64)[0])
    if len(data) != 8 + 12 * n:
        raise ValueError(f"shuffle file of {len(data)} bytes does not hold {n} edges")
    edges = np.frombuffer(data[8 : 8 + 8 * n], dtype=np.uint64)
    counts = np.frombuffer(data[8 + 8 * n :], dtype=np.uint32)
    return edges, counts


def reduce_task(
    r: int, maps: int, k: int, min_count: int, shuffle: Store, graph: Store
) -> Dict[str, int]:
    """Partition ``r``'s edges from every map, summed, those seen ``min_count`` times or
    more written as adjacency lists."""
    got = [_read_shuffle(shuffle.read(shuffle_name(m, r))) for m in range(maps)]
    edges = np.concatenate([e for e, _ in got]) if got else np.zeros(0, np.uint64)
    counts = np.concatenate([c for _, c in got]) if got else np.zeros(0, np.uint32)
    uniq, inv = np.unique(edges, return_inverse=True)
    total = np.bincount(inv.ravel(), weights=counts, minlength=len(uniq)).astype(np.int64)
    keep = total >= min_count
    uniq, total = uniq[keep], total[keep]
    text = adjacency_text(uniq, total, k)
    graph.write(graph_name(r), text)
    return {"edges": len(uniq), "vertices": len(np.unique(uniq >> np.uint64(2))),
            "graph_bytes": len(text)}


def adjacency_text(edges: np.ndarray, counts: np.ndarray, k: int) -> bytes:
    """Sorted edges as adjacency lists, a line per source."""
    if len(edges) == 0:
        return b""
    src = edges >> np.uint64(2)
    starts = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])
    names = kmers.decode_many(src[starts], k)
    rows = kmers.ascii_of(names.ravel())
    letters = kmers.ascii_of((edges & np.uint64(3)).astype(np.uint8)).decode()
    items = [f"{b}:{c}" for b, c in zip(letters, counts.tolist())]
    ends = np.r_[starts[1:], len(edges)].tolist()
    lines = [
        f"{rows[i * k:(i + 1) * k].decode()}\t{','.join(items[s:e])}\n"
        for i, (s, e) in enumerate(zip(starts.tolist(), ends))
    ]
    return "".join(lines).encode()


def parse_adjacency(text: bytes, k: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The edges of adjacency lists: (source codes, target codes, counts), parsed with numpy
    over the whole text (a partition of a large graph has millions of successors)."""
    buf = np.frombuffer(text if text.endswith(b"\n") else text + b"\n", dtype=np.uint8)
    nl = np.flatnonzero(buf == ord("\n"))
    starts = np.r_[0, nl[:-1] + 1]
    full = nl > starts  # empty lines are skipped
    line_no = np.flatnonzero(full) + 1
    starts, nl = starts[full], nl[full]
    empty = np.zeros(0, dtype=np.uint64)
    if len(starts) == 0:
        return empty, empty, np.zeros(0, dtype=np.int64)

    def bad(line: int, what: str) -> ValueError:
        i = int(np.searchsorted(line_no, line))
        shown = bytes(buf[starts[i] : nl[i]]).decode(errors="replace")
        return ValueError(f"adjacency line {line}: {what}: {shown!r}")

    ok = (nl - starts >= k + 4) & (buf[np.minimum(starts + k, len(buf) - 1)] == ord("\t"))
    # (a line too short to hold a name reads its first byte k times, and fails below)
    names = buf[starts[:, None] + np.arange(k)[None, :] * ok[:, None]]
    codes = kmers.codes_of(names.tobytes()).reshape(-1, k)
    ok &= (codes != 255).all(axis=1)
    if not ok.all():
        raise bad(int(line_no[np.argmin(ok)]), "not KMER<TAB>B:COUNT,...")
    # the successors: items "B:COUNT" from after the tab, separated by commas (which, the
    # names being bases, are all in successor lists)
    comma = np.flatnonzero(buf == ord(","))
    item_start = np.sort(np.r_[starts + k + 1, comma + 1])
    item_end = np.sort(np.r_[comma, nl])
    owner = np.searchsorted(starts, item_start, side="right") - 1
    width = item_end - item_start - 2
    base = kmers.codes_of(buf[item_start].tobytes())
    good = ((width >= 1) & (width <= 18) & (base != 255)
            & (buf[np.minimum(item_start + 1, len(buf) - 1)] == ord(":")))
    if not good.all():
        raise bad(int(line_no[owner[np.argmin(good)]]), "bad successor")
    # each count: its digits by their powers of ten, summed per item
    pos = gather(np.arange(len(buf)), item_start + 2, width)
    digits = buf[pos].astype(np.int64) - ord("0")
    is_digit = (digits >= 0) & (digits <= 9)
    if not is_digit.all():
        item = np.repeat(np.arange(len(width)), width)[np.argmin(is_digit)]
        raise bad(int(line_no[owner[item]]), "bad successor")
    value = digits * (10 ** (np.repeat(item_end, width) - pos - 1))
    cnt = np.add.reduceat(value, np.r_[0, np.cumsum(width)[:-1]])
    shifts = np.arange(2 * (k - 1), -1, -2, dtype=np.uint64)
    ids = (codes.astype(np.uint64) << shifts[None, :]).sum(axis=1, dtype=np.uint64)
    src = ids[owner]
    mask = np.uint64((1 << (2 * k)) - 1)
    dst = ((src << np.uint64(2)) | base.astype(np.uint64)) & mask
    return src, dst, cnt.astype(np.int64)

