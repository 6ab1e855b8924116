"""Reads to k-mers: FASTQ parsing, 2-bit codes, (k-mer, next k-mer) edges, hashing.

A k-mer (k <= 31) is a ``uint64`` of 2-bit bases, first base in the highest bits (A=0, C=1,
G=2, T=3), so sorting codes sorts k-mers alphabetically. An edge from a k-mer to the next one
in a read is the (k+1)-mer that spans both: its top 2k bits are the source, its low 2k bits the
target.
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np

BASES = b"ACGT"
_CODE = np.full(256, 255, dtype=np.uint8)
for _i, _b in enumerate(BASES):
    _CODE[_b] = _i
_ASCII = np.frombuffer(BASES, dtype=np.uint8)
_COMPLEMENT = bytes.maketrans(b"ACGT", b"TGCA")
MAX_K = 31


def check_k(k: int) -> None:
    if not 2 <= k <= MAX_K:
        raise ValueError(f"k must be between 2 and {MAX_K} (a k-mer and its edge fit 64 bits)")


def revcomp(seq: str) -> str:
    return revcomp_bytes(seq.encode()).decode()


def revcomp_bytes(seq: bytes) -> bytes:
    return seq.translate(_COMPLEMENT)[::-1]


def both_strands(seqs: List[bytes]) -> List[bytes]:
    """The reads and their reverse complements: a read may come from either strand, so the
    graph holds every k-mer and edge with its reverse complement, seen as often, and the two
    strands simplify alike (each contig comes with its reverse complement)."""
    return seqs + [revcomp_bytes(s) for s in seqs]


def codes_of(seq: bytes) -> np.ndarray:
    """The 2-bit codes (0-3) of an A/C/G/T sequence."""
    return np.asarray(_CODE[np.frombuffer(seq, dtype=np.uint8)])


def pack_codes(codes: np.ndarray) -> np.ndarray:
    """2-bit codes, four to a byte (the first in the highest bits)."""
    padded = np.zeros(-(-len(codes) // 4) * 4, dtype=np.uint8)
    padded[: len(codes)] = codes
    q = padded.reshape(-1, 4)
    return np.asarray((q[:, 0] << 6) | (q[:, 1] << 4) | (q[:, 2] << 2) | q[:, 3], dtype=np.uint8)


def unpack_codes(packed: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` codes of ``pack_codes``'s bytes."""
    if n > 4 * len(packed):
        raise ValueError(f"{len(packed)} packed bytes cannot hold {n} bases")
    shifts = np.array([6, 4, 2, 0], dtype=np.uint8)
    return np.asarray(((packed[:, None] >> shifts[None, :]) & 3).ravel()[:n], dtype=np.uint8)


def ascii_of(codes: np.ndarray) -> bytes:
    return bytes(_ASCII[codes].tobytes())


_DIGITS = str.maketrans("ACGT", "0123")


def encode(kmer: str) -> int:
    """The code of an A/C/G/T k-mer."""
    return int(kmer.translate(_DIGITS), 4)


def decode_many(ids: np.ndarray, k: int) -> np.ndarray:
    """The bases (codes, shape ``(len(ids), k)``) of k-mer codes ``ids``."""
    shifts = np.arange(2 * (k - 1), -1, -2, dtype=np.uint64)
    return ((ids.astype(np.uint64)[:, None] >> shifts[None, :]) & np.uint64(3)).astype(np.uint8)


def decode(kmer: int, k: int) -> str:
    return ascii_of(decode_many(np.array([kmer], dtype=np.uint64), k)[0]).decode()


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 of every element: a fixed, well-spread hash (the same on every host)."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return np.asarray(z ^ (z >> np.uint64(31)))


def partition_of(ids: np.ndarray, parts: int) -> np.ndarray:
    """The graph partition of each vertex id."""
    return np.asarray((mix(ids) % np.uint64(parts)).astype(np.int64))


def fastq_sequences(data: bytes) -> List[bytes]:
    """The sequence lines of the whole FASTQ records in ``data`` (which starts at a record)."""
    lines = data.split(b"\n")
    n = len(lines) // 4
    return [lines[4 * i + 1].rstrip(b"\r") for i in range(n)]


def record_start(data: bytes, pos: int) -> int:
    """The offset of the first FASTQ record starting at or after ``pos`` in ``data``, or
    ``len(data)``. A record is a line starting with ``@`` whose third line starts with ``+``
    (a quality line may start with ``@``, but two lines after it is never a ``+`` line)."""
    if pos > 0:
        nl = data.find(b"\n", pos - 1)
        pos = len(data) if nl < 0 else nl + 1
    while pos < len(data):
        if data[pos : pos + 1] == b"@":
            a = data.find(b"\n", pos)
            b = data.find(b"\n", a + 1) if a >= 0 else -1
            if b >= 0 and data[b + 1 : b + 2] == b"+":
                return pos
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        pos = nl + 1
    return len(data)


def acgt_only(seqs: List[bytes]) -> List[bytes]:
    """The reads made of A, C, G and T only (PGA's filter: other reads are dropped)."""
    return [s for s in seqs if s and not s.translate(None, BASES)]


def edges_of(seqs: List[bytes], k: int) -> np.ndarray:
    """Every (k+1)-mer of the reads (an edge from each k-mer to the next), as codes."""
    width = k + 1
    reads = [s for s in seqs if len(s) >= width]
    if not reads:
        return np.zeros(0, dtype=np.uint64)
    lens = np.fromiter((len(s) for s in reads), dtype=np.int64, count=len(reads))
    codes = codes_of(b"".join(reads)).astype(np.uint64)
    total = len(codes)
    acc = np.zeros(total, dtype=np.uint64)
    for j in range(width):
        acc[: total - j] = (acc[: total - j] << np.uint64(2)) | codes[j:]
    starts = np.cumsum(lens) - lens
    pos_in_read = np.arange(total) - np.repeat(starts, lens)
    keep = pos_in_read <= np.repeat(lens, lens) - width
    return acc[keep]


def count(edges: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Distinct edges (sorted) and how often each occurs: the map side's combiner."""
    uniq, counts = np.unique(edges, return_counts=True)
    return uniq, counts.astype(np.uint32)
