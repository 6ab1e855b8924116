"""Graph simplification as bulk-synchronous supersteps (PGA's Giraph stage, on Dask).

A superstep is one task per partition: it reads the partition's state and the messages sent
to it in the previous superstep, applies the messages (edges added, renamed or dropped,
vertices removed), does its step, and writes its new state and the messages it sends; the next
superstep starts when every task of this one is done. Everything goes through files, so a task
can run again (a retry after its worker died) and write the same output: its randomness is a
hash of the vertex, the round and the seed.

- compression (two supersteps a round, PGA's randomised list ranking): every vertex is a head
  or a tail by a coin (one that cannot be absorbed, in-degree not 1, is a head; one that cannot
  absorb, out-degree not 1, a tail); a tail ``v`` with one in-edge, from a head ``u`` with one
  out-edge, is absorbed by ``u`` (``u`` takes ``v``'s sequence past the k-1 overlap, its weight
  and its out-edges; ``v``'s successors are told to rename their in-edge). The rounds go on
  until no edge ``u -> v`` with out(u) = 1 and in(v) = 1 is left, or until fewer than
  ``finish_below`` are: those lists are then ranked in one task and joined at their heads
  (three supersteps). Either way the result is the maximal unitigs, whatever the coins.
- tips (one superstep, removals applied at the next): vertices shorter than ``tip_len`` bases
  with no in-edge or no out-edge, all removed at once.
- bubbles (two supersteps): short vertices with one in-edge and one out-edge tell their
  predecessor; among those with the same predecessor and successor, the best covered is kept
  and those within the edit distance of it are removed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List

import numpy as np

from . import kmers
from .edit import similar
from .graph import (
    U64, Arrays, Outbox, Part, empty, gather, inbox, locate, lookup, pair_index, rank_lists,
)
from .shuffle import graph_name, parse_adjacency
from .store import Store


@dataclass(frozen=True)
class Params:
    k: int = 31
    parts: int = 8
    seed: int = 1
    tip_len: int = 0  # 0: 2k
    bubble_len: int = 0  # 0: 3k
    similarity: float = 0.1
    rounds: int = 3
    # chain compression's random rounds stop once fewer mergeable edges are left (they are
    # then ranked in one task); 0: rounds to the end
    finish_below: int = 100_000

    @property
    def tips_below(self) -> int:
        return self.tip_len or 2 * self.k

    @property
    def bubbles_below(self) -> int:
        return self.bubble_len or 3 * self.k


def step_dir(step: int) -> str:
    return f"steps/s{step:05d}"


def heads(ids: np.ndarray, rnd: int, seed: int) -> np.ndarray:
    salt = kmers.mix(np.array([rnd * 0x100000001B3 + seed], dtype=U64))[0]
    return np.asarray((kmers.mix(ids ^ salt) & U64(1)) == U64(1), dtype=bool)


# -- applying messages ---------------------------------------------------------------------


def apply(part: Part, m: Arrays) -> None:
    if "ia_dst" in m:
        part.add_vertices(m["ia_dst"])
        part.idst = np.concatenate([part.idst, m["ia_dst"]])
        part.isrc = np.concatenate([part.isrc, m["ia_src"]])
        part.icnt = np.concatenate([part.icnt, m["ia_cnt"]])
    if "ir_dst" in m:
        part.rename_in(m["ir_dst"], m["ir_old"], m["ir_new"])
    if "id_dst" in m:
        part.drop_in(m["id_dst"], m["id_src"])
    if "od_src" in m:
        part.drop_out(m["od_src"], m["od_dst"])
    if "kill" in m:
        part.remove_vertices(m["kill"])
    if "jn_head" in m:
        # the vertices of lists ranked in one task, to their heads, in order
        order = np.lexsort((m["jn_rank"], m["jn_head"]))
        starts = np.cumsum(m["jn_len"]) - m["jn_len"]
        absorb(part, m["jn_head"][order], m["jn_id"][order], m["jn_seq"], starts[order],
               m["jn_len"][order], m["jn_w"][order], received_edges(m, "je"))


# -- the steps -----------------------------------------------------------------------------


def load(out: Outbox, p: int, prm: Params, graph: Store) -> Part:
    """The partition's vertices with out-edges, from the adjacency lists; each edge is sent
    to its target's partition as an in-edge (targets with no out-edge appear there)."""
    src, dst, cnt = parse_adjacency(graph.read(graph_name(p)), prm.k)
    part = Part.of_kmers(prm.k, src)
    part.osrc, part.odst, part.ocnt = src, dst, cnt
    out.send(dst, {"ia_dst": dst, "ia_src": src, "ia_cnt": cnt})
    return part


