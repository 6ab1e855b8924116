"""The assembler's pieces on hand-made inputs with known answers: k-mer edges, the shuffle's
record boundaries, the edit distance, and each simplification step (a chain, a tip, a
bubble, a cycle) run as supersteps on Dask and by the reference."""

from __future__ import annotations

import random
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest

pytest.importorskip("distributed")

from distributed import Client  # noqa: E402

from tessera.assembly import contigs as ctg  # noqa: E402
from tessera.assembly import kmers, reference, shuffle  # noqa: E402
from tessera.assembly.edit import within  # noqa: E402
from tessera.assembly.graph import rank_lists  # noqa: E402
from tessera.assembly.pipeline import Supersteps, read_final  # noqa: E402
from tessera.assembly.store import Store  # noqa: E402
from tessera.assembly.supersteps import Params  # noqa: E402

K = 5


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Client]:
    with Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=":0") as c:
        yield c


def adjacency(paths: List[Tuple[str, int]], k: int = K) -> reference.Adjacency:
    """The de Bruijn graph of sequences, each seen ``count`` times."""
    adj: reference.Adjacency = {}
    for seq, count in paths:
        for i in range(len(seq) - k):
            succ = adj.setdefault(seq[i : i + k], {})
            succ[seq[i + k]] = succ.get(seq[i + k], 0) + count
    return adj


def dask_simplify(
    client: Client, adj: reference.Adjacency, prm: Params, root: str,
    counters: Optional[Dict[str, int]] = None,
) -> Tuple[ctg.Nodes, ctg.Edges, Dict[str, int]]:
    """Writes ``adj`` as the partitioned adjacency lists the reduce stage writes, and runs
    the supersteps on them (their counters into ``counters``)."""
    work = Store(root)
    graph = work.sub("graph")
    edges = np.array(sorted(kmers.encode(a + b) for a, succ in adj.items() for b in succ),
                     dtype=np.uint64)
    counts = np.array([adj[kmers.decode(int(e >> np.uint64(2)), prm.k)][
        "ACGT"[int(e & np.uint64(3))]] for e in edges], dtype=np.int64)
    dest = kmers.partition_of(edges >> np.uint64(2), prm.parts)
    for r in range(prm.parts):
        sel = dest == r
        graph.write(shuffle.graph_name(r), shuffle.adjacency_text(edges[sel], counts[sel], prm.k))
    steps = Supersteps(client, prm, work, graph, show=False)
    removed = steps.simplify()
    if counters is not None:
        counters.update(steps.counters)
    nodes, es = read_final(work)
    return nodes, es, removed


def both(client: Client, adj: reference.Adjacency, prm: Params, root: str) -> ctg.Canonical:
    """The simplified graph by both implementations, checked equal."""
    nodes, edges, _ = dask_simplify(client, adj, prm, root)
    got = ctg.canonical(nodes, edges, prm.k)
    want = ctg.canonical(*reference.simplify(adj, prm), prm.k)
    assert got == want
    return got


def random_seq(n: int, seed: int) -> str:
    r = random.Random(seed)
    while True:
        s = "".join(r.choice("ACGT") for _ in range(n))
        ks = [s[i : i + K] for i in range(n - K + 1)]
        if len(set(ks)) == len(ks):  # no repeated k-mer: one path
            return s


def variant(seq: str, at: int, n: int, seed: int) -> str:
    """``seq`` with ``n`` bases from ``at`` changed, such that the changed k-mers are new and
    distinct (a branch of its own)."""
    r = random.Random(seed)
    known = {seq[i : i + K] for i in range(len(seq) - K + 1)}
    while True:
        mid = "".join(r.choice("ACGT".replace(c, "")) for c in seq[at : at + n])
        other = seq[:at] + mid + seq[at + n :]
        new = [other[i : i + K] for i in range(max(0, at - K + 1), min(at + n, len(seq) - K + 1))]
        if len(set(new)) == len(new) and not known & set(new):
            return other


