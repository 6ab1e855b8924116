"""Every operation of tessera.Client and tessera.TesseraFile, and its errors."""

from __future__ import annotations

import errno
import io
import os
import re
import stat
import threading
from pathlib import Path

import pytest

import tessera
from tessera import Client, LocalCluster


def test_write_read_seek_tell(client: Client, base: str) -> None:
    p = f"{base}/f.bin"
    data = os.urandom(3 * client.stripe_size + 12345)  # spans stripes, ragged end
    with client.open(p, "wb") as f:
        assert f.writable() and not f.readable() and f.seekable()
        assert f.write(data[:100]) == 100
        assert f.write(memoryview(data)[100:]) == len(data) - 100
        assert f.tell() == len(data)
    assert client.info(p)["size"] == len(data)
    with client.open(p) as f:
        assert f.size == len(data)
        assert f.read(10) == data[:10]
        assert f.tell() == 10
        assert f.seek(client.stripe_size - 5) == client.stripe_size - 5
        assert f.read(10) == data[client.stripe_size - 5 : client.stripe_size + 5]
        assert f.seek(-7, io.SEEK_END) == len(data) - 7
        assert f.read() == data[-7:]
        assert f.read() == b""
        f.seek(0)
        assert f.read() == data
        f.seek(100)
        f.seek(-50, io.SEEK_CUR)
        buf = bytearray(20)
        assert f.readinto(buf) == 20 and bytes(buf) == data[50:70]
        with pytest.raises(OSError):
            f.seek(-1)
        with pytest.raises(io.UnsupportedOperation):
            f.write(b"x")
    assert f.closed
    with pytest.raises(ValueError):
        f.read()


def test_aligned_stripe_reads_return_the_received_bytes(client: Client, base: str) -> None:
    s = client.stripe_size
    p = f"{base}/z.bin"
    data = os.urandom(2 * s + 4321)
    client.pipe(p, data)
    with client.open(p) as f:
        first = f.read(s)
        f.seek(0)
        # The very object the stripe was received into, not a copy of it.
        assert f.read(s) is first
        assert f.read(s) == data[s : 2 * s]
        assert f.read(s) == data[2 * s :]  # the tail, read ahead to the end of the file
        assert f.read(s) == b""
    with client.open(p, "r+b") as f:
        f.seek(s)
        f.write(b"new")
        f.seek(s)
        assert f.read(s) == b"new" + data[s + 3 : 2 * s]
    # The objects outlive the handle and the client's buffers.
    del f
    import gc

    gc.collect()
    assert first == data[:s]


def test_lines_and_text(client: Client, base: str) -> None:
    p = f"{base}/t.txt"
    client.pipe(p, b"one\ntwo\nthree\n")
    with client.open(p) as f:
        assert list(f) == [b"one\n", b"two\n", b"three\n"]
    with io.TextIOWrapper(client.open(p)) as t:
        assert t.read().split() == ["one", "two", "three"]


def test_modes(client: Client, base: str) -> None:
    p = f"{base}/m"
    with client.open(p, "xb") as f:
        f.write(b"abc")
    with pytest.raises(FileExistsError):
        client.open(p, "xb")
    with client.open(p, "ab") as f:
        f.write(b"def")
    assert client.cat(p) == b"abcdef"
    with client.open(p, "r+b") as f:
        f.seek(1)
        f.write(b"XY")
        f.seek(0)
        assert f.read() == b"aXYdef"
    with client.open(p, "a+b") as f:
        f.write(b"!")
        f.seek(0)
        assert f.read() == b"aXYdef!"
    with client.open(p, "w+b") as f:
        assert f.read() == b""
        f.write(b"new")
        f.seek(0)
        assert f.read() == b"new"
        assert f.truncate(1) == 1
    assert client.cat(p) == b"n"
    with client.open(p, "r+b") as f:
        f.truncate(5)
    assert client.cat(p) == b"n\0\0\0\0"
    for bad in ("r", "w", "rt", "rwb", "bb", "q"):
        with pytest.raises(ValueError):
            client.open(p, bad)


def test_cat_ranges(client: Client, base: str) -> None:
    p = f"{base}/r"
    data = bytes(range(256)) * 10000
    client.pipe(p, data)
    assert client.cat(p) == data
    for s, e in [(0, 10), (5, None), (None, 7), (-10, None), (-10, -2), (100, 50), (0, 10**9),
                 (len(data) - 3, None), (10**9, None)]:
        assert client.cat(p, s, e) == data[s:e], (s, e)