def offer(part: Part, out: Outbox, rnd: int, prm: Params) -> Dict[str, int]:
    """Every vertex with one in-edge tells its predecessor whether it is a tail, and a tail
    sends itself along, to be absorbed if the predecessor is a head with one out-edge."""
    ind, outd = part.degrees()
    one = ind == 1
    e = part.sole_edge(part.idst)[one]
    v, u, c = part.ids[one], part.isrc[e], part.icnt[e]
    tail = is_tail(v, outd[one], rnd, prm.seed)
    ok = u != v
    v, u, c, tail = v[ok], u[ok], c[ok], tail[ok]
    out.send(u, {"of_u": u, "of_v": v, "of_cnt": c, "of_tail": tail})
    vt, ut = v[tail], u[tail]
    idx = locate(part.ids, vt)
    out.send_vertices(ut, part, idx, {"ov_id": vt, "ov_w": part.w[idx]}, "ov")
    send_edges(out, out_edges(part, vt, ut), "ove")
    return {"offers": int(tail.sum())}


def out_edges(part: Part, v: np.ndarray, u: np.ndarray) -> Arrays:
    """The out-edges of vertices ``v`` (``src``, ``dst``, ``cnt``), each with the vertex of
    ``u`` that is to take it over (``new``)."""
    e = lookup(v, part.osrc)
    has = e >= 0
    return {"src": part.osrc[has], "new": u[e[has]], "dst": part.odst[has],
            "cnt": part.ocnt[has]}


def send_edges(out: Outbox, edges: Arrays, prefix: str) -> None:
    """Edges to the partitions of the vertices taking them over, as columns ``PREFIX_*``."""
    out.send(edges["new"], {f"{prefix}_{kind}": col for kind, col in edges.items()})


def received_edges(m: Arrays, prefix: str) -> Arrays:
    """The edges ``send_edges`` sent (none if none were)."""
    return {kind: m.get(f"{prefix}_{kind}", empty(np.int64 if kind == "cnt" else U64))
            for kind in ("src", "new", "dst", "cnt")}


def rename(out: Outbox, edges: Arrays) -> None:
    """Tells the targets of edges taken over to rename their in-edge."""
    out.send(edges["dst"], {"ir_dst": edges["dst"], "ir_old": edges["src"], "ir_new": edges["new"]})


def is_tail(ids: np.ndarray, outdeg: np.ndarray, rnd: int, seed: int) -> np.ndarray:
    """A vertex that cannot absorb (out-degree not 1) is always a tail, the others by coin."""
    return np.asarray(~heads(ids, rnd, seed) | (outdeg != 1), dtype=bool)


def is_head(ids: np.ndarray, indeg: np.ndarray, rnd: int, seed: int) -> np.ndarray:
    """A vertex that cannot be absorbed (in-degree not 1) is always a head, the others by
    the same coin: so a head is never a tail, and chain ends merge at every round."""
    return np.asarray(heads(ids, rnd, seed) | (indeg != 1), dtype=bool)


def accept(part: Part, out: Outbox, m: Arrays, rnd: int, prm: Params) -> Dict[str, int]:
    if "of_u" not in m:
        return {"mergeable": 0, "merged": 0}
    ind, outd = part.degrees()
    ui = locate(part.ids, m["of_u"])
    i = np.maximum(ui, 0)
    mergeable = (ui >= 0) & (outd[i] == 1)
    head = is_head(m["of_u"], ind[i], rnd, prm.seed)
    acc = mergeable & m["of_tail"].astype(bool) & head
    u, v, c = m["of_u"][acc], m["of_v"][acc], m["of_cnt"][acc]
    if len(u):
        vpos = lookup(m["ov_id"], v)
        ov_start = np.cumsum(m["ov_len"]) - m["ov_len"]
        # only the out-edges of the tails absorbed here
        edges = received_edges(m, "ove")
        taken = locate(np.sort(v), edges["src"]) >= 0
        edges = {kind: col[taken] for kind, col in edges.items()}
        absorb(part, u, v, m["ov_seq"], ov_start[vpos], m["ov_len"][vpos],
               m["ov_w"][vpos] + c, edges)
        rename(out, edges)
        out.send(v, {"kill": v})
    return {"mergeable": int(mergeable.sum()), "merged": int(acc.sum())}


