"""``python -m tessera.assembly``: run the pipeline on Dask, run the reference, simulate reads,
report statistics, evaluate contigs against a genome."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, Optional, Sequence

from . import contigs as ctg
from .supersteps import Params


def _params(a: argparse.Namespace) -> Params:
    from .kmers import check_k

    check_k(a.k)
    if a.parts < 1:
        raise ValueError("--parts must be at least 1")
    if not 0 <= a.similarity < 1:
        raise ValueError("--similarity must be in [0, 1)")
    if a.finish_below < 0:
        raise ValueError("--finish-below must not be negative")
    return Params(k=a.k, parts=a.parts, seed=a.seed, tip_len=a.tip_len,
                  bubble_len=a.bubble_len, similarity=a.similarity, rounds=a.rounds,
                  finish_below=a.finish_below)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-k", type=int, default=31, help="k-mer length, 2-31 (default 31)")
    p.add_argument("--min-count", type=int, default=2,
                   help="edges seen fewer times are dropped (default 2)")
    p.add_argument("--parts", type=int, default=8, help="graph partitions (default 8)")
    p.add_argument("--seed", type=int, default=1, help="seed of the head/tail coins")
    p.add_argument("--tip-len", type=int, default=0, help="tips shorter are removed (0: 2k)")
    p.add_argument("--bubble-len", type=int, default=0,
                   help="bubble branches shorter are judged (0: 3k)")
    p.add_argument("--similarity", type=float, default=0.1,
                   help="branches within this share of edits are alike (default 0.1)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of tips and bubbles")
    p.add_argument("--finish-below", type=int, default=Params.finish_below,
                   help="chain compression's random rounds stop once fewer mergeable edges "
                   "are left, which are then ranked in one task (0: rounds to the end; "
                   f"default {Params.finish_below})")
    p.add_argument("--min-length", type=int, default=200,
                   help="contigs counted in the statistics (default 200)")


def _emit(report: Dict[str, Any], json_out: Optional[str]) -> None:
    text = json.dumps(report, indent=1)
    if json_out == "-":
        print(text)
    elif json_out:
        with open(json_out, "w") as f:
            f.write(text + "\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera.assembly", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="assemble on Dask, with Tessera for the files")
    r.add_argument("reads", help="FASTQ file or directory, e.g. tessera://reads/sample.fq")
    r.add_argument("--work", required=True, help="output directory, e.g. tessera://asm")
    r.add_argument("--shuffle-dir", help="where the shuffle goes (default WORK/shuffle; "
                   "a local path for a disk or tmpfs)")
    r.add_argument("--scheduler", help="address of a running Dask scheduler "
                   "(default: a LocalCluster)")
    r.add_argument("--workers", type=int, default=2, help="LocalCluster workers (default 2)")
    r.add_argument("--block-size", type=int, default=8 << 20, help="FASTQ bytes per map task")
    r.add_argument("--no-combine", action="store_true", help="no per-map combiner")
    r.add_argument("--trace", help="trace every process's Tessera calls into this directory "
                   "and merge them into DIR/assembly.parquet (for tessera profile)")
    r.add_argument("--manager", help="Tessera manager HOST:PORT (default: as the CLI finds it)")
    r.add_argument("--secret", help="Tessera cluster secret")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--json", help="write the report (stages, counters, stats) here; - for stdout")
    _common(r)
    f = sub.add_parser("reference", help="the single-process reference assembler")
    f.add_argument("reads", help="a FASTQ file (local path or URL)")
    f.add_argument("-o", "--output", help="contigs FASTA to write")
    f.add_argument("--json", help="write the statistics here; - for stdout")
    _common(f)
    s = sub.add_parser("stats", help="N50, total, count and largest of a FASTA of contigs")
    s.add_argument("fasta")
    s.add_argument("--min-length", type=int, default=200)
    e = sub.add_parser("evaluate", help="align contigs to the genome (minimap2), count "
                       "misassemblies")
    e.add_argument("contigs")
    e.add_argument("genome")
    e.add_argument("--min-length", type=int, default=200)
    m = sub.add_parser("simulate", help="a random genome and reads from it (deterministic)")
    m.add_argument("--length", type=int, required=True)
    m.add_argument("--coverage", type=float, default=30)
    m.add_argument("--read-length", type=int, default=100)
    m.add_argument("--error-rate", type=float, default=0.0)
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--genome", required=True, help="FASTA of the genome to write")
    m.add_argument("--reads", help="FASTQ to write (none: the genome only)")
    a = ap.parse_args(argv)
    try:
        return _dispatch(a)
    except (OSError, ValueError, RuntimeError) as err:
        print(f"python -m tessera.assembly {a.cmd}: {err}", file=sys.stderr)
        return 1


def _dispatch(a: argparse.Namespace) -> int:
    if a.cmd == "run":
        from .pipeline import Config, run

        opts = {key: v for key, v in (("manager", a.manager), ("secret", a.secret)) if v}
        cfg = Config(
            reads=a.reads, work=a.work, params=_params(a), shuffle=a.shuffle_dir,
            min_count=a.min_count, block_size=a.block_size, combine=not a.no_combine,
            storage_options=opts, scheduler=a.scheduler, workers=a.workers, trace=a.trace,
            progress=not a.no_progress, min_length=a.min_length,
        )
        res = run(cfg)
        _emit(res.report(), a.json)
        for stage, secs in res.stages.items():
            print(f"{stage:24s} {secs:8.2f} s", file=sys.stderr)
        print(json.dumps(res.stats), file=sys.stderr)
        if res.trace:
            print(f"trace: {res.trace} (tessera profile {res.trace})", file=sys.stderr)
        return 0
    if a.cmd == "reference":
        import fsspec

        from .kmers import fastq_sequences
        from .reference import de_bruijn, simplify

        prm = _params(a)
        with fsspec.open(a.reads, "rb") as fh:
            reads = fastq_sequences(fh.read())
        nodes, edges = simplify(de_bruijn(reads, prm.k, a.min_count), prm)
        found = ctg.contigs(nodes, edges, prm.k)
        if a.output:
            with open(a.output, "w") as out:
                out.write(ctg.fasta(found))
        st = ctg.stats([len(x) for x, _ in found], a.min_length)
        _emit(st, a.json)
        print(json.dumps(st), file=sys.stderr)
        return 0
    if a.cmd == "stats":
        with open(a.fasta) as fh:
            print(json.dumps(ctg.stats([len(x) for x in ctg.read_fasta(fh.read())],
                                       a.min_length)))
        return 0
    if a.cmd == "evaluate":
        from .evaluate import evaluate

        print(json.dumps(evaluate(a.contigs, a.genome, a.min_length)))
        return 0
    from . import simulate

    g = simulate.genome(a.length, a.seed)
    with open(a.genome, "w") as out:
        out.write(ctg.fasta([(g, 0)]).replace(">contig1", ">genome"))
    if a.reads:
        with open(a.reads, "w") as out:
            out.write(simulate.reads(g, a.coverage, a.read_length, a.error_rate, seed=a.seed))
    return 0
