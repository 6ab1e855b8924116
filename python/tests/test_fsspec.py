"""The tessera:// fsspec file system: fsspec's own abstract test classes, and what pandas and
Dask rely on (globbing, ranged reads, pipe, put/get)."""

from __future__ import annotations

import posixpath
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import fsspec
import pytest
from fsspec.tests.abstract import (
    AbstractCopyTests,
    AbstractFixtures,
    AbstractGetTests,
    AbstractOpenTests,
    AbstractPipeTests,
    AbstractPutTests,
)

from tessera import LocalCluster
from tessera.fsspec import TesseraFileSystem


class TesseraFixtures(AbstractFixtures):  # type: ignore[misc]
    @pytest.fixture
    def fs(self, cluster: LocalCluster) -> TesseraFileSystem:
        # Like fsspec's own local fixture (LocalFileSystem(auto_mkdir=True)): the scenarios
        # write files without creating their directories first.
        return cluster.fs(auto_mkdir=True)

    @pytest.fixture
    def fs_join(self) -> Callable[..., str]:
        return posixpath.join

    @pytest.fixture
    def fs_path(self, fs: TesseraFileSystem) -> Iterator[str]:
        path = f"/abstract-{uuid.uuid4().hex[:12]}"
        fs.mkdir(path)
        yield path
        fs.rm(path, recursive=True)


class TestTesseraCopy(AbstractCopyTests, TesseraFixtures):  # type: ignore[misc]
    pass


class TestTesseraGet(AbstractGetTests, TesseraFixtures):  # type: ignore[misc]
    pass


class TestTesseraPut(AbstractPutTests, TesseraFixtures):  # type: ignore[misc]
    pass


class TestTesseraOpen(AbstractOpenTests, TesseraFixtures):  # type: ignore[misc]
    pass


class TestTesseraPipe(AbstractPipeTests, TesseraFixtures):  # type: ignore[misc]
    pass


def test_protocol_is_registered(cluster: LocalCluster, base: str) -> None:
    assert fsspec.get_filesystem_class("tessera") is TesseraFileSystem
    opts: dict[str, Any] = {"manager": cluster.manager, "secret": cluster.secret}
    url = f"tessera:/{base}/hello.txt"
    with fsspec.open(url, "w", **opts) as f:
        f.write("hello\nworld\n")
    with fsspec.open(url, "r", **opts) as f:
        assert f.read() == "hello\nworld\n"
    with fsspec.open(url + ".gz", "wt", compression="gzip", **opts) as f:
        f.write("zipped")
    with fsspec.open(url + ".gz", "rt", compression="infer", **opts) as f:
        assert f.read() == "zipped"
    fs, path = fsspec.core.url_to_fs(url, **opts)
    assert isinstance(fs, TesseraFileSystem) and path == f"{base}/hello.txt"
    assert fs.unstrip_protocol(path) == f"tessera:/{base}/hello.txt"


