"""Genome assembly benchmark (issue #36), run by scripts/bench-assembly.sh.

A random genome (default 1 Mbp), reads simulated from it at 30x by dwgsim (Debian; 100-base
pairs, 0.5 % errors, no mutations, no random reads; both mates used as single reads), or by
the package's own simulator when dwgsim is missing. On one `tessera up` cluster (4 servers):

  * the whole pipeline on a Dask LocalCluster with the reads, the shuffle, the graph and the
    superstep state on Tessera: every stage timed, shuffled bytes against the input, and the
    supersteps' task time split into reading, working and writing (summed over tasks);
  * graph construction again with the shuffle on local disk (/var/tmp) and on tmpfs
    (/dev/shm), the rest on Tessera;
  * ABySS (abyss-pe, same k, same reads) timed, and both contig sets' statistics (contigs of
    200 bases or more) and alignment to the genome (minimap2: misassembled contigs).

Prints the figures (a table of the stages by where the shuffle was) and writes JSON (OUT_JSON,
default bench-assembly.json).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict

from tessera import LocalCluster
from tessera.assembly import Config, Params, run, simulate
from tessera.assembly import contigs as ctg
from tessera.assembly.evaluate import evaluate


def sh(*cmd: str, cwd: str) -> None:
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def make_reads(tmp: str, length: int, coverage: float, k: int) -> Dict[str, Any]:
    genome = simulate.genome(length, seed=36)
    gpath = os.path.join(tmp, "genome.fa")
    with open(gpath, "w") as f:
        f.write(">genome\n" + genome + "\n")
    reads = os.path.join(tmp, "reads.fq")
    if shutil.which("dwgsim"):
        sh("dwgsim", "-e", "0.005", "-E", "0.005", "-r", "0", "-y", "0", "-C", str(coverage),
           "-1", "100", "-2", "100", "-H", "-z", "36", gpath, "sim", cwd=tmp)
        with open(reads, "wb") as out:
            for mate in ("sim.bwa.read1.fastq", "sim.bwa.read2.fastq"):
                path = os.path.join(tmp, mate)
                if not os.path.exists(path):
                    path += ".gz"
                    sh("gunzip", "-k", path, cwd=tmp)
                    path = path[:-3]
                with open(path, "rb") as f:
                    shutil.copyfileobj(f, out)
        sim = "dwgsim -e 0.005 -E 0.005 -r 0 -y 0 -1 100 -2 100 -H"
    else:
        with open(reads, "w") as f:
            f.write(simulate.reads(genome, coverage, 100, error_rate=0.005, seed=36))
        sim = "tessera.assembly.simulate (error rate 0.005)"
    return {"genome": gpath, "reads": reads, "simulator": sim,
            "reads_bytes": os.path.getsize(reads)}


def abyss(tmp: str, reads: str, k: int) -> Dict[str, Any]:
    if not shutil.which("abyss-pe"):
        return {"error": "abyss-pe not installed"}
    d = os.path.join(tmp, "abyss")
    os.makedirs(d)
    t = time.perf_counter()
    sh("abyss-pe", f"k={k}", "name=asm", f"se={reads}", "j=2", "B=1G", cwd=d)
    secs = time.perf_counter() - t
    fa = os.path.join(d, "asm-contigs.fa")
    if not os.path.exists(fa):
        fa = os.path.join(d, "asm-unitigs.fa")
    with open(fa) as f:
        lengths = [len(s) for s in ctg.read_fasta(f.read())]
    return {"seconds": secs, "contigs_fa": fa, "stats": ctg.stats(lengths, 200)}


def print_runs(runs: Dict[str, Any], reads_bytes: int) -> None:
    """Each stage's time by where the shuffle was, the shuffle's bytes against the input,
    and where the supersteps' tasks spent their time."""
    wheres = list(runs)
    stages = list(dict.fromkeys(st for r in runs.values() for st in r["stages"]))
    print(f"{'stage':24s}" + "".join(f"{w:>10s}" for w in wheres))
    for st in stages:
        cells = [runs[w]["stages"].get(st) for w in wheres]
        print(f"{st:24s}" + "".join(f"{c:9.2f}s" if c is not None else f"{'-':>10s}"
                                     for c in cells))
    for w in wheres:
        m = runs[w]["counters"]["map"]
        print(f"shuffle ({w}): {m['shuffle_bytes']:,} bytes, {m['shuffle_records']:,} records, "
              f"{m['shuffle_bytes'] / max(1, reads_bytes):.2f}x the {reads_bytes:,}-byte "
              f"FASTQ", flush=True)
    steps = runs["tessera"]["counters"].get("supersteps")
    if steps:
        print("supersteps:", json.dumps(steps))
        for phase, spent in runs["tessera"]["counters"]["task_seconds"].items():
            wall = runs["tessera"]["stages"][phase]
            print(f"  {phase:10s} {wall:8.2f}s wall; tasks: " + ", ".join(
                f"{part} {secs:.2f}s" for part, secs in spent.items()), flush=True)


def main() -> int:
    length = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    coverage = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
    k, parts = 31, 8
    out: Dict[str, Any] = {"genome_length": length, "coverage": coverage, "k": k,
                           "parts": parts, "load_before": os.getloadavg()}
    tmp = tempfile.mkdtemp(prefix="bench-assembly-", dir="/var/tmp")
    shm = tempfile.mkdtemp(prefix="bench-assembly-", dir="/dev/shm")
    try:
        out["input"] = make_reads(tmp, length, coverage, k)
        print(json.dumps(out["input"]), flush=True)
        with LocalCluster(servers=4, memory="3GiB") as cluster:
            opts = {"manager": cluster.manager, "secret": cluster.secret}
            c = cluster.client()
            c.mkdir("/bench/reads", parents=True)
            c.put_many([(out["input"]["reads"], "/bench/reads/reads.fq")])
            prm = Params(k=k, parts=parts)
            runs: Dict[str, Any] = {}
            for where, shuffle in (("tessera", None), ("disk", os.path.join(tmp, "shuffle")),
                                   ("tmpfs", os.path.join(shm, "shuffle"))):
                cfg = Config(
                    reads="tessera://bench/reads/reads.fq", work=f"tessera://bench/{where}",
                    params=prm, shuffle=shuffle, storage_options=opts, workers=2,
                    simplify=where == "tessera", progress=False,
                )
                t = time.perf_counter()
                res = run(cfg)
                runs[where] = {"seconds": time.perf_counter() - t, **res.report()}
                print(where, json.dumps(runs[where]["stages"]), flush=True)
                if where == "tessera":
                    fa = os.path.join(tmp, "dask-contigs.fa")
                    with open(fa, "w") as f:
                        f.write(ctg.fasta(res.contigs))
                    runs[where]["evaluate"] = evaluate(fa, out["input"]["genome"])
                    print("stats", json.dumps(res.stats), json.dumps(runs[where]["evaluate"]),
                          flush=True)
            out["runs"] = runs
            print_runs(runs, out["input"]["reads_bytes"])
        out["abyss"] = abyss(tmp, out["input"]["reads"], k)
        if "contigs_fa" in out["abyss"]:
            out["abyss"]["evaluate"] = evaluate(out["abyss"]["contigs_fa"], out["input"]["genome"])
        print("abyss", json.dumps(out["abyss"]), flush=True)
        out["load_after"] = os.getloadavg()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    path = os.environ.get("OUT_JSON", "bench-assembly.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
