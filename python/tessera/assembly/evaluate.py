"""Contigs aligned back to the genome they came from (minimap2), counting misassemblies."""

from __future__ import annotations

import shutil
import subprocess
from typing import Dict, List, Tuple


def evaluate(contigs_fa: str, genome_fa: str, min_length: int = 200) -> Dict[str, float]:
    """Aligns the contigs of ``min_length`` or more to the genome with ``minimap2 -x asm5``.
    A contig is misassembled when its alignment is split (more than one primary or
    supplementary alignment) or its one alignment leaves over 5 % of it (and over 50 bases:
    minimap2 clips a few bases at the ends of exact matches) unaligned; unaligned when it has
    none. Also the share of the genome the alignments cover."""
    exe = shutil.which("minimap2")
    if exe is None:
        raise FileNotFoundError("minimap2 is not installed (Debian package minimap2)")
    out = subprocess.run(
        [exe, "-x", "asm5", "--secondary=no", genome_fa, contigs_fa],
        check=True, capture_output=True, text=True,
    ).stdout
    lengths: Dict[str, int] = {}
    hits: Dict[str, List[Tuple[int, int]]] = {}
    covered: Dict[str, List[Tuple[int, int]]] = {}
    genome_len: Dict[str, int] = {}
    for line in out.splitlines():
        f = line.split("\t")
        q, qlen, qs, qe = f[0], int(f[1]), int(f[2]), int(f[3])
        t, tlen, ts, te = f[5], int(f[6]), int(f[7]), int(f[8])
        lengths[q] = qlen
        genome_len[t] = tlen
        hits.setdefault(q, []).append((qs, qe))
        covered.setdefault(t, []).append((ts, te))
    from .contigs import read_fasta

    with open(contigs_fa) as fh:
        seqs = [s for s in read_fasta(fh.read()) if len(s) >= min_length]
    with open(genome_fa) as fh:
        total_genome = sum(len(s) for s in read_fasta(fh.read()))
    mis = sum(
        1 for q, h in hits.items()
        if lengths[q] >= min_length
        and (len(h) > 1 or _unaligned(h[0], lengths[q]) > max(0.05 * lengths[q], 50))
    )
    aligned = sum(1 for q in hits if lengths[q] >= min_length)
    return {
        "contigs": len(seqs),
        "aligned": aligned,
        "unaligned": len(seqs) - aligned,
        "misassembled": mis,
        "genome_fraction": _union(covered) / max(1, total_genome),
    }


def _unaligned(hit: Tuple[int, int], length: int) -> int:
    return length - (hit[1] - hit[0])


def _union(intervals: Dict[str, List[Tuple[int, int]]]) -> int:
    total = 0
    for ivs in intervals.values():
        end = -1
        for s, e in sorted(ivs):
            if e > end:
                total += e - max(s, end)
                end = e
    return total