def absorb(
    part: Part, u: np.ndarray, v: np.ndarray, codes: np.ndarray, starts: np.ndarray,
    lens: np.ndarray, w: np.ndarray, edges: Arrays,
) -> None:
    """Vertex ``u[i]`` (of this partition; one may come again, in order) absorbs ``v[i]``:
    takes its sequence (``lens[i]`` codes of ``codes`` from ``starts[i]``) past the k-1 bases
    they overlap by, and weight ``w[i]``, and loses its out-edge to it; the out-edges
    ``edges`` (``src`` absorbed, ``new`` its absorber, ``dst``, ``cnt``) become the
    absorbers' (their targets are told apart, by ``rename``)."""
    ui = locate(part.ids, u)
    skip = part.k - 1
    add = lens - skip
    part.extend(ui, add, gather(codes, starts + skip, add))
    np.add.at(part.w, ui, w)
    part.drop_out(u, v)
    new, dst = edges["new"], edges["dst"]
    part.osrc = np.concatenate([part.osrc, new])
    part.odst = np.concatenate([part.odst, dst])
    part.ocnt = np.concatenate([part.ocnt, edges["cnt"]])


# Once few mergeable edges are left, the rounds stop and the rest is done in three supersteps:
# the edges go to one task, which ranks the lists in memory; every vertex of a list then sends
# itself to the list's head, which absorbs them all in order when it applies its messages.


def collect(part: Part, out: Outbox, prm: Params) -> Dict[str, int]:
    """Every sole out-edge and sole in-edge, to partition 0: an edge that is both can be
    merged."""
    ind, outd = part.degrees()
    o = part.sole_edge(part.osrc)[outd == 1]
    i = part.sole_edge(part.idst)[ind == 1]
    out.send_to(0, {"co_src": part.osrc[o], "co_dst": part.odst[o],
                    "ci_src": part.isrc[i], "ci_dst": part.idst[i], "ci_cnt": part.icnt[i]})
    return {}


def chains(part: Part, out: Outbox, m: Arrays) -> Dict[str, int]:
    """(Partition 0.) Every list of mergeable edges ranked: each vertex but its head is told
    its head, its place, the count of its in-edge and whether it is the last."""
    if "co_src" not in m:
        return {"chained": 0}
    i = pair_index(m["ci_src"], m["ci_dst"], m["co_src"], m["co_dst"])
    ok = (i >= 0) & (m["co_src"] != m["co_dst"])
    u, v, c = m["co_src"][ok], m["co_dst"][ok], m["ci_cnt"][i[ok]]
    head, rank, last = rank_lists(u, v)
    inner = rank > 0  # not the edge that closes a cycle into its head
    v, head = v[inner], head[inner]
    out.send(v, {"as_id": v, "as_head": head, "as_rank": rank[inner], "as_cnt": c[inner],
                 "as_last": last[inner]})
    return {"chained": len(v)}


def join_chain(part: Part, out: Outbox, m: Arrays) -> Dict[str, int]:
    """A vertex of a list sends itself to the list's head and leaves; the last also hands
    over its out-edges."""
    if "as_id" not in m:
        return {}
    x, h = m["as_id"], m["as_head"]
    idx = locate(part.ids, x)
    cols = {"jn_head": h, "jn_id": x, "jn_rank": m["as_rank"], "jn_w": part.w[idx] + m["as_cnt"]}
    out.send_vertices(h, part, idx, cols, "jn")
    last = m["as_last"].astype(bool)
    edges = out_edges(part, x[last], h[last])
    send_edges(out, edges, "je")
    rename(out, edges)
    part.remove_vertices(x)
    return {}


def tips(part: Part, out: Outbox, prm: Params) -> Dict[str, int]:
    ind, outd = part.degrees()
    tip = (part.lens < prm.tips_below) & ((ind == 0) | (outd == 0))
    gone = part.ids[tip]
    si = locate(gone, part.idst) >= 0
    out.send(part.isrc[si], {"od_src": part.isrc[si], "od_dst": part.idst[si]})
    so = locate(gone, part.osrc) >= 0
    out.send(part.odst[so], {"id_dst": part.odst[so], "id_src": part.osrc[so]})
    part.remove_vertices(gone)
    return {"tips": len(gone)}


def bubble_candidates(part: Part, out: Outbox, prm: Params) -> Dict[str, int]:
    ind, outd = part.degrees()
    one = (ind == 1) & (outd == 1) & (part.lens < prm.bubbles_below)
    pred = part.isrc[part.sole_edge(part.idst)[one]]
    succ = part.odst[part.sole_edge(part.osrc)[one]]
    b = part.ids[one]
    ok = (pred != b) & (succ != b)
    b, pred, succ = b[ok], pred[ok], succ[ok]
    idx = locate(part.ids, b)
    cols = {"bb_p": pred, "bb_s": succ, "bb_id": b, "bb_w": part.w[idx]}
    out.send_vertices(pred, part, idx, cols, "bb")
    return {"candidates": len(b)}