def test_namespace(client: Client, base: str) -> None:
    client.mkdir(f"{base}/a")
    client.makedirs(f"{base}/a/b/c")
    client.makedirs(f"{base}/a/b/c", exist_ok=True)
    client.mkdir(f"{base}/a", exist_ok=True)
    with pytest.raises(FileExistsError):
        client.makedirs(f"{base}/a/b/c")
    with pytest.raises(FileExistsError):
        client.mkdir(f"{base}/a")
    with pytest.raises(FileNotFoundError):
        client.mkdir(f"{base}/x/y")
    client.mkdir(f"{base}/x/y", parents=True)
    client.pipe(f"{base}/a/f", b"1")
    with pytest.raises(FileExistsError):
        client.mkdir(f"{base}/a/f", exist_ok=True)  # a file is in the way
    with pytest.raises(NotADirectoryError):
        client.mkdir(f"{base}/a/f/g", parents=True)
    assert client.exists(f"{base}/a/f") and not client.exists(f"{base}/a/nope")
    assert not client.exists(f"{base}/a/f/below")
    assert client.isdir(f"{base}/a") and client.isfile(f"{base}/a/f")
    names = client.ls(f"{base}/a", detail=False)
    assert names == [f"{base}/a/b", f"{base}/a/f"]
    detail = client.ls(f"tessera://{base.lstrip('/')}/a")
    assert [(d["name"], d["type"], d["size"]) for d in detail] == [
        (f"{base}/a/b", "directory", 0),
        (f"{base}/a/f", "file", 1),
    ]
    info = client.info(f"{base}/a/f")
    assert info["mode"] & 0o170000 == 0o100000 and info["nlink"] == 1 and info["mtime"] > 0
    with pytest.raises(NotADirectoryError):
        client.ls(f"{base}/a/f")
    with pytest.raises(FileNotFoundError):
        client.ls(f"{base}/nope")
    with pytest.raises(IsADirectoryError):
        client.open(f"{base}/a")
    with pytest.raises(IsADirectoryError):
        client.open(f"{base}/a", "wb")
    with pytest.raises(FileNotFoundError):
        client.open(f"{base}/nope/f", "wb")

    # rename: file, directory, over an existing file, into another directory
    client.mv(f"{base}/a/f", f"{base}/a/g")
    assert client.cat(f"{base}/a/g") == b"1" and not client.exists(f"{base}/a/f")
    client.pipe(f"{base}/a/h", b"2")
    client.mv(f"{base}/a/h", f"{base}/a/g")
    assert client.cat(f"{base}/a/g") == b"2"
    client.mv(f"{base}/a/b", f"{base}/x/b")
    assert client.isdir(f"{base}/x/b/c")
    with pytest.raises(FileNotFoundError):
        client.mv(f"{base}/nope", f"{base}/x/z")
    client.copy(f"{base}/a/g", f"{base}/x/copy")
    assert client.cat(f"{base}/x/copy") == b"2"

    # removal
    with pytest.raises(IsADirectoryError):
        client.rm(f"{base}/x")
    with pytest.raises(OSError) as e:
        client.rmdir(f"{base}/x")
    assert e.value.errno == errno.ENOTEMPTY
    with pytest.raises(NotADirectoryError):
        client.rmdir(f"{base}/a/g")
    client.rm(f"{base}/a/g")
    with pytest.raises(FileNotFoundError):
        client.rm(f"{base}/a/g")
    client.rmdir(f"{base}/a")
    client.rm(f"{base}/x", recursive=True)
    assert client.ls(base) == []


def test_chmod_and_usage(client: Client, base: str) -> None:
    client.pipe(f"{base}/p", b"x")
    client.chmod(f"{base}/p", 0o600)
    assert client.info(f"{base}/p")["mode"] & 0o777 == 0o600
    u = client.usage()
    assert u["nodes"] == 3 and u["capacity"] >= u["used"] >= 0 and u["capacity"] > 0


def test_batches(client: Client, base: str, tmp_path: Path) -> None:
    items = [(f"{base}/b{i}", os.urandom(i * 1000)) for i in range(50)]
    assert client.pipe_many(items) == [None] * 50
    got = client.cat_many([p for p, _ in items] + [f"{base}/missing"])
    assert got[:50] == [d for _, d in items]
    assert isinstance(got[50], FileNotFoundError)
    ranges = client.cat_many([p for p, _ in items], [1] * 50, [-1] * 50)
    assert ranges == [d[1:-1] for _, d in items]
    for i, (_, d) in enumerate(items):
        (tmp_path / f"l{i}").write_bytes(d)
    out = client.put_many([(tmp_path / f"l{i}", f"{base}/up/{i}") for i in range(50)])
    assert all(isinstance(o, FileNotFoundError) for o in out)  # parent missing
    client.mkdir(f"{base}/up")
    assert client.put_many([(tmp_path / f"l{i}", f"{base}/up/{i}") for i in range(50)]) == [
        None
    ] * 50
    (tmp_path / "down").mkdir()
    out = client.get_many([(f"{base}/up/{i}", tmp_path / "down" / str(i)) for i in range(50)])
    assert out == [None] * 50
    for i, (_, d) in enumerate(items):
        assert (tmp_path / "down" / str(i)).read_bytes() == d
    assert isinstance(client.put_many([(tmp_path / "nope", f"{base}/n")])[0], OSError)


