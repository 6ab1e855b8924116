"""The assembly pipeline on Dask over a real Tessera cluster against the single-process
reference, on reads simulated from a small genome: the same de Bruijn graph, the same
simplified graph, the same contigs; on a LocalCluster (traced, the trace read by `tessera
profile`) and on a scheduler with workers started as their own processes, one of them killed
in the middle of a superstep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

pytest.importorskip("distributed")

import cloudpickle  # noqa: E402
from distributed import Client, WorkerPlugin  # noqa: E402

from tessera import LocalCluster, find_binary  # noqa: E402
from tessera.assembly import Config, Params, reference, run, simulate  # noqa: E402
from tessera.assembly import contigs as ctg  # noqa: E402
from tessera.assembly.kmers import fastq_sequences, revcomp  # noqa: E402
from tessera.assembly.store import Store  # noqa: E402

# a few random rounds of chain compression, then the rest ranked in one task
PARAMS = Params(k=21, parts=3, seed=3, rounds=2, finish_below=2000)
MIN_COUNT = 1  # keep the error k-mers, so that there are tips and bubbles to remove


@dataclass
class Sample:
    genome: str
    reads_url: str
    options: Dict[str, Any]
    adjacency: reference.Adjacency
    canonical: ctg.Canonical
    contigs: List[Any]
    base: str


@pytest.fixture(scope="module")
def sample(cluster: LocalCluster) -> Iterator[Sample]:
    genome = simulate.genome(12_000, seed=11)
    fq = simulate.reads(genome, 20, 100, error_rate=0.003, n_rate=0.02, seed=12).encode()
    base = f"/asm-{uuid.uuid4().hex[:10]}"
    c = cluster.client()
    c.mkdir(base + "/reads", parents=True)
    c.pipe(base + "/reads/sample.fq", fq)
    adj = reference.de_bruijn(fastq_sequences(fq), PARAMS.k, MIN_COUNT)
    nodes, edges = reference.simplify(adj, PARAMS)
    yield Sample(
        genome, f"tessera://{base}/reads/sample.fq",
        {"manager": cluster.manager, "secret": cluster.secret}, adj,
        ctg.canonical(nodes, edges, PARAMS.k), ctg.contigs(nodes, edges, PARAMS.k), base,
    )
    c.rm(base, recursive=True)


def check_same_as_reference(s: Sample, res: Any, work: str) -> None:
    store = Store(work, s.options)
    graph: reference.Adjacency = {}
    for name in store.names("graph"):
        graph.update(reference.read_adjacency(store.read(f"graph/{name}").decode()))
    assert graph == s.adjacency
    assert ctg.canonical(res.nodes, res.edges, PARAMS.k) == s.canonical
    assert res.contigs == s.contigs
    assert store.read("contigs.fa").decode() == ctg.fasta(s.contigs)
    assert json.loads(store.read("stats.json")) == res.stats
    # both strands are in the graph and simplify alike: each vertex has its reverse
    # complement's, and each contig is reported once, not with its reverse complement
    seqs = {seq for seq, _ in res.nodes.values()}
    loops = ctg.cycles(res.nodes, res.edges)
    assert all(revcomp(seq) in seqs for v, (seq, _) in res.nodes.items() if v not in loops)
    found = {seq for seq, _ in res.contigs}
    assert not [seq for seq in found if seq != revcomp(seq) and revcomp(seq) in found]
    assert store.names("steps") == []  # the supersteps' files were removed as they went


def test_pipeline_matches_the_reference_and_is_traced(sample: Sample, tmp_path: Path) -> None:
    work = f"tessera://{sample.base}/local"
    traces = tmp_path / "traces"
    cfg = Config(
        reads=sample.reads_url, work=work, params=PARAMS, min_count=MIN_COUNT,
        storage_options=sample.options, workers=2, trace=str(traces), progress=False,
        block_size=256 << 10,
    )
    res = run(cfg)
    check_same_as_reference(sample, res, work)
    c = res.counters
    assert c["blocks"] > 1
    assert 0 < c["map"]["reads_kept"] < c["map"]["reads"]  # the reads with an N are dropped
    assert c["removed"]["tips"] > 0 and c["removed"]["bubbles"] > 0
    assert c["supersteps"]["rounds"] > 1 and c["supersteps"]["ranked"] > 0
    assert 0 < c["shuffle_ratio"]
    largest = res.contigs[0][0]
    assert largest in sample.genome or revcomp(largest) in sample.genome
    assert res.stats["largest"] == len(largest) and res.stats["total"] > 0
    # one trace of every process's Tessera calls, which `tessera profile` reads
    assert res.trace is not None and os.path.exists(res.trace)
    out = subprocess.run(
        [str(find_binary()), "profile", res.trace, "-o", "-"],
        check=True, capture_output=True, text=True, timeout=120,
    )
    model = json.loads(out.stdout)
    paths = json.dumps(model)
    assert "/graph/part-" in paths and "state-" in paths


def test_reference_reports_each_contig_once() -> None:
    """With the error k-mers dropped (min count 2), the reads of both strands give one
    contig: the genome, once (not also its reverse complement), but for its ends."""
    genome = simulate.genome(12_000, seed=21)
    fq = simulate.reads(genome, 20, 100, error_rate=0.003, seed=22).encode()
    adj = reference.de_bruijn(fastq_sequences(fq), PARAMS.k, 2)
    found = ctg.contigs(*reference.simplify(adj, PARAMS), PARAMS.k)
    stats = ctg.stats([len(seq) for seq, _ in found], 200)
    assert stats["contigs"] == 1 and 0.99 * len(genome) <= stats["total"] <= len(genome)
    assert found[0][0] in genome or revcomp(found[0][0]) in genome


class KillOnce(WorkerPlugin):  # type: ignore[misc]
    """Kills its worker's process (SIGKILL) once, in the cluster, when a task whose key
    holds ``marker`` has run but before the scheduler hears of it: the task's files are
    written, its result lost, so Dask runs it again on a worker that is left."""

    def __init__(self, flag: str, marker: str) -> None:
        self.flag, self.marker = flag, marker

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if start == "executing" and finish == "memory" and self.marker in str(key):
            try:
                os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return
            os.kill(os.getpid(), signal.SIGKILL)


def test_remote_workers_one_killed_mid_superstep(sample: Sample, tmp_path: Path) -> None:
    sched_file = tmp_path / "scheduler.json"
    procs: List[subprocess.Popen[bytes]] = []
    log = open(tmp_path / "dask.log", "wb")
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
             "--port", "0", "--dashboard-address", ":0", "--scheduler-file", str(sched_file)],
            stdout=log, stderr=log,
        ))
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        for _ in range(2):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                 str(sched_file), "--nworkers", "1", "--nthreads", "1", "--nanny",
                 "--host", "127.0.0.1", "--dashboard-address", ":0"],
                stdout=log, stderr=log,
            ))
        with Client(scheduler_file=str(sched_file), timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
            cloudpickle.register_pickle_by_value(sys.modules[__name__])
            flag = tmp_path / "killed"
            # killed where the lists ranked in one task are joined at their heads
            client.register_plugin(KillOnce(str(flag), "join-"))
            work = f"tessera://{sample.base}/remote"
            cfg = Config(
                reads=sample.reads_url, work=work, params=PARAMS, min_count=MIN_COUNT,
                storage_options=sample.options, shuffle=str(tmp_path / "shuffle"),
                scheduler=client.scheduler.address, progress=False, block_size=256 << 10,
            )
            res = run(cfg, client=client)
            assert flag.exists(), "no worker was killed"
            check_same_as_reference(sample, res, work)
            assert not (tmp_path / "shuffle").exists() or not any((tmp_path / "shuffle").iterdir())
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
