"""Real pipelines benchmark driver (run by scripts/bench-pipelines.sh): four scientific
pipelines built from Debian's packages, each run unmodified in every directory given, stage by
stage, with the wall time of each stage, the ratios of the last directory to the others, and a
check that every directory produced the same outputs as the first.

- blast: a protein database split into 64 fragments (seqkit), a database built per fragment
  (makeblastdb, two at a time), one search per fragment (blastp, two at a time): many small
  files written, then mapped by other processes.
- align: bwa index of a genome, bwa mem of paired reads, samtools sort and index.
- assemble: velveth and velvetg on the same reads.
- mosaic: Montage's mosaic of overlapping sky images (project, fit the overlaps, correct the
  backgrounds, co-add).

Inputs are synthetic and deterministic (a seed), generated once into a cache directory and
copied into each directory before its run (not timed).

Usage: python3 scripts/bench_pipelines.py NAME=DIR [NAME=DIR ...]
Environment: ROUNDS (default 3; each time is the median of that many rounds, a round going
through every directory in turn), PIPELINES (default "blast,align,assemble,mosaic"), SCALE
(default 1: inputs grow linearly with it), CACHE (inputs, default /var/tmp/tessera-pipelines),
OUT (JSON results, default /tmp/bench-pipelines.json).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import time
from typing import Callable

Stage = tuple[str, str]

AMINO = "ACDEFGHIKLMNPQRSTVWY"


def fasta(path: str, records: list[tuple[str, str]]) -> None:
    with open(path, "w") as f:
        for name, seq in records:
            f.write(f">{name}\n")
            for i in range(0, len(seq), 60):
                f.write(seq[i : i + 60] + "\n")


def mutate(rng: random.Random, seq: str, alphabet: str, rate: float) -> str:
    return "".join(rng.choice(alphabet) if rng.random() < rate else c for c in seq)


def gen_blast(d: str, scale: float) -> None:
    rng = random.Random(1)
    proteins = [
        (f"p{i}", "".join(rng.choices(AMINO, k=rng.randint(150, 450))))
        for i in range(int(20000 * scale))
    ]
    fasta(os.path.join(d, "db.fa"), proteins)
    queries = [
        (f"q{i}", mutate(rng, proteins[rng.randrange(len(proteins))][1], AMINO, 0.2))
        for i in range(int(40 * scale))
    ]
    fasta(os.path.join(d, "queries.fa"), queries)


def revcomp(s: str) -> str:
    return s[::-1].translate(str.maketrans("ACGT", "TGCA"))


def gen_reads(d: str, scale: float) -> None:
    """A random genome and paired 100-base reads from it at 20x, 1 % substitutions."""
    rng = random.Random(2)
    genome = "".join(rng.choices("ACGT", k=int(1_000_000 * scale)))
    fasta(os.path.join(d, "genome.fa"), [("chr1", genome)])
    n = len(genome) * 20 // 200
    qual = "I" * 100
    with open(os.path.join(d, "r1.fq"), "w") as f1, open(os.path.join(d, "r2.fq"), "w") as f2:
        for i in range(n):
            at = rng.randrange(len(genome) - 400)
            insert = rng.randint(250, 350)
            a = mutate(rng, genome[at : at + 100], "ACGT", 0.01)
            b = mutate(rng, revcomp(genome[at + insert - 100 : at + insert]), "ACGT", 0.01)
            f1.write(f"@r{i}/1\n{a}\n+\n{qual}\n")
            f2.write(f"@r{i}/2\n{b}\n+\n{qual}\n")


def fits(path: str, width: int, height: int, ra: float, dec: float, data: list[float]) -> None:
    """A FITS image: a header of 80-character cards in 2880-byte blocks, then big-endian
    float32 pixels, padded to a block; a gnomonic (TAN) projection at (ra, dec)."""
    cards = [
        ("SIMPLE", "T"), ("BITPIX", "-32"), ("NAXIS", "2"), ("NAXIS1", str(width)),
        ("NAXIS2", str(height)), ("CTYPE1", "'RA---TAN'"), ("CTYPE2", "'DEC--TAN'"),
        ("CRPIX1", f"{width / 2 + 0.5}"), ("CRPIX2", f"{height / 2 + 0.5}"),
        ("CRVAL1", f"{ra}"), ("CRVAL2", f"{dec}"), ("CDELT1", "-0.0002777778"),
        ("CDELT2", "0.0002777778"), ("EQUINOX", "2000.0"),
    ]
    head = "".join(f"{k:<8}= {v:>20}".ljust(80) for k, v in cards) + "END".ljust(80)
    head = head.ljust(-(-len(head) // 2880) * 2880)
    body = struct.pack(f">{len(data)}f", *data)
    body += b"\0" * (-len(body) % 2880)
    with open(path, "wb") as f:
        f.write(head.encode("ascii") + body)


def gen_mosaic(d: str, scale: float) -> None:
    """A grid of overlapping 1-arcsecond images of one sky (stars on a background that differs
    per image, as Montage's background matching expects)."""
    rng = random.Random(3)
    side = max(2, round(3 * scale**0.5))
    size = 300
    stars = [(rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(50, 500)) for _ in range(400)]
    raw = os.path.join(d, "raw")
    os.makedirs(raw, exist_ok=True)
    span = 0.0002777778 * size
    for gx in range(side):
        for gy in range(side):
            ra, dec = 180 + gx * span * 0.8, 30 + gy * span * 0.8
            bg = rng.uniform(10, 30)
            px = [bg + rng.gauss(0, 1) for _ in range(size * size)]
            for sx, sy, flux in stars:
                x = int((sx * side * 0.8 - gx * 0.8) * size)
                y = int((sy * side * 0.8 - gy * 0.8) * size)
                if 0 <= x < size and 0 <= y < size:
                    px[y * size + x] += flux
            fits(os.path.join(raw, f"img{gx}{gy}.fits"), size, size, ra, dec, px)


BLAST: list[Stage] = [
    ("split", "seqkit split2 -j 2 -p 64 -O frags db.fa"),
    ("build", "ls frags/*.fa | xargs -P 2 -I{} makeblastdb -in {} -dbtype prot -out {}"),
    (
        "search",
        "ls frags/*.fa | xargs -P 2 -I{} blastp -query queries.fa -db {} -outfmt 6 "
        "-evalue 1e-5 -out {}.tsv && cat frags/*.tsv | sort > hits.tsv",
    ),
]
ALIGN: list[Stage] = [
    ("index", "cp genome.fa ref.fa && bwa index ref.fa"),
    ("map", "bwa mem -t 2 -K 10000000 ref.fa r1.fq r2.fq > aln.sam"),
    ("sort", "samtools sort -@ 2 -o aln.bam aln.sam && samtools index aln.bam"),
]
ASSEMBLE: list[Stage] = [
    ("hash", "velveth asm 31 -fastq -shortPaired -separate r1.fq r2.fq"),
    ("graph", "velvetg asm -exp_cov auto -ins_length 300"),
]
MOSAIC: list[Stage] = [
    (
        "project",
        "mkdir -p proj diff corr && mImgtbl raw images.tbl && "
        "mMakeHdr images.tbl template.hdr && "
        "mProjExec -p raw images.tbl template.hdr proj stats.tbl",
    ),
    (
        "fit",
        "mImgtbl proj pimages.tbl && mOverlaps pimages.tbl diffs.tbl && "
        "mDiffExec -p proj diffs.tbl template.hdr diff && "
        "mFitExec diffs.tbl fits.tbl diff",
    ),
    (
        "add",
        "mBgModel pimages.tbl fits.tbl corrections.tbl && "
        "mBgExec -p proj pimages.tbl corrections.tbl corr && "
        "mAdd -p corr pimages.tbl template.hdr mosaic.fits",
    ),
]

# name: (input generator, stages, outputs compared between directories)
PIPELINES: dict[str, tuple[Callable[[str, float], None], list[Stage], list[str]]] = {
    "blast": (gen_blast, BLAST, ["hits.tsv"]),
    "align": (gen_reads, ALIGN, ["aln.bam", "aln.bam.bai"]),
    "assemble": (gen_reads, ASSEMBLE, ["asm/contigs.fa"]),
    "mosaic": (gen_mosaic, MOSAIC, ["mosaic.fits"]),
}


def fits_pixels(path: str) -> list[float]:
    with open(path, "rb") as f:
        raw = f.read()
    at = 0
    while True:
        block = raw[at : at + 2880]
        at += 2880
        if any(block[i : i + 8] == b"END     " for i in range(0, 2880, 80)) or not block:
            break
    n = (len(raw) - at) // 4
    return list(struct.unpack(f">{n}f", raw[at : at + 4 * n]))


def same(a: str, b: str) -> bool:
    """Byte for byte; a FITS image pixel by pixel within a relative 1e-5: Montage lists a
    directory in the order the file system gives, and sums in that order."""
    if not a.endswith(".fits"):
        with open(a, "rb") as fa, open(b, "rb") as fb:
            return fa.read() == fb.read()
    pa, pb = fits_pixels(a), fits_pixels(b)
    return len(pa) == len(pb) and all(
        (x != x and y != y) or abs(x - y) <= 1e-5 * max(abs(x), abs(y), 1.0)
        for x, y in zip(pa, pb)
    )


def run(name: str, stages: list[Stage], src: str, where: str) -> dict[str, float]:
    """Copies the inputs into a fresh directory under `where`, runs the stages there, and
    returns each stage's wall time in seconds."""
    d = os.path.join(where, name)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(src, d)
    subprocess.run(["sync"], check=True)
    times = {}
    for stage, cmd in stages:
        t = time.perf_counter()
        r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=d, capture_output=True,
                           text=True)
        times[stage] = time.perf_counter() - t
        if r.returncode != 0:
            sys.exit(f"{name}/{stage} failed in {where} ({r.returncode}): {r.stderr[-2000:]}")
    times["total"] = sum(times.values())
    return times


