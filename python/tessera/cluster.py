"""Start and stop a local Tessera cluster (``tessera up``) from Python: for tests and
notebooks.

>>> from tessera import LocalCluster
>>> with LocalCluster(servers=2, memory="512MiB") as cluster:   # doctest: +SKIP
...     fs = cluster.fs()                 # a tessera:// fsspec file system
...     fs.pipe("/x", b"data")
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

from ._client import Client

if TYPE_CHECKING:
    from .fsspec import TesseraFileSystem

PathLike = Union[str, "os.PathLike[str]"]


def find_binary(binary: Optional[PathLike] = None) -> Path:
    """The ``tessera`` executable: ``binary`` if given, else ``$TESSERA_BIN``, else
    ``tessera`` on the ``PATH``, else ``target/release/tessera`` or ``target/debug/tessera``
    of a Tessera workspace above the current directory (or above this package)."""
    if binary is not None:
        p = Path(binary)
        if not p.is_file():
            raise FileNotFoundError(f"tessera binary {p} does not exist")
        return p
    env = os.environ.get("TESSERA_BIN")
    if env:
        p = Path(env)
        if not p.is_file():
            raise FileNotFoundError(f"TESSERA_BIN={env} does not exist")
        return p
    on_path = shutil.which("tessera")
    if on_path:
        return Path(on_path)
    starts = [Path.cwd(), Path(__file__).resolve().parent]
    for start in starts:
        for d in [start, *start.parents]:
            for profile in ("release", "debug"):
                p = d / "target" / profile / "tessera"
                if p.is_file() and os.access(p, os.X_OK):
                    return p
    raise FileNotFoundError(
        "no tessera binary: pass binary=, set TESSERA_BIN, put tessera on the PATH, or build "
        "it in the workspace with `cargo build --release -p tessera-cli`"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _read_cluster_file(path: Path) -> Dict[str, str]:
    """The ``key = "value"`` lines of the file ``tessera up`` writes (no TOML parser needed
    on Python 3.9/3.10)."""
    out: Dict[str, str] = {}
    for line in path.read_text().splitlines():
        m = re.match(r'^\s*(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"\s*$', line)
        if m:
            out[m.group(1)] = m.group(2).encode().decode("unicode_escape")
    return out


class LocalCluster:
    """A whole Tessera cluster on this machine: ``tessera up`` (a manager and ``servers``
    storage servers on 127.0.0.x) in the background, optionally mounted (FUSE, as root) on
    ``mount``. Use it as a context manager, or call :meth:`start` and :meth:`stop`.

    Nothing is shared with a cluster you run yourself: it gets free ports, a fresh secret and
    its own ``TESSERA_HOME`` (a temporary directory unless ``home`` is given), where its log
    (``up.log``) and cluster file (``cluster.toml``) live.
    """

    def __init__(
        self,
        servers: int = 4,
        memory: str = "1GiB",
        *,
        binary: Optional[PathLike] = None,
        mount: Optional[PathLike] = None,
        stripe_size: Optional[str] = None,
        partitions: Optional[int] = None,
        home: Optional[PathLike] = None,
        extra_args: Sequence[str] = (),
        timeout: float = 60.0,
    ) -> None:
        self.servers = servers
        self.memory = memory
        self.binary = find_binary(binary)
        self.mount = None if mount is None else Path(mount)
        self.stripe_size = stripe_size
        self.partitions = partitions
        self._home_arg = None if home is None else Path(home)
        self.extra_args = list(extra_args)
        self.timeout = timeout
        self.home: Optional[Path] = None
        self.manager: Optional[str] = None
        self.secret: Optional[str] = None
        self.http: Optional[str] = None
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._tmp: Optional[tempfile.TemporaryDirectory[str]] = None

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> "LocalCluster":
        """Starts ``tessera up`` and waits until the cluster is ready (and mounted)."""
        if self._proc is not None:
            raise RuntimeError("the cluster is already running")
        if self._home_arg is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="tessera-")
            self.home = Path(self._tmp.name)
        else:
            self.home = self._home_arg
            self.home.mkdir(parents=True, exist_ok=True)
        cluster_file = self.home / "cluster.toml"
        cluster_file.unlink(missing_ok=True)
        manager = f"127.0.0.1:{_free_port()}"
        http = f"127.0.0.1:{_free_port()}"
        secret = secrets.token_hex(16)
        args: List[str] = [
            str(self.binary),
            "--manager",
            manager,
            "up",
            "--servers",
            str(self.servers),
            "--memory",
            self.memory,
            "--http",
            http,
        ]
        if self.stripe_size is not None:
            args += ["--stripe-size", self.stripe_size]
        if self.partitions is not None:
            args += ["--partitions", str(self.partitions)]
        if self.mount is not None:
            self.mount.mkdir(parents=True, exist_ok=True)
            args += ["--mount", str(self.mount)]
        args += self.extra_args
        env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
        env["TESSERA_HOME"] = str(self.home)
        env["TESSERA_SECRET"] = secret  # never on a command line
        log = open(self.home / "up.log", "wb")
        try:
            self._proc = subprocess.Popen(
                args, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        finally:
            log.close()
        deadline = time.monotonic() + self.timeout
        while not cluster_file.exists():
            code = self._proc.poll()
            if code is not None:
                log_text = self.log().strip()
                self.stop()
                raise RuntimeError(f"tessera up exited with status {code}: {log_text}")
            if time.monotonic() > deadline:
                log_text = self.log().strip()
                self.stop()
                raise TimeoutError(
                    f"the cluster was not ready within {self.timeout} s: {log_text}"
                )
            time.sleep(0.05)
        found = _read_cluster_file(cluster_file)
        self.manager = found.get("manager", manager)
        self.secret = found.get("secret", secret)
        self.http = found.get("http", http)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stops the cluster (as Ctrl-C does: unmounts and stops every process); all data is
        gone. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log(self) -> str:
        """What ``tessera up`` printed so far."""
        if self.home is None:
            return ""
        try:
            return (self.home / "up.log").read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- using it ------------------------------------------------------------------------

    @property
    def env(self) -> Dict[str, str]:
        """Environment variables that point the command line (and ``Client()``) at this
        cluster: ``TESSERA_MANAGER`` and ``TESSERA_SECRET``."""
        self._check()
        assert self.manager is not None and self.secret is not None
        return {"TESSERA_MANAGER": self.manager, "TESSERA_SECRET": self.secret}

    def client(self, trace: Optional[PathLike] = None) -> Client:
        """A new :class:`tessera.Client` of this cluster (``trace``: see :class:`Client`)."""
        self._check()
        return Client(self.manager, self.secret, trace=trace)

    def fs(self, **kwargs: Any) -> "TesseraFileSystem":
        """An fsspec file system (``tessera://``) of this cluster."""
        from .fsspec import TesseraFileSystem

        self._check()
        return TesseraFileSystem(manager=self.manager, secret=self.secret, **kwargs)

    def _check(self) -> None:
        if self.manager is None or not self.running:
            raise RuntimeError("the cluster is not running: call start() or use `with`")

    def __repr__(self) -> str:
        state = f"manager={self.manager}" if self.running else "stopped"
        return f"<LocalCluster servers={self.servers} {state}>"