def test_environment_finds_the_cluster(
    cluster: LocalCluster, base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in cluster.env.items():
        monkeypatch.setenv(k, v)
    TesseraFileSystem.clear_instance_cache()
    with fsspec.open(f"tessera:/{base}/env", "wb") as f:
        f.write(b"found")
    assert fsspec.filesystem("tessera").cat(f"{base}/env") == b"found"
    TesseraFileSystem.clear_instance_cache()


def test_glob_find_walk_du(fs: TesseraFileSystem, base: str) -> None:
    for p in ["a/1.csv", "a/2.csv", "a/x.txt", "a/b/3.csv", "c/4.csv"]:
        fs.pipe(f"{base}/{p}", b"12345", auto_mkdir=True) if False else None
    fs.makedirs(f"{base}/a/b")
    fs.makedirs(f"{base}/c")
    fs.pipe({f"{base}/{p}": b"12345" for p in ["a/1.csv", "a/2.csv", "a/x.txt", "a/b/3.csv", "c/4.csv"]})
    assert fs.glob(f"tessera:/{base}/a/*.csv") == [f"{base}/a/1.csv", f"{base}/a/2.csv"]
    assert fs.glob(f"{base}/**/*.csv") == [
        f"{base}/a/1.csv", f"{base}/a/2.csv", f"{base}/a/b/3.csv", f"{base}/c/4.csv"
    ]
    assert len(fs.find(base)) == 5
    assert fs.du(base) == 25
    assert [d for d, _, _ in fs.walk(base)] == [base, f"{base}/a", f"{base}/a/b", f"{base}/c"]
    assert fs.isdir(f"{base}/a") and fs.isfile(f"{base}/a/1.csv")
    assert fs.size(f"{base}/a/1.csv") == 5
    assert fs.modified(f"{base}/a/1.csv").year >= 2024
    assert fs.ls(f"{base}/a/1.csv", detail=False) == [f"{base}/a/1.csv"]
    fs.rm(f"{base}/a/*.csv")
    assert fs.ls(f"{base}/a", detail=False) == [f"{base}/a/b", f"{base}/a/x.txt"]
    with pytest.raises(IsADirectoryError):
        fs.rm(f"{base}/c")
    fs.rm(f"{base}/c", recursive=True)
    assert not fs.exists(f"{base}/c")


def test_cat_file_ranges_and_cat_many(fs: TesseraFileSystem, base: str) -> None:
    data = bytes(range(256)) * 4096
    fs.pipe_file(f"{base}/r", data)
    assert fs.cat_file(f"{base}/r") == data
    assert fs.cat_file(f"{base}/r", 10, 20) == data[10:20]
    assert fs.cat_file(f"{base}/r", -5) == data[-5:]
    assert fs.cat_file(f"{base}/r", start=1 << 20, end=-1) == data[1 << 20 : -1]
    assert fs.read_block(f"{base}/r", 100, 50) == data[100:150]
    assert fs.head(f"{base}/r", 3) == data[:3] and fs.tail(f"{base}/r", 3) == data[-3:]
    fs.pipe({f"{base}/m{i}": bytes([i]) * i for i in range(40)})
    got = fs.cat(f"{base}/m*")
    assert got == {f"{base}/m{i}": bytes([i]) * i for i in range(40)}
    out = fs.cat([f"{base}/m1", f"{base}/nope"], on_error="return")
    assert out[f"{base}/m1"] == b"\1" and isinstance(out[f"{base}/nope"], FileNotFoundError)
    assert fs.cat([f"{base}/m1", f"{base}/nope"], on_error="omit") == {f"{base}/m1": b"\1"}
    with pytest.raises(FileNotFoundError):
        fs.cat([f"{base}/m1", f"{base}/nope"])
    r = fs.cat_ranges([f"{base}/m5", f"{base}/r", f"{base}/nope"], [1, 0, 0], [3, 4, 1])
    assert r[:2] == [b"\5\5", data[:4]] and isinstance(r[2], FileNotFoundError)
    with pytest.raises(FileExistsError):
        fs.pipe_file(f"{base}/m1", b"x", mode="create")


def test_put_get_trees(fs: TesseraFileSystem, base: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {f"f{i}": bytes([i % 256]) * (i * 997) for i in range(60)}
    files["sub/big"] = bytes(range(256)) * 20000
    for name, d in files.items():
        (src / name).write_bytes(d)
    fs.put(str(src), f"tessera:/{base}/tree", recursive=True)
    for name, d in files.items():
        assert fs.cat_file(f"{base}/tree/{name}") == d
    fs.get(f"{base}/tree", str(tmp_path / "back"), recursive=True)
    for name, d in files.items():
        assert (tmp_path / "back" / name).read_bytes() == d
    fs.put_file(str(src / "f3"), f"{base}/single/f3")
    fs.get_file(f"{base}/single/f3", str(tmp_path / "one" / "f3"))
    assert (tmp_path / "one" / "f3").read_bytes() == files["f3"]
    with pytest.raises(FileNotFoundError):
        fs.get_file(f"{base}/nope", str(tmp_path / "x"))


def test_mv_cp_touch_mkdir(fs: TesseraFileSystem, base: str) -> None:
    fs.touch(f"{base}/t")
    assert fs.info(f"{base}/t")["size"] == 0
    fs.mv(f"{base}/t", f"{base}/u")
    assert not fs.exists(f"{base}/t") and fs.exists(f"{base}/u")
    fs.mkdir(f"{base}/d")
    fs.mv(f"{base}/u", f"{base}/d")
    assert fs.exists(f"{base}/d/u")
    fs.mv(f"{base}/d", f"{base}/e", recursive=True)
    assert fs.exists(f"{base}/e/u")
    fs.pipe_file(f"{base}/e/v", b"copied")
    fs.cp(f"{base}/e", f"{base}/f", recursive=True)
    assert fs.cat_file(f"{base}/f/v") == b"copied"
    with pytest.raises(FileExistsError):
        fs.mkdir(f"{base}/f")
    fs.makedirs(f"{base}/f", exist_ok=True)
    with pytest.raises(FileExistsError):
        fs.makedirs(f"{base}/f")
    auto = TesseraFileSystem(
        manager=fs.client.manager, secret=fs.storage_options["secret"], auto_mkdir=True
    )
    with auto.open(f"{base}/new/deep/file", "wb") as f:
        f.write(b"made")
    assert fs.cat_file(f"{base}/new/deep/file") == b"made"


def test_pickle_round_trip(fs: TesseraFileSystem, base: str) -> None:
    import pickle

    fs2 = pickle.loads(pickle.dumps(fs))
    fs.pipe_file(f"{base}/p", b"x")
    assert fs2.cat_file(f"{base}/p") == b"x"
