"""A small deterministic read simulator (for tests and machines without wgsim/dwgsim): a
random genome, reads from both strands at uniform positions, substitution errors, and a
share of reads with an N (which the assembler drops)."""

from __future__ import annotations

from typing import List

import numpy as np

from .kmers import BASES, revcomp


def genome(length: int, seed: int = 1) -> str:
    rng = np.random.default_rng(seed)
    return bytes(np.frombuffer(BASES, np.uint8)[rng.integers(0, 4, length)]).decode()


def reads(
    ref: str, coverage: float, length: int = 100, error_rate: float = 0.0,
    n_rate: float = 0.0, seed: int = 1,
) -> str:
    """FASTQ of reads of ``length`` bases covering ``ref`` ``coverage`` times."""
    if length > len(ref):
        raise ValueError("reads longer than the genome")
    rng = np.random.default_rng(seed)
    count = int(coverage * len(ref) / length)
    out: List[str] = []
    for i in range(count):
        pos = int(rng.integers(0, len(ref) - length + 1))
        s = ref[pos : pos + length]
        if rng.random() < 0.5:
            s = revcomp(s)
        chars = list(s)
        for j in np.flatnonzero(rng.random(length) < error_rate).tolist():
            chars[j] = "ACGT".replace(chars[j], "")[int(rng.integers(0, 3))]
        if rng.random() < n_rate:
            chars[int(rng.integers(0, length))] = "N"
        out.append(f"@r{i}/{pos}\n{''.join(chars)}\n+\n{'I' * length}\n")
    return "".join(out)
