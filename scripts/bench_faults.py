"""Failures through `tessera up` as users start it (issue 29), timed from outside.

One cluster: `tessera up --servers 4 --replication 2 --mount M` (release build), SIZE written
through the mount as files of 64 MiB. Then:

- baseline: a sequential read of everything through the mount (page cache dropped);
- kill -9 of one server: the time until `status` shows it dead (detection), until every
  partition has two complete copies again (restore), and the bytes the dead server held (its
  `used`), so the restore rate per GiB; a sequential read runs during the rebuild;
- kill -9 of the manager: the time until a manager answers again with all servers alive
  (`up` starts it after 1 s; the recovery window is one dead-node time), and a read loop's
  longest stall meanwhile;
- SIGSTOP of the manager and kill -9 of a server together: a sequential read of everything
  from the copies left, a new client (`tessera ls /`) started from the servers the cluster file
  lists, and the time until `up` has replaced the silent manager and the cluster has two
  copies of everything again.

Prints one JSON object (and writes it to OUT if set).
Usage: python3 scripts/bench_faults.py TESSERA_BIN SIZE_GIB DEAD_AFTER_S
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

from bench_procs import children, drop_caches

CHUNK = 64 << 20


def status(bin_: str, home: Path) -> dict[str, Any] | None:
    out = subprocess.run(
        [bin_, "status", "--json"],
        env={**os.environ, "TESSERA_HOME": str(home)},
        capture_output=True,
        timeout=120,
    )
    try:
        parsed: dict[str, Any] = json.loads(out.stdout)
        return parsed
    except json.JSONDecodeError:
        return None


def seeds(home: Path) -> list[str]:
    """The servers the cluster file lists for clients to start from."""
    try:
        with open(home / "cluster.toml", "rb") as f:
            return list(tomllib.load(f).get("seeds", []))
    except (OSError, tomllib.TOMLDecodeError):
        return []


def read_all(files: list[Path]) -> float:
    """Reads every file; returns GB/s."""
    t = time.monotonic()
    n = 0
    for f in files:
        with open(f, "rb", buffering=0) as h:
            while chunk := h.read(1 << 20):
                n += len(chunk)
    return n / (time.monotonic() - t) / 1e9


def wait_for(what: str, within: float, poll: float, cond: Any) -> float:
    t = time.monotonic()
    while not cond():
        if time.monotonic() - t > within:
            raise SystemExit(f"{what}: not within {within} s")
        time.sleep(poll)
    return time.monotonic() - t


def main() -> None:
    bin_, size_gib, dead_after = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    home = Path(tempfile.mkdtemp(prefix="tessera-bench-faults."))
    mnt = home / "mnt"
    mnt.mkdir()
    env = {**os.environ, "TESSERA_HOME": str(home), "TESSERA_SECRET": "bench-faults"}
    per_server = max(1, int(size_gib * 2 / 3 + 1))
    log = open(home / "up.log", "wb")
    up = subprocess.Popen(
        [bin_, "--manager", "127.0.0.1:17370", "up", "--http", "127.0.0.1:17371",
         "--servers", "4", "--memory", f"{per_server}GiB", "--replication", "2",
         "--dead-after", f"{dead_after}s", "--mount", str(mnt)],
        env=env, stdout=log, stderr=log,
    )
    result: dict[str, Any] = {"size_gib": size_gib, "dead_after_s": dead_after}
    try:
        wait_for("the cluster", 60, 0.1,
                 lambda: (home / "cluster.toml").exists() and os.path.ismount(mnt))
        files = []
        block = os.urandom(1 << 20)
        t = time.monotonic()
        for i in range(int(size_gib * (1 << 30) // CHUNK)):
            f = mnt / f"f{i}"
            with open(f, "wb") as h:
                for _ in range(CHUNK >> 20):
                    h.write(block)
                h.flush()
                os.fsync(h.fileno())
            files.append(f)
        result["write_gbps"] = len(files) * CHUNK / (time.monotonic() - t) / 1e9
        drop_caches()
        result["read_gbps"] = read_all(files)

        st = status(bin_, home)
        assert st is not None
        victim = children(up.pid, "server")[0]
        # The victim's node: the one alive on the address it listens on.
        argv = Path(f"/proc/{victim}/cmdline").read_bytes().split(b"\0")
        ip = argv[argv.index(b"--listen") + 1].decode().rsplit(":", 1)[0]
        nodes = st["nodes"]
        (node,) = [n["id"] for n in nodes if n["alive"] and n["addr"].startswith(ip + ":")]
        held = sum(n["stats"]["used"] for n in nodes) / len(nodes)
        result["held_per_server_gib"] = held / (1 << 30)
        t0 = time.monotonic()
        os.kill(victim, signal.SIGKILL)

        def alive() -> int:
            s = status(bin_, home)
            return 0 if s is None else sum(1 for n in s["nodes"] if n["alive"])

        def dead() -> bool:
            s = status(bin_, home)
            return s is not None and any(n["id"] == node and not n["alive"] for n in s["nodes"])

        result["detect_s"] = wait_for("detection", 60, 0.02, dead)
        during: dict[str, float] = {}
        drop_caches()
        reader = threading.Thread(target=lambda: during.update(gbps=read_all(files)))
        reader.start()

        def healthy() -> bool:
            s = status(bin_, home)
            return s is not None and s["degraded"] == 0 and s["incoming"] == 0 and alive() == 4

        wait_for("full replication", 600, 0.1, healthy)
        result["restore_s"] = time.monotonic() - t0
        result["restore_s_per_gib"] = result["restore_s"] / result["held_per_server_gib"]
        reader.join()
        result["read_during_rebuild_gbps"] = during["gbps"]

        # The manager: a read loop's longest stall while it is killed and started again.
        stall = [0.0]
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                for f in files[:4]:
                    t = time.monotonic()
                    with open(f, "rb") as h:
                        h.read(1 << 20)
                    stall[0] = max(stall[0], time.monotonic() - t)

        looper = threading.Thread(target=loop)
        looper.start()
        epoch = status(bin_, home)["epoch"]  # type: ignore[index]
        (manager,) = children(up.pid, "manager")
        t0 = time.monotonic()
        os.kill(manager, signal.SIGKILL)
        wait_for("a manager again", 60, 0.02,
                 lambda: (s := status(bin_, home)) is not None
                 and sum(1 for n in s["nodes"] if n["alive"]) == 4)
        result["manager_answers_s"] = time.monotonic() - t0
        wait_for("recovery", 60, 0.05,
                 lambda: b"the cluster is recovered" in (home / "up.log").read_bytes())
        result["manager_recovered_s"] = time.monotonic() - t0
        stop.set()
        looper.join()
        result["read_stall_during_manager_restart_s"] = stall[0]
        after = status(bin_, home)
        result["epochs"] = [epoch, after["epoch"] if after else None]

        # The manager hung (SIGSTOP) and a server killed with it: reads from the copies left,
        # a new client started from the servers the cluster file lists, until `up` kills the
        # silent manager (--manager-timeout, 10 s) and a new one rebuilds the cluster.
        wait_for("four servers listed", 30, 0.1, lambda: len(seeds(home)) == 4)
        wait_for("a healthy cluster", 600, 0.1, healthy)
        (manager,) = children(up.pid, "manager")
        victim = children(up.pid, "server")[0]
        t0 = time.monotonic()
        os.kill(manager, signal.SIGSTOP)
        os.kill(victim, signal.SIGKILL)
        drop_caches()
        result["read_manager_hung_server_dead_gbps"] = read_all(files)
        t = time.monotonic()
        subprocess.run([bin_, "ls", "/"], env=env, check=True, capture_output=True)
        result["new_client_manager_hung_s"] = time.monotonic() - t
        result["manager_hung_read_window_s"] = time.monotonic() - t0
        wait_for("a new manager, and two copies again", 600, 0.1, healthy)
        result["manager_hung_to_healthy_s"] = time.monotonic() - t0
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
        log.close()
    text = json.dumps(result, indent=1)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).write_text(text)


if __name__ == "__main__":
    main()
