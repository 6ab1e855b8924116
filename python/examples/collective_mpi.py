"""MPI ranks as the writers of one sorted output: each rank "aligns reads" (here it makes up
SAM lines) and appends them keyed by (reference, position); finalisation leaves one SAM body
sorted by coordinate in Tessera, written by the coordinators in a few large writes.

    mpirun -n 4 python collective_mpi.py /out/aligned.sam [records per rank]

The cluster comes from TESSERA_MANAGER / TESSERA_SECRET or the cluster file, as for
``tessera.Client()``; the output's directory must exist. Rank 0 prints what was made (JSON).
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import asdict
from typing import Iterator, Tuple

import tessera

REFERENCES = ["chr1", "chr2", "chr10", "chrX"]


def key(reference: str, position: int) -> bytes:
    """Byte order = (reference as text, position as a number): the name, a 0 byte (so that
    chr1 sorts before chr10), the position as 8 big-endian bytes."""
    return reference.encode() + b"\0" + position.to_bytes(8, "big")


def alignments(rank: int, n: int) -> Iterator[Tuple[bytes, bytes]]:
    """Rank ``rank``'s (key, line) pairs: deterministic, so a test can rebuild them."""
    rng = random.Random(rank)
    for i in range(n):
        ref = rng.choice(REFERENCES)
        pos = rng.randrange(1, 250_000)
        seq = "".join(rng.choice("ACGT") for _ in range(36))
        line = f"read{rank}.{i}\t0\t{ref}\t{pos}\t60\t36M\t*\t0\t0\t{seq}\t{'I' * 36}\n"
        yield key(ref, pos), line.encode()


def main() -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    path = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    w = tessera.collective(path, writers=comm.size, rank=comm.rank, sorted=True, threshold=1 << 20)
    try:
        for i, (k, line) in enumerate(alignments(comm.rank, n)):
            w.append(line, k)  # buffered; full buffers go out as sorted runs in the background
            if i % 5000 == 4999 and not w.test():
                pass  # a run is still being written: the computation goes on meanwhile
        result = w.finalize()  # every rank returns once the output is in place
    except BaseException as e:
        w.abort(f"rank {comm.rank}: {e!r}")  # the other ranks fail, naming this one
        raise
    if comm.rank == 0:
        print(json.dumps(asdict(result)))


if __name__ == "__main__":
    main()
