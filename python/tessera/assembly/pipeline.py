"""The whole assembly on a Dask cluster: construction (map, shuffle through files, reduce),
simplification supersteps, contigs and statistics, each stage timed."""

from __future__ import annotations

import json
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from . import contigs as ctg
from . import shuffle
from .shuffle import Block
from .store import Store, close_filesystems
from .supersteps import Params, step_dir, superstep
from .tracing import merge_traces


@dataclass
class Config:
    reads: str  # a FASTQ file or a directory of them (any fsspec URL; tessera:// by default)
    work: str  # where the graph, the superstep state and the contigs go
    params: Params = field(default_factory=Params)
    shuffle: Optional[str] = None  # default: WORK/shuffle
    min_count: int = 2
    block_size: int = 8 << 20
    combine: bool = True
    storage_options: Dict[str, Any] = field(default_factory=dict)
    scheduler: Optional[str] = None
    workers: int = 2
    trace: Optional[str] = None
    progress: bool = True
    min_length: int = 200  # for the statistics
    simplify: bool = True  # False: stop at the graph (to time the construction alone)


@dataclass
class Result:
    stages: Dict[str, float]
    counters: Dict[str, Any]
    stats: Dict[str, int]
    contigs: List[Tuple[str, int]]
    nodes: ctg.Nodes
    edges: ctg.Edges
    trace: Optional[str] = None

    def report(self) -> Dict[str, Any]:
        return {"stages": self.stages, "counters": self.counters, "stats": self.stats,
                "trace": self.trace}


def wait_all(client: Any, futures: List[Any], show: bool) -> List[Any]:
    if show:
        from distributed import progress

        progress(futures)  # type: ignore[no-untyped-call]
        print(file=sys.stderr)
    results: List[Any] = client.gather(futures)
    return results


