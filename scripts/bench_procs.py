"""What the benchmark scripts share about the processes `tessera up` starts and the page cache."""

from __future__ import annotations

import os
from pathlib import Path


def children(parent: int, role: str) -> list[int]:
    """The pids of `parent`'s children running `tessera ROLE` (a server, the manager) or
    `tessera --manager ADDR mount` (the mount)."""
    pids = []
    for e in Path("/proc").iterdir():
        if not e.name.isdigit():
            continue
        try:
            stat = (e / "stat").read_text()
            cmd = (e / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and role.encode() in cmd[1:4]:
            pids.append(int(e.name))
    return pids


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