def main() -> None:
    dirs = [a.split("=", 1) for a in sys.argv[1:]]
    if not dirs or any(len(d) != 2 for d in dirs):
        sys.exit(__doc__)
    rounds = int(os.environ.get("ROUNDS", "3"))
    scale = float(os.environ.get("SCALE", "1"))
    chosen = os.environ.get("PIPELINES", ",".join(PIPELINES)).split(",")
    cache = os.environ.get("CACHE", "/var/tmp/tessera-pipelines")
    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    for name in chosen:
        gen, stages, outputs = PIPELINES[name]
        src = os.path.join(cache, f"{gen.__name__}-{scale}")
        if not os.path.exists(os.path.join(src, ".done")):
            shutil.rmtree(src, ignore_errors=True)
            os.makedirs(src)
            gen(src, scale)
            open(os.path.join(src, ".done"), "w").close()
        results[name] = {label: {} for label, _ in dirs}
        ref = os.path.join(cache, f"{name}-outputs")
        for r in range(rounds):
            for i, (label, where) in enumerate(dirs):
                times = run(name, stages, src, where)
                for stage, t in times.items():
                    results[name][label].setdefault(stage, []).append(t)
                for o in outputs:
                    out = os.path.join(where, name, o)
                    if r == 0 and i == 0:
                        os.makedirs(os.path.dirname(os.path.join(ref, o)), exist_ok=True)
                        shutil.copyfile(out, os.path.join(ref, o))
                    elif not same(os.path.join(ref, o), out):
                        sys.exit(f"{name}: {o} in {label} differs from {dirs[0][0]}'s")
                shutil.rmtree(os.path.join(where, name))
            print(f"{name} round {r + 1}: " + ", ".join(
                f"{label} {results[name][label]['total'][-1]:.2f} s" for label, _ in dirs),
                flush=True)
        shutil.rmtree(ref)
    report(results, [label for label, _ in dirs])
    out = os.environ.get("OUT", "/tmp/bench-pipelines.json")
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"results: {out}")


def report(results: dict[str, dict[str, dict[str, list[float]]]], labels: list[str]) -> None:
    last = labels[-1]
    print(f"\n| pipeline / stage | " + " | ".join(f"{l} s" for l in labels) + " | "
          + " | ".join(f"{last}/{l}" for l in labels[:-1]) + " |")
    print("|---" * (2 * len(labels)) + "|")
    for name, per in results.items():
        for stage in per[labels[0]]:
            med = {l: statistics.median(per[l][stage]) for l in labels}
            row = [f"{med[l]:.2f}" for l in labels]
            row += [f"{med[last] / med[l]:.2f}x" for l in labels[:-1]]
            print(f"| {name} / {stage} | " + " | ".join(row) + " |")
    print("\nOutputs the same in every directory and round (FITS images within 1e-5).")


if __name__ == "__main__":
    main()
