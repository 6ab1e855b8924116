"""A file written through Python is the same file for the command line and a FUSE mount."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tessera import Client, LocalCluster


def test_command_line_reads_what_python_wrote(
    cluster: LocalCluster, client: Client, base: str
) -> None:
    data = os.urandom(3 * client.stripe_size + 777)
    with client.open(f"{base}/py.bin", "wb") as f:
        f.write(data)
    env = {**os.environ, **cluster.env}
    out = subprocess.run(
        [str(cluster.binary), "cat", f"tessera:{base}/py.bin"], env=env, capture_output=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == data
    # and the other way round
    subprocess.run(
        [str(cluster.binary), "mkdir", "-p", f"{base}/from-cli"], env=env, check=True
    )
    assert client.isdir(f"{base}/from-cli")


def fuse_usable() -> bool:
    return os.geteuid() == 0 and os.path.exists("/dev/fuse")


@pytest.fixture(scope="module")
def mounted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    if not fuse_usable():
        pytest.skip("FUSE needs root and /dev/fuse")
    mnt = tmp_path_factory.mktemp("mnt")
    with LocalCluster(servers=2, memory="256MiB", mount=mnt) as c:
        yield c


def test_fuse_mount_sees_python_files(mounted: LocalCluster) -> None:
    assert mounted.mount is not None
    mnt: Path = mounted.mount
    c = mounted.client()
    data = os.urandom(2 * c.stripe_size + 12345)
    c.makedirs("/shared/dir")
    with c.open("/shared/dir/py.bin", "wb") as f:
        f.write(data)
    assert (mnt / "shared" / "dir" / "py.bin").read_bytes() == data
    assert sorted(os.listdir(mnt / "shared" / "dir")) == ["py.bin"]
    # and what the mount writes, Python reads
    (mnt / "shared" / "from-mount.txt").write_bytes(b"via fuse")
    assert c.cat("/shared/from-mount.txt") == b"via fuse"
    assert mounted.fs().cat_file("tessera://shared/dir/py.bin", 5, 10) == data[5:10]
