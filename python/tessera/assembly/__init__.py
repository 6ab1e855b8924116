"""Genome assembly on Dask over Tessera: PGA's pipeline (de Bruijn graph construction by a
shuffle through files, then graph simplification as bulk-synchronous supersteps), with a
single-process reference implementation as its oracle. ``python -m tessera.assembly``.

Needs numpy and Dask distributed: ``pip install "tessera[assembly]"``.
"""

from .pipeline import Config, Result, run
from .supersteps import Params

__all__ = ["Config", "Params", "Result", "run"]