def _sum(results: List[Dict[str, int]]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for r in results:
        for key, v in r.items():
            out[key] = out.get(key, 0) + v
    return out


class Supersteps:
    """Runs supersteps one after the other, each a task per partition, timing them by phase
    and removing a step's files once the step after it is done."""

    def __init__(self, client: Any, prm: Params, work: Store, graph: Store, show: bool) -> None:
        self.client, self.prm, self.work, self.graph, self.show = client, prm, work, graph, show
        self.step = 0
        self.round = 0
        self.token = uuid.uuid4().hex[:8]
        self.times: Dict[str, float] = {}
        # the tasks' own time by phase, summed over tasks: reading, working, writing
        self.task_seconds: Dict[str, Dict[str, float]] = {}
        self.counters: Dict[str, int] = {
            "supersteps": 0, "rounds": 0, "ranked": 0, "bytes_written": 0}

    def run(self, action: str, phase: str) -> Dict[str, int]:
        t0 = time.perf_counter()
        parts = range(self.prm.parts)
        futs = self.client.map(
            superstep, list(parts), step=self.step, action=action, rnd=self.round,
            prm=self.prm, work=self.work, graph=self.graph, retries=3,
            key=[f"{action}-{self.token}-s{self.step}-p{p}" for p in parts],
        )
        res = _sum(self.client.gather(futs))
        if self.step >= 2:
            self.work.remove(step_dir(self.step - 2))
        self.step += 1
        self.times[phase] = self.times.get(phase, 0.0) + time.perf_counter() - t0
        self.counters["supersteps"] += 1
        self.counters["bytes_written"] += res.get("bytes_written", 0)
        spent = self.task_seconds.setdefault(phase, {"read": 0.0, "work": 0.0, "write": 0.0})
        for part in spent:
            spent[part] += res.get(f"{part}_us", 0) / 1e6
        if self.show:
            print(f"\r{phase}: superstep {self.step}, {res.get('vertices', 0)} vertices   ",
                  end="", file=sys.stderr, flush=True)
        return res

    def compress(self) -> None:
        """Random rounds until no mergeable edge is left, or until few are: then they are
        ranked in one task and joined in two more supersteps."""
        while True:
            self.run("offer", "compress")
            r = self.run("accept", "compress")
            self.round += 1
            self.counters["rounds"] += 1
            left = r["mergeable"] - r["merged"]
            if left == 0:
                return
            if left < self.prm.finish_below:
                self.run("collect", "compress")
                self.counters["ranked"] += self.run("chains", "compress")["chained"]
                self.run("join", "compress")
                return

    def simplify(self) -> Dict[str, int]:
        """The schedule the reference follows too (reference.simplify)."""
        removed = {"tips": 0, "bubbles": 0}
        self.run("load", "load")
        self.compress()
        for _ in range(self.prm.rounds):
            tips = self.run("tips", "tips")["tips"]
            if tips:
                self.compress()
            self.run("bubbles", "bubbles")
            bubbles = self.run("pop", "bubbles")["bubbles"]
            if bubbles:
                self.compress()
            removed["tips"] += tips
            removed["bubbles"] += bubbles
            if not tips and not bubbles:
                break
        self.run("finish", "finish")
        self.work.remove(step_dir(self.step - 2))
        self.work.remove(step_dir(self.step - 1))
        if self.show:
            print(file=sys.stderr)
        return removed


def connect(cfg: Config) -> Tuple[Any, Any]:
    """A Dask client: to ``cfg.scheduler``, or to a new LocalCluster (returned too, to close)."""
    from distributed import Client, LocalCluster

    if cfg.scheduler:
        return Client(cfg.scheduler), None  # type: ignore[no-untyped-call]
    cluster = LocalCluster(  # type: ignore[no-untyped-call]
        n_workers=cfg.workers, threads_per_worker=1, processes=True, dashboard_address=":0"
    )
    return Client(cluster), cluster  # type: ignore[no-untyped-call]


def read_final(work: Store) -> Tuple[ctg.Nodes, ctg.Edges]:
    nodes: ctg.Nodes = {}
    edges: ctg.Edges = []
    for name in work.names("final"):
        n, e = ctg.parse_final(work.read(f"final/{name}").decode())
        nodes.update(n)
        edges.extend(e)
    return nodes, edges


def inputs_of(store: Store) -> List[str]:
    """The FASTQ files: the file named, or the files of the directory named."""
    fs = store.fs
    if not fs.exists(store.root):
        raise FileNotFoundError(f"no reads at {store.url}")
    if fs.isdir(store.root):
        return [n for n in store.names("") if not fs.isdir(store.path(n))]
    return [""]


def run(cfg: Config, client: Any = None) -> Result:
    prm = cfg.params
    opts = dict(cfg.storage_options)
    if cfg.trace:
        opts["trace"] = cfg.trace
    work = Store(cfg.work, opts)
    shuf = Store(cfg.shuffle or cfg.work.rstrip("/") + "/shuffle", opts)
    graph = work.sub("graph")
    reads = Store(cfg.reads, opts)
    names = inputs_of(reads)
    own = None
    if client is None:
        client, own = connect(cfg)
    try:
        if cfg.progress:
            print(f"dashboard: {client.dashboard_link}", file=sys.stderr)
        stages: Dict[str, float] = {}
        blocks: List[Block] = shuffle.blocks(reads, names, cfg.block_size)
        input_bytes = sum(reads.size(n) for n in names)
        t0 = time.perf_counter()
        maps = client.map(
            shuffle.map_task, list(range(len(blocks))), blocks, k=prm.k, parts=prm.parts,
            shuffle=shuf, combine=cfg.combine, retries=3,
        )
        mapped = _sum(wait_all(client, maps, cfg.progress))
        del maps  # a lost worker must not make Dask recompute what is done
        stages["kmers+shuffle write"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        reds = client.map(
            shuffle.reduce_task, list(range(prm.parts)), maps=len(blocks), k=prm.k,
            min_count=cfg.min_count, shuffle=shuf, graph=graph, retries=3,
        )
        reduced = _sum(wait_all(client, reds, cfg.progress))
        del reds
        stages["shuffle read+graph"] = time.perf_counter() - t0
        shuf.remove("")
        counters: Dict[str, Any] = {
            "input_bytes": input_bytes, "blocks": len(blocks), "map": mapped,
            "reduce": reduced, "shuffle_ratio": mapped["shuffle_bytes"] / max(1, input_bytes),
            "params": asdict(prm), "min_count": cfg.min_count,
        }
        if not cfg.simplify:
            return Result(stages, counters, {}, [], {}, [])
        steps = Supersteps(client, prm, work, graph, cfg.progress)
        removed = steps.simplify()
        stages.update(steps.times)
        t0 = time.perf_counter()
        nodes, edges = read_final(work)
        found = ctg.contigs(nodes, edges, prm.k)
        work.write("contigs.fa", ctg.fasta(found).encode())
        stats = ctg.stats([len(s) for s, _ in found], cfg.min_length)
        work.write("stats.json", json.dumps(stats, indent=1).encode())
        stages["contigs"] = time.perf_counter() - t0
        counters.update(supersteps=steps.counters, task_seconds=steps.task_seconds,
                        removed=removed)
        merged = None
        if cfg.trace:
            client.run(close_filesystems)
            close_filesystems()
            merged = merge_traces(cfg.trace)
        return Result(stages, counters, stats, found, nodes, edges, merged)
    finally:
        if own is not None:
            client.close()
            own.close()