def pop_bubbles(part: Part, out: Outbox, m: Arrays, prm: Params) -> Dict[str, int]:
    if "bb_p" not in m:
        return {"bubbles": 0}
    p, s, b, w, lens = m["bb_p"], m["bb_s"], m["bb_id"], m["bb_w"], m["bb_len"]
    starts = (np.cumsum(lens) - lens).tolist()
    codes = m["bb_seq"]
    order = np.lexsort((b, s, p))
    ps, ss = p[order], s[order]
    new = np.r_[True, (ps[1:] != ps[:-1]) | (ss[1:] != ss[:-1]), True]
    bounds = np.flatnonzero(new).tolist()
    gone: List[int] = []
    for g0, g1 in zip(bounds[:-1], bounds[1:]):
        if g1 - g0 < 2:
            continue
        members = order[g0:g1].tolist()
        branches = [
            (coverage(int(w[i]), int(lens[i]), prm.k),
             kmers.ascii_of(codes[starts[i]:starts[i] + int(lens[i])]), i)
            for i in members
        ]
        for i in bubble_losers(branches, prm):
            gone.append(i)
    if gone:
        g = np.array(gone, dtype=np.int64)
        part.drop_out(p[g], b[g])
        out.send(b[g], {"kill": b[g]})
        out.send(s[g], {"id_dst": s[g], "id_src": b[g]})
    return {"bubbles": len(gone)}


def coverage(weight: int, length: int, k: int) -> float:
    """Mean count of the k-mer edges inside a vertex (0 for a single k-mer)."""
    return weight / max(1, length - k)


def bubble_losers(branches: List[Any], prm: Params) -> List[Any]:
    """Of ``(coverage, sequence, tag)`` branches between the same two vertices, the tags of
    those to remove: the best covered (then the least by the lesser of sequence and reverse
    complement, so that the other strand's bubble keeps the same branch) stays, and those
    similar to it go. Shared with the reference implementation."""
    ranked = sorted(branches, key=lambda x: (-x[0], min(x[1], kmers.revcomp_bytes(x[1])), x[1]))
    best = ranked[0][1]
    return [tag for _, seq, tag in ranked[1:] if similar(seq, best, prm.similarity)]


# -- a superstep as a task -------------------------------------------------------------------


def superstep(
    p: int, step: int, action: str, rnd: int, prm: Params, work: Store, graph: Store
) -> Dict[str, int]:
    """Superstep ``step`` of partition ``p``: its state and messages from ``step - 1`` in,
    ``action`` done, its state and messages of ``step`` out."""
    t0 = time.perf_counter()
    out = Outbox(prm.parts)
    here = step_dir(step)
    if action == "load":
        part = load(out, p, prm, graph)
        stats = {"edges": len(part.osrc)}
        t1 = t0
    else:
        prev = step_dir(step - 1)
        part = Part.load(work, f"{prev}/state-{p:05d}.npz")
        m = inbox(work, prev, p)
        t1 = time.perf_counter()
        apply(part, m)
        stats = ACTIONS[action](part, out, m, rnd, prm)
    if action == "finish":
        work.write(f"final/graph-{p:05d}.txt", part.text())
    t2 = time.perf_counter()
    written = part.save(work, f"{here}/state-{p:05d}.npz")
    written += out.write(work, here, p)
    # where a task's time goes (the rest of a superstep's time is Dask's and waiting)
    stats.update(read_us=_us(t1 - t0), work_us=_us(t2 - t1), write_us=_us(time.perf_counter() - t2))
    stats.update(vertices=len(part.ids), bytes_written=written)
    return stats


def _us(seconds: float) -> int:
    return int(seconds * 1e6)


ACTIONS: Dict[str, Callable[[Part, Outbox, Arrays, int, Params], Dict[str, int]]] = {
    "offer": lambda part, out, m, rnd, prm: offer(part, out, rnd, prm),
    "accept": accept,
    "tips": lambda part, out, m, rnd, prm: tips(part, out, prm),
    "bubbles": lambda part, out, m, rnd, prm: bubble_candidates(part, out, prm),
    "pop": lambda part, out, m, rnd, prm: pop_bubbles(part, out, m, prm),
    "collect": lambda part, out, m, rnd, prm: collect(part, out, prm),
    "chains": lambda part, out, m, rnd, prm: chains(part, out, m),
    "join": lambda part, out, m, rnd, prm: join_chain(part, out, m),
    "finish": lambda part, out, m, rnd, prm: {},
}

