"""The assembly on a Dask cluster spread over emulated hosts: `tessera evaluate --every-host`
runs scripts/workloads/assembly.sh on two hosts (network namespaces; root and /dev/fuse are
needed), a Dask worker on each and the scheduler on host 0; the contigs must be the
reference's and tasks must have run on both hosts. A host whose worker never joins fails the
run once the deadline is past, named."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

pytest.importorskip("distributed")

from tessera import find_binary  # noqa: E402

WORKLOAD = Path(__file__).resolve().parents[2] / "scripts" / "workloads" / "assembly.sh"

CONFIGS = """
runs = 1
[prices.node]
purchase = 3000
hourly = 0.25
[[config]]
name = "two"
hosts = 2
host = "node"
memory = "256MiB"
bandwidth = "1Gbit"
latency = "100us"
"""

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/dev/fuse"),
    reason="emulated hosts need root (network namespaces) and /dev/fuse",
)


def evaluate(tmp: Path, workload: str, env: Dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp / "configs.toml").write_text(CONFIGS)
    args: List[str] = [str(find_binary()), "evaluate", "configs.toml", "--every-host",
                       "--workload", workload, "--json", "v.json", "-o", "v.html"]
    return subprocess.run(args, cwd=tmp, env={**os.environ, "PYTHON": sys.executable, **env},
                          capture_output=True, text=True, timeout=900)


def test_assembly_on_workers_of_every_host(tmp_path: Path) -> None:
    out = evaluate(tmp_path, f"sh {WORKLOAD}", {"ASSEMBLY_TIMEOUT": "600"})
    assert out.returncode == 0, out.stdout + out.stderr
    run = json.loads((tmp_path / "v.json").read_text())["outcomes"][0]["runs"][0]
    assert len(run["host_seconds"]) == 2, run
    assert run["bytes"] > 0, run  # the reads, the shuffle and the contigs went through Tessera
    # host 0 checked the contigs against the reference, then named the workers that ran tasks:
    # one on each host's address
    line = re.search(r"assembly: host 0: tasks by worker: (.*)", out.stderr)
    assert line, out.stderr
    ran = dict(w.rsplit("=", 1) for w in line.group(1).split())
    hosts = {w.split("://")[1].rsplit(":", 1)[0] for w in ran}
    assert len(hosts) == 2 and all(int(n) > 0 for n in ran.values()), ran


def test_a_worker_that_never_joins_fails_the_run(tmp_path: Path) -> None:
    # host 1 never starts its worker: host 0 gives up at the deadline and says why
    workload = f'if [ "$TESSERA_HOST" -eq 1 ]; then sleep 3600; else sh {WORKLOAD}; fi'
    out = evaluate(tmp_path, workload, {"ASSEMBLY_TIMEOUT": "20"})
    assert out.returncode != 0
    assert "the workers did not all join within 20s" in out.stderr, out.stderr
    assert "the workload failed on host 0" in out.stderr, out.stderr