def test_threads_read_and_write_different_files(client: Client, base: str) -> None:
    """Many threads at once, each writing then reading its own files (the GIL is released
    while data moves, so they overlap)."""
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(5):
                data = os.urandom(200_000 + t * 1000 + i)
                p = f"{base}/th{t}-{i}"
                with client.open(p, "wb") as f:
                    for k in range(0, len(data), 65536):
                        f.write(data[k : k + 65536])
                with client.open(p) as f:
                    assert f.read() == data
                assert client.cat(p, 10, 20) == data[10:20]
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(client.ls(base)) == 16 * 5


def test_dropped_handle_is_closed(client: Client, base: str) -> None:
    f = client.open(f"{base}/dropped", "wb")
    f.write(b"kept")
    f.flush()
    del f
    assert client.cat(f"{base}/dropped") == b"kept"


def test_enospc() -> None:
    with LocalCluster(servers=1, memory="16MiB") as small:
        c = small.client()
        with pytest.raises(OSError) as e:
            with c.open("/big", "wb") as f:
                for _ in range(32):
                    f.write(b"\1" * (1 << 20))
        assert e.value.errno == errno.ENOSPC
        with pytest.raises(OSError) as e:
            c.pipe("/big2", b"\2" * (32 << 20))
        assert e.value.errno == errno.ENOSPC
        c.rm("/big")
        c.rm("/big2")
        c.pipe("/small", b"fits")  # the cluster works on after ENOSPC
        assert c.cat("/small") == b"fits"


def test_finding_the_cluster(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cluster.manager and cluster.secret
    for k in ("TESSERA_MANAGER", "TESSERA_SECRET", "TESSERA_CONFIG"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TESSERA_HOME", str(tmp_path / "home"))
    with pytest.raises(ValueError, match="no manager address"):
        Client()
    # the cluster file tessera up writes
    (tmp_path / "home").mkdir()
    cluster_file = tmp_path / "home" / "cluster.toml"
    cluster_file.write_text(
        f'manager = "{cluster.manager}"\nsecret = "{cluster.secret}"\nhttp = "x"\n'
    )
    assert tessera.cluster_file() == cluster_file
    # a cluster file others can read is made private again, and said so
    cluster_file.chmod(0o644)
    with pytest.warns(UserWarning, match=f"{re.escape(str(cluster_file))} holds the cluster secret"):
        assert Client().manager == cluster.manager
    assert stat.S_IMODE(cluster_file.stat().st_mode) == 0o600
    # a secret in a file of the user's that others can read: told how to fix it
    shared = tmp_path / "shared.toml"
    shared.write_text(f'secret = "{cluster.secret}"\n')
    shared.chmod(0o644)
    with pytest.warns(UserWarning, match=re.escape(f"chmod 600 {shared}")):
        assert Client(config=shared).manager == cluster.manager
    assert stat.S_IMODE(shared.stat().st_mode) == 0o644
    # an explicit config file wins over the cluster file
    cfg = tmp_path / "c.toml"
    cfg.write_text('manager = "127.0.0.1:1"\n[server]\nmemory = "1g"\n')
    with pytest.raises(ConnectionError):
        Client(config=cfg, timeout=0.5)
    monkeypatch.setenv("TESSERA_CONFIG", str(cfg))
    with pytest.raises(ConnectionError):
        Client(timeout=0.5)
    # the environment wins over files, arguments over the environment
    monkeypatch.setenv("TESSERA_MANAGER", cluster.manager)
    assert Client().manager == cluster.manager
    assert Client(manager=cluster.manager, secret=cluster.secret).manager == cluster.manager
    monkeypatch.setenv("TESSERA_SECRET", "wrong")
    with pytest.raises(PermissionError, match="secret"):
        Client()
    with pytest.raises(ValueError, match="bad manager address"):
        Client(manager="nowhere", secret="s")
    monkeypatch.delenv("TESSERA_MANAGER")
    monkeypatch.delenv("TESSERA_SECRET")
    (tmp_path / "bad.toml").write_text("manager = [")
    with pytest.raises(ValueError, match="bad configuration"):
        Client(config=tmp_path / "bad.toml")


def test_find_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        tessera.find_binary(tmp_path / "nope")
    monkeypatch.setenv("TESSERA_BIN", str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError):
        tessera.find_binary()
    monkeypatch.delenv("TESSERA_BIN")
    assert tessera.find_binary().name == "tessera"
