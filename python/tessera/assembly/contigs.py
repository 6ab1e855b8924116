"""Simplified graphs in a canonical form (to compare two assemblers' exactly), contigs as
FASTA, and assembly statistics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from .kmers import revcomp

# id -> (sequence, weight); and (source id, target id, count)
Nodes = Dict[int, Tuple[str, int]]
Edges = List[Tuple[int, int, int]]


@dataclass(frozen=True)
class Canonical:
    """A graph named by sequences: vertices ``(sequence, weight)`` and edges ``(source
    sequence, target sequence, count)``, sorted. A vertex that is a cycle on its own (its one
    in-edge and one out-edge a loop) starts at its least rotation and has the loop's count in
    its weight, since where a cycle was cut depends on the order of merges."""

    vertices: Tuple[Tuple[str, int], ...]
    edges: Tuple[Tuple[str, str, int], ...]


def least_rotation(s: str) -> int:
    """Booth's algorithm: the start of the lexicographically least rotation of ``s``."""
    d = s + s
    f = [-1] * len(d)
    k = 0
    for j in range(1, len(d)):
        i = f[j - k - 1]
        while i != -1 and d[j] != d[k + i + 1]:
            if d[j] < d[k + i + 1]:
                k = j - i - 1
            i = f[i]
        if i == -1 and d[j] != d[k + i + 1]:
            if d[j] < d[k + i + 1]:
                k = j
            f[j - k] = -1
        else:
            f[j - k] = i + 1
    return k


def rotate(seq: str, k: int, by: Optional[int] = None) -> str:
    """A cyclic vertex's sequence (its circle, then the circle's first k-1 bases again)
    started at rotation ``by`` (default: the least)."""
    circle = seq[: len(seq) - (k - 1)]
    if not circle:
        return seq
    r = least_rotation(circle) if by is None else by
    turned = circle[r:] + circle[:r]
    return turned + turned[: k - 1]


def cycles(nodes: Nodes, edges: Edges) -> Dict[int, int]:
    """The vertices that are a cycle on their own, with their loop's count."""
    ins: Dict[int, int] = {}
    outs: Dict[int, int] = {}
    loop: Dict[int, int] = {}
    for s, d, c in edges:
        outs[s] = outs.get(s, 0) + 1
        ins[d] = ins.get(d, 0) + 1
        if s == d:
            loop[s] = c
    return {v: c for v, c in loop.items() if ins.get(v) == 1 and outs.get(v) == 1}


def canonical(nodes: Nodes, edges: Edges, k: int) -> Canonical:
    loops = cycles(nodes, edges)
    name: Dict[int, str] = {}
    verts: List[Tuple[str, int]] = []
    for v, (seq, w) in nodes.items():
        if v in loops:
            seq, w = rotate(seq, k), w + loops[v]
        name[v] = seq
        verts.append((seq, w))
    es = [(name[s], name[d], 0 if s in loops else c) for s, d, c in edges]
    return Canonical(tuple(sorted(verts)), tuple(sorted(es)))


def contigs(nodes: Nodes, edges: Edges, k: int, min_len: int = 0) -> List[Tuple[str, int]]:
    """The vertices as contigs ``(sequence, weight)``, each in its canonical orientation (the
    lesser of it and its reverse complement; a cycle also at its least rotation), a contig
    and its reverse complement (the other strand's vertex) once, sorted by length (longest
    first), then sequence."""
    loops = cycles(nodes, edges)
    got: Dict[str, int] = {}
    for v, (seq, w) in nodes.items():
        if len(seq) < min_len:
            continue
        if v in loops:
            seq = min(rotate(seq, k), rotate(revcomp(seq), k))
        else:
            seq = min(seq, revcomp(seq))
        got[seq] = max(got.get(seq, 0), w)  # the two strands' copies weigh the same
    return sorted(got.items(), key=lambda x: (-len(x[0]), x[0]))


def fasta(contigs: Iterable[Tuple[str, int]], width: int = 80) -> str:
    out: List[str] = []
    for i, (seq, w) in enumerate(contigs, 1):
        out.append(f">contig{i} length={len(seq)} weight={w}\n")
        out.extend(seq[j : j + width] + "\n" for j in range(0, len(seq), width))
    return "".join(out)


def read_fasta(text: str) -> List[str]:
    seqs: List[str] = []
    cur: List[str] = []
    for line in text.splitlines():
        if line.startswith(">"):
            if cur:
                seqs.append("".join(cur))
            cur = []
        elif line.strip():
            cur.append(line.strip())
    if cur:
        seqs.append("".join(cur))
    return seqs


def stats(lengths: Sequence[int], min_len: int = 0) -> Dict[str, int]:
    """Contig count, total length, largest contig and N50 (the length L such that contigs of
    L or longer hold half the total) of the contigs at least ``min_len`` long."""
    ls = sorted((n for n in lengths if n >= min_len), reverse=True)
    total = sum(ls)
    n50, acc = 0, 0
    for n in ls:
        acc += n
        if 2 * acc >= total:
            n50 = n
            break
    return {"contigs": len(ls), "total": total, "largest": ls[0] if ls else 0, "n50": n50,
            "min_length": min_len}


def parse_final(text: str) -> Tuple[Nodes, Edges]:
    """A partition of the final graph as the Dask pipeline writes it (``graph.Part.text``)."""
    nodes: Nodes = {}
    edges: Edges = []
    for line in text.splitlines():
        if not line:
            continue
        vid, seq, w, succ = line.split("\t")
        v = int(vid)
        nodes[v] = (seq, int(w))
        for item in filter(None, succ.split(",")):
            d, c = item.split(":")
            edges.append((v, int(d), int(c)))
    return nodes, edges
