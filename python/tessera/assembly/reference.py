"""The single-process reference assembler, the Dask pipeline's oracle: the same graph and the
same simplification rules, written plainly with dictionaries and strings (a chain is
compressed by walking it from its start), so that the pipeline's partitions, messages and
random rounds are checked against something that has none."""

from __future__ import annotations

from collections import Counter
from typing import Dict, Iterable, List, Tuple

from . import kmers
from .contigs import Edges, Nodes
from .supersteps import Params, bubble_losers, coverage

Adjacency = Dict[str, Dict[str, int]]


def de_bruijn(reads: Iterable[bytes], k: int, min_count: int) -> Adjacency:
    """k-mer -> {next base: count} over the A/C/G/T-only reads and their reverse
    complements, edges seen ``min_count`` times or more."""
    counts: Counter[str] = Counter()
    for read in kmers.both_strands(kmers.acgt_only(list(reads))):
        s = read.decode()
        for i in range(len(s) - k):
            counts[s[i : i + k + 1]] += 1
    adj: Adjacency = {}
    for e, c in counts.items():
        if c >= min_count:
            adj.setdefault(e[:k], {})[e[k]] = c
    return adj


def read_adjacency(text: str) -> Adjacency:
    adj: Adjacency = {}
    for line in text.splitlines():
        if line:
            name, _, succ = line.partition("\t")
            adj[name] = {b: int(c) for b, _, c in (x.partition(":") for x in succ.split(","))}
    return adj


class Graph:
    """A de Bruijn graph being simplified: vertex id -> sequence, weight, successors and
    predecessors (id -> count)."""

    def __init__(self, adj: Adjacency, k: int) -> None:
        self.k = k
        self.seq: Dict[int, str] = {}
        self.w: Dict[int, int] = {}
        self.out: Dict[int, Dict[int, int]] = {}
        self.inn: Dict[int, Dict[int, int]] = {}
        for name, succ in adj.items():
            for b, c in succ.items():
                self._edge(name, name[1:] + b, c)

    def _vertex(self, name: str) -> int:
        v = kmers.encode(name)
        if v not in self.seq:
            self.seq[v], self.w[v], self.out[v], self.inn[v] = name, 0, {}, {}
        return v

    def _edge(self, a: str, b: str, c: int) -> None:
        u, v = self._vertex(a), self._vertex(b)
        self.out[u][v] = c
        self.inn[v][u] = c

    def _succ(self, u: int) -> int:
        return next(iter(self.out[u]))

    def _mergeable(self, u: int) -> bool:
        if len(self.out[u]) != 1:
            return False
        v = self._succ(u)
        return v != u and len(self.inn[v]) == 1

    def _absorb(self, u: int, v: int) -> None:
        c = self.out[u].pop(v)
        self.seq[u] += self.seq[v][self.k - 1 :]
        self.w[u] += self.w[v] + c
        for d, dc in self.out[v].items():
            self.inn[d][u] = self.inn[d].pop(v)
            self.out[u][d] = dc
        for table in (self.seq, self.w, self.out, self.inn):
            del table[v]

    def _remove(self, v: int) -> None:
        for p in self.inn[v]:
            if p != v and p in self.out:
                self.out[p].pop(v, None)
        for d in self.out[v]:
            if d != v and d in self.inn:
                self.inn[d].pop(v, None)
        for table in (self.seq, self.w, self.out, self.inn):
            del table[v]

    def compress(self) -> None:
        """Every maximal chain into one vertex: first from each chain's start, then what is
        left (cycles with no way in)."""
        def is_start(u: int) -> bool:
            if len(self.inn[u]) != 1:
                return True
            p = next(iter(self.inn[u]))
            return p == u or len(self.out[p]) != 1

        for u in [u for u in self.seq if is_start(u)]:
            while u in self.seq and self._mergeable(u):
                self._absorb(u, self._succ(u))
        for u in list(self.seq):
            while u in self.seq and self._mergeable(u):
                self._absorb(u, self._succ(u))

    def remove_tips(self, prm: Params) -> int:
        gone = [
            v for v, s in self.seq.items()
            if len(s) < prm.tips_below and (not self.inn[v] or not self.out[v])
        ]
        for v in gone:
            self._remove(v)
        return len(gone)

    def remove_bubbles(self, prm: Params) -> int:
        groups: Dict[Tuple[int, int], List[int]] = {}
        for b, s in self.seq.items():
            if len(self.inn[b]) == 1 and len(self.out[b]) == 1 and len(s) < prm.bubbles_below:
                p, d = next(iter(self.inn[b])), self._succ(b)
                if p != b and d != b:
                    groups.setdefault((p, d), []).append(b)
        gone: List[int] = []
        for members in groups.values():
            if len(members) > 1:
                branches = [
                    (coverage(self.w[b], len(self.seq[b]), self.k), self.seq[b].encode(), b)
                    for b in members
                ]
                gone.extend(bubble_losers(branches, prm))
        for b in gone:
            self._remove(b)
        return len(gone)

    def result(self) -> Tuple[Nodes, Edges]:
        nodes = {v: (s, self.w[v]) for v, s in self.seq.items()}
        edges = [(u, v, c) for u, succ in self.out.items() for v, c in succ.items()]
        return nodes, edges


def simplify(adj: Adjacency, prm: Params) -> Tuple[Nodes, Edges]:
    """PGA's simplification, in the pipeline's order: compress, then rounds of tips and
    bubbles (each followed by compression), until a round removes nothing."""
    g = Graph(adj, prm.k)
    g.compress()
    for _ in range(prm.rounds):
        tips = g.remove_tips(prm)
        if tips:
            g.compress()
        bubbles = g.remove_bubbles(prm)
        if bubbles:
            g.compress()
        if not tips and not bubbles:
            break
    return g.result()