def test_edges_are_the_k_plus_one_mers_of_acgt_reads() -> None:
    reads = [b"ACGTAC", b"ACNTT", b"GG", b"TTTTTT"]
    kept = kmers.acgt_only(reads)
    assert kept == [b"ACGTAC", b"GG", b"TTTTTT"]
    got = sorted(kmers.decode(int(e), 4) for e in kmers.edges_of(kept, 3))
    assert got == sorted(["ACGT", "CGTA", "GTAC", "TTTT", "TTTT", "TTTT"])
    uniq, counts = kmers.count(kmers.edges_of(kept, 3))
    assert dict(zip((kmers.decode(int(e), 4) for e in uniq), counts.tolist()))["TTTT"] == 3


def test_codes_pack_four_to_a_byte() -> None:
    r = np.random.default_rng(4)
    for n in range(0, 41):
        codes = r.integers(0, 4, n).astype(np.uint8)
        packed = kmers.pack_codes(codes)
        assert len(packed) == -(-n // 4)
        assert kmers.unpack_codes(packed, n).tolist() == codes.tolist()
    with pytest.raises(ValueError):
        kmers.unpack_codes(np.zeros(2, np.uint8), 9)


def test_adjacency_text_round_trips() -> None:
    adj = adjacency([("ACGTTGCA", 2), ("ACGTA", 1)])
    edges = np.array(sorted(kmers.encode(a + b) for a, s in adj.items() for b in s), np.uint64)
    counts = np.array([adj[kmers.decode(int(e >> np.uint64(2)), K)]["ACGT"[int(e & np.uint64(3))]]
                       for e in edges], np.int64)
    text = shuffle.adjacency_text(edges, counts, K)
    assert reference.read_adjacency(text.decode()) == adj
    s, d, c = shuffle.parse_adjacency(text, K)
    assert (s << np.uint64(2) | (d & np.uint64(3))).tolist() == edges.tolist()
    assert c.tolist() == counts.tolist()
    # blank lines skipped, a last line without its newline read
    s, d, c = shuffle.parse_adjacency(b"\nACGTA\tA:1,C:22\n\nTTTTT\tG:3", K)
    assert [kmers.decode(int(x), K) for x in d] == ["CGTAA", "CGTAC", "TTTTG"]
    assert c.tolist() == [1, 22, 3]
    for bad in (b"ACGTX\tA:1\n", b"ACGTA\tA:1,\n", b"ACGTA\tE:1\n", b"ACGT\tA:1\n",
                b"ACGTA\tA:1x\n", b"ACGTA\tA1\n", b"ACGTA\n", b"ACGTA\tA:1\nACGTA\tA:-1\n"):
        with pytest.raises(ValueError, match="adjacency line"):
            shuffle.parse_adjacency(bad, K)


def test_record_boundaries_of_fastq_blocks(tmp_path: object) -> None:
    recs = [f"@r{i}\n{'ACGT' * (i % 5 + 1)}\n+\n{'@' * (4 * (i % 5 + 1))}\n" for i in range(200)]
    data = "".join(recs).encode()
    store = Store(str(tmp_path))
    store.write("in.fq", data)
    for size in (7, 50, 333, len(data)):
        seqs: List[bytes] = []
        for b in shuffle.blocks(store, ["in.fq"], size):
            seqs.extend(kmers.fastq_sequences(shuffle.read_block(b)))
        assert seqs == kmers.fastq_sequences(data)


def test_edit_distance_agrees_with_the_full_table() -> None:
    def lev(a: bytes, b: bytes) -> int:
        d = list(range(len(b) + 1))
        for i in range(1, len(a) + 1):
            p, d[0] = d[:], i
            for j in range(1, len(b) + 1):
                d[j] = min(p[j - 1] + (a[i - 1] != b[j - 1]), p[j] + 1, d[j - 1] + 1)
        return d[len(b)]

    r = random.Random(7)
    for _ in range(500):
        a = bytes(r.choice(b"ACGT") for _ in range(r.randint(0, 12)))
        b = bytearray(a)
        for _ in range(r.randint(0, 4)):
            op = r.randint(0, 2)
            if op == 0 and b:
                b[r.randrange(len(b))] = r.choice(b"ACGT")
            elif op == 1:
                b.insert(r.randint(0, len(b)), r.choice(b"ACGT"))
            elif b:
                del b[r.randrange(len(b))]
        for limit in range(5):
            assert within(a, bytes(b), limit) == (lev(a, bytes(b)) <= limit)


def test_least_rotation() -> None:
    r = random.Random(3)
    for _ in range(300):
        s = "".join(r.choice("AC") for _ in range(r.randint(1, 10)))
        i = ctg.least_rotation(s)
        assert s[i:] + s[:i] == min(s[j:] + s[:j] for j in range(len(s)))


def test_chain_compresses_to_one_vertex(dask_client: Client, tmp_path: object) -> None:
    seq = random_seq(60, 1)
    prm = Params(k=K, parts=3)
    got = both(dask_client, adjacency([(seq, 4)]), prm, str(tmp_path))
    # weight: every one of the 55 internal edges, seen 4 times
    assert got.vertices == ((seq, 4 * (len(seq) - K)),)
    assert got.edges == ()


def test_tip_is_removed(dask_client: Client, tmp_path: object) -> None:
    seq = random_seq(60, 2)
    branch = variant(seq, 30, 2, 2)[:32]  # a dead end of 2 k-mers
    prm = Params(k=K, parts=3)
    adj = adjacency([(seq, 5), (branch, 1)])
    g = reference.Graph(adj, K)
    g.compress()
    assert len(g.seq) == 3  # before: a fork into the rest of the chain and the tip
    nodes, edges, removed = dask_simplify(dask_client, adj, prm, str(tmp_path))
    assert removed["tips"] == 1
    # the 25 edges before the fork were seen in both sequences
    weight = 5 * (len(seq) - K) + 25
    assert ctg.canonical(nodes, edges, K).vertices == ((seq, weight),)
    assert both(dask_client, adj, prm, str(tmp_path) + "/b") == ctg.canonical(nodes, edges, K)


def test_bubble_keeps_the_better_covered_branch(dask_client: Client, tmp_path: object) -> None:
    seq = random_seq(80, 3)
    snp = variant(seq, 40, 1, 3)
    prm = Params(k=K, parts=2)
    adj = adjacency([(seq, 6), (snp, 2)])
    nodes, edges, removed = dask_simplify(dask_client, adj, prm, str(tmp_path))
    assert removed == {"tips": 0, "bubbles": 1}
    # edges away from the SNP (not spanning base 40) were seen in both sequences
    main_weight = 6 * (len(seq) - K) + 2 * (40 - K) + 2 * (len(seq) - K - 41)
    assert ctg.canonical(nodes, edges, K).vertices == ((seq, main_weight),)
    both(dask_client, adj, prm, str(tmp_path) + "/b")


def test_unlike_branches_are_not_a_bubble(dask_client: Client, tmp_path: object) -> None:
    seq = random_seq(80, 4)
    other = variant(seq, 40, 5, 4)
    prm = Params(k=K, parts=2, similarity=0.1)
    adj = adjacency([(seq, 6), (other, 2)])
    g = both(dask_client, adj, prm, str(tmp_path))
    assert len(g.vertices) == 4  # start, two branches, end


def test_rank_lists_agrees_with_walking_them() -> None:
    r = random.Random(8)
    for trial in range(200):
        ids = r.sample(range(1, 10_000), r.randint(2, 60))
        links: Dict[int, int] = {}
        i = 0
        while i < len(ids) - 1:  # paths and cycles of random lengths over the ids
            n = r.randint(2, 12)
            group = ids[i : i + n]
            links.update(zip(group, group[1:]))
            if len(group) > 1 and r.random() < 0.3:
                links[group[-1]] = group[0]
            i += n
        u = np.array(list(links), dtype=np.uint64)
        v = np.array(list(links.values()), dtype=np.uint64)
        head, rank, last = rank_lists(u, v)
        got = list(zip(head.tolist(), rank.tolist(), last.tolist()))
        assert got == [walked(links, x) for x in v.tolist()], trial


def walked(links: Dict[int, int], x: int) -> Tuple[int, int, bool]:
    """``x``'s list head (a cycle's least id), place and whether it ends the list, found
    by walking the links one by one."""
    prev = {b: a for a, b in links.items()}
    cycle, y = [x], links.get(x)
    while y is not None and y != x and len(cycle) <= len(links):
        cycle.append(y)
        y = links.get(y)
    if y == x:  # on a cycle: counted from its least id
        head = min(cycle)
        place = (cycle.index(x) - cycle.index(head)) % len(cycle)
        return head, place, links[x] == head
    place, y = 0, x
    while y in prev:
        y, place = prev[y], place + 1
    return y, place, x not in links


def test_chains_finish_alike_by_rounds_and_in_one_task(
    dask_client: Client, tmp_path: object
) -> None:
    # a small genome with repeats: chains that branch, tips, and a cycle of its own
    r = random.Random(12)
    genome = "".join(r.choice("ACGT") for _ in range(400))
    genome = genome[:200] + genome[50:80] + genome[200:] + genome[300:330]
    circle = random_seq(30, 13)
    paths = [(genome, 5), (genome[100:140] + "A" * 3, 1), (circle + circle[:K], 2)]
    adj = adjacency(paths)
    got = []
    for finish_below in (0, 2, 10, 1_000_000):
        prm = Params(k=K, parts=3, seed=2, finish_below=finish_below)
        counters: Dict[str, int] = {}
        nodes, edges, _ = dask_simplify(
            dask_client, adj, prm, f"{tmp_path}/{finish_below}", counters)
        got.append(ctg.canonical(nodes, edges, K))
        if finish_below == 0:
            assert counters["ranked"] == 0  # random rounds to the end
        if finish_below == 1_000_000:
            assert counters["ranked"] > 0  # a round, then the rest in one task
    want = ctg.canonical(*reference.simplify(adj, Params(k=K)), K)
    assert all(g == want for g in got)


def test_cycle_is_one_vertex_at_its_least_rotation(dask_client: Client, tmp_path: object) -> None:
    r = random.Random(5)
    while True:
        circle = "".join(r.choice("ACGT") for _ in range(25))
        seq = circle + circle[:K]
        if len({seq[i : i + K] for i in range(25)}) == 25:
            break  # every k-mer of the circle, once, and back to the start
    adj = adjacency([(seq, 3)])
    prm = Params(k=K, parts=3, seed=9)
    got = both(dask_client, adj, prm, str(tmp_path))
    assert len(got.vertices) == 1
    assert got.vertices[0][1] == 3 * len(circle)
    assert got.vertices[0][0] == ctg.rotate(seq[:-1], K)


def test_a_contig_and_its_reverse_complement_are_one() -> None:
    # the two strands' vertices of a contig weigh the same; a palindrome is there once
    nodes = {1: ("AACGT", 3), 2: (kmers.revcomp("AACGT"), 3), 3: ("GG", 1), 4: ("ACGT", 2)}
    assert ctg.contigs(nodes, [], 3) == [("AACGT", 3), ("ACGT", 2), ("CC", 1)]
    assert ctg.stats([100, 50, 30, 20], 25) == {
        "contigs": 3, "total": 180, "largest": 100, "n50": 100, "min_length": 25}
    assert ctg.stats([40, 30, 30], 0)["n50"] == 30
