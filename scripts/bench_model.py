"""The I/O model's fidelity on real programs (issue 32), timed by the mount.

Three programs run on a Tessera mount, traced by the mount: `sort` of a text file (with its
temporary files on the mount), `tar` of a source tree (C and C++ headers), and a read alignment
(`bwa index`, `bwa mem`, `samtools sort`) of reads simulated from a random genome. In each of
three rounds, from cold caches (sync, drop_caches): the original runs traced (its outputs
removed first); the model of the first configuration's first original is replayed
(`tessera replay --drop-caches --mount-trace --check`: inputs prepared untraced, the mount
tracing only the phases); and the round's original trace is replayed by fio (`tessera trace
export --format fio`, `fio --read_iolog`), traced by the mount. The three are compared
by the I/O time of their phases' operations (the durations the mount measured, summed): medians
of the three rounds (ROUNDS=N for another count; PROGS=sort,tar for some programs). With
THINK=burn|sleep both replays keep the original's time between requests: the model replay its
think time, fio the trace's timestamps (without, fio replays with no stalls). Then a second
configuration (other server count and stripe size) does the
same with the first configuration's model, to see whether the replay predicts the change.

Prints one JSON object (and writes it to OUT if set).
Usage: python3 scripts/bench_model.py TESSERA_BIN SCALE   (SCALE 1: about 100 MB per program)
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

from bench_procs import drop_caches

CONFIGS = {
    "A": ["--servers", "4", "--memory", "1GiB"],
    "B": ["--servers", "2", "--memory", "2GiB", "--stripe-size", "4MiB"],
}
# `burn` or `sleep`: replays keep the time between requests (tessera replay --think-time; fio
# keeps the trace's timestamps).
THINK = os.environ.get("THINK", "")
# Only these programs (comma-separated), and this many rounds.
PROGS = [p for p in os.environ.get("PROGS", "").split(",") if p]
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def run(cmd: List[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, timeout=1800, **kw)


def genome(path: Path, bases: int, seed: int) -> str:
    rng = random.Random(seed)
    seq = "".join(rng.choice("ACGT") for _ in range(bases))
    with open(path, "w") as f:
        f.write(">chr1\n")
        for i in range(0, len(seq), 80):
            f.write(seq[i : i + 80] + "\n")
    return seq


def reads(path: Path, seq: str, n: int, length: int, seed: int) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            at = rng.randrange(len(seq) - length)
            r = list(seq[at : at + length])
            for k in range(length):
                if rng.random() < 0.01:
                    r[k] = rng.choice("ACGT")
            f.write(f"@r{i}\n{''.join(r)}\n+\n{'I' * length}\n")


def inputs(local: Path, scale: float) -> None:
    """The programs' inputs, made once on local disk and copied into each configuration."""
    rng = random.Random(7)
    with open(local / "numbers.txt", "w") as f:
        for _ in range(int(8_000_000 * scale)):
            f.write(f"{rng.randrange(1 << 40)}\n")
    src = local / "src"
    for tree in ("linux", "c++"):
        shutil.copytree(Path("/usr/include") / tree, src / tree, symlinks=True)
    seq = genome(local / "ref.fa", int(2_000_000 * scale), 1)
    reads(local / "reads.fq", seq, int(200_000 * scale), 100, 2)


PROGRAMS: Dict[str, Callable[[Path], List[str]]] = {
    "sort": lambda d: ["sort", "-S", "32M", "-T", str(d / "tmp"), str(d / "numbers.txt"),
                       "-o", str(d / "sorted.txt")],
    "tar": lambda d: ["tar", "cf", str(d / "src.tar"), "-C", str(d), "src"],
    "bwa": lambda d: ["sh", "-c", f"cd {d} && bwa index ref.fa 2>/dev/null && "
                      "bwa mem -t 2 ref.fa reads.fq 2>/dev/null > out.sam && "
                      "samtools sort -m 64M -o out.bam out.sam 2>/dev/null"],
}
STAGED = {"sort": ["numbers.txt"], "tar": ["src"], "bwa": ["ref.fa", "reads.fq"]}
# What a program leaves, removed before it runs again.
OUTPUTS = {"sort": ["sorted.txt"], "tar": ["src.tar"],
           "bwa": ["ref.fa.amb", "ref.fa.ann", "ref.fa.bwt", "ref.fa.pac", "ref.fa.sa",
                   "out.sam", "out.bam"]}


def phases_io_s(model: Dict[str, Any]) -> float:
    data = sum(p["io_time_ns"] for p in model["phases"])
    meta = sum(p["io_time_ns"] for p in model["meta_phases"])
    return (data + meta) / 1e9


def shape(model: Dict[str, Any]) -> Dict[str, Any]:
    a = model["application"]
    return {
        "bytes": [a["bytes_read"], a["bytes_written"]],
        "requests": [a["reads"], a["writes"]],
        "phases": len(model["phases"]),
        "meta_phases": len(model["meta_phases"]),
    }


class Cluster:
    def __init__(self, bin_: str, name: str, args: List[str]) -> None:
        self.bin = bin_
        self.home = Path(tempfile.mkdtemp(prefix=f"tessera-bench-model-{name}."))
        self.mnt = self.home / "mnt"
        self.mnt.mkdir()
        self.traces = self.home / "traces"
        self.traces.mkdir()
        self.env = {**os.environ, "TESSERA_HOME": str(self.home), "TESSERA_SECRET": "bench"}
        self.log = open(self.home / "up.log", "wb")
        self.up = subprocess.Popen(
            [bin_, "--manager", "127.0.0.1:17570", "up", "--http", "127.0.0.1:17571", *args,
             "--mount", str(self.mnt)],
            env=self.env, stdout=self.log, stderr=self.log,
        )
        deadline = time.monotonic() + 60
        while not ((self.home / "cluster.toml").exists() and os.path.ismount(self.mnt)):
            if time.monotonic() > deadline or self.up.poll() is not None:
                raise RuntimeError(f"the cluster did not start: {self.home}/up.log")
            time.sleep(0.1)

    def traced(self, cmd: List[str], name: str) -> tuple[Path, float]:
        """Runs `cmd` with the mount tracing into a new file; that file and the wall time."""
        out = self.traces / name
        out.mkdir()
        drop_caches()
        run([self.bin, "trace", "start", str(self.mnt), "--dir", str(out)], env=self.env)
        t = time.monotonic()
        run(cmd, env=self.env)
        wall = time.monotonic() - t
        run([self.bin, "trace", "stop", str(self.mnt)], env=self.env)
        time.sleep(1)
        (trace,) = list(out.glob("*.ttrace"))
        return trace, wall

    def profile(self, trace: Path, report: bool = False) -> Dict[str, Any]:
        model = trace.with_suffix(".model.json")
        args = [self.bin, "profile", str(trace), "-o", str(model)]
        if report:
            args += ["--report", str(trace.with_suffix(".html"))]
        run(args)
        return json.loads(model.read_text())

    def stop(self) -> None:
        self.up.send_signal(signal.SIGINT)
        self.up.wait(timeout=60)
        self.log.close()


def fio_replay(c: Cluster, original: Path, name: str) -> Dict[str, Any]:
    """The original trace replayed by fio (every request as the mount saw it),
    traced by the mount: its model's I/O time and shape."""
    log = original.with_suffix(f".{name}.iolog")
    run([c.bin, "trace", "export", str(original), "--format", "fio", "-o", str(log)])
    fio = ["fio", "--name=replay", f"--read_iolog={log}", "--ioengine=psync",
           "--output-format=json"] + ([] if THINK else ["--replay_no_stall=1"])
    trace, wall = c.traced(fio, name)
    model = c.profile(trace)
    return {"wall_s": wall, "io_s": phases_io_s(model), "shape": shape(model)}




def model_replay(c: Cluster, model: Path, original: Path, rdir: Path, name: str
                 ) -> Dict[str, Any]:
    """The model replayed in `rdir`, the mount tracing its phases only, checked against the
    round's original."""
    tdir = c.traces / name
    out = c.traces / f"{name}.json"
    t = time.monotonic()
    done = subprocess.run(
        [c.bin, "replay", str(model), "--dir", str(rdir), "--drop-caches", "--mount-trace",
         str(tdir), "--check", str(original), "--json", str(out)]
        + ([f"--think-time={THINK}"] if THINK else []),
        text=True, capture_output=True, timeout=1800, env=c.env)
    wall = time.monotonic() - t
    if not out.exists():
        raise RuntimeError(f"replay failed: {done.stdout}{done.stderr}")
    r = json.loads(out.read_text())
    ck = r["check"]
    rmodel = c.profile(Path(r["mount_trace"]))
    return {"wall_s": wall, "io_s": ck["io_time_ns"][1] / 1e9, "shape": shape(rmodel),
            "time_by": ck["time_by"], "time_alike": ck["time_alike"],
            "shape_matches": all(x["matches"] for x in ck["checks"]),
            "differ": [x["what"] for x in ck["checks"] if not x["matches"]][:12]}


def main() -> None:
    bin_, scale = sys.argv[1], float(sys.argv[2])
    local = Path(tempfile.mkdtemp(prefix="tessera-bench-model-inputs."))
    inputs(local, scale)
    result: Dict[str, Any] = {"scale": scale, "configs": CONFIGS, "rounds": ROUNDS,
                              "load_before": os.getloadavg(), "programs": {}}
    models: Dict[str, Path] = {}
    med = statistics.median
    for cname, cargs in CONFIGS.items():
        c = Cluster(bin_, cname, cargs)
        try:
            for prog, cmd in PROGRAMS.items():
                if PROGS and prog not in PROGS:
                    continue
                d = c.mnt / prog
                d.mkdir()
                (d / "tmp").mkdir()
                for name in STAGED[prog]:
                    src = local / name
                    if src.is_dir():
                        shutil.copytree(src, d / name, symlinks=True)
                    else:
                        shutil.copy(src, d / name)
                rdir = c.mnt / f"replay-{prog}"
                rdir.mkdir()
                r = result["programs"].setdefault(prog, {})
                rc: Dict[str, Any] = {"originals": [], "replays": [], "fio": []}
                r[cname] = rc
                for i in range(ROUNDS):
                    for name in OUTPUTS[prog]:
                        (d / name).unlink(missing_ok=True)
                    shutil.rmtree(d / "tmp")
                    (d / "tmp").mkdir()
                    trace, wall = c.traced(cmd(d), f"{prog}-original-{i}")
                    model = c.profile(trace, report=cname == "A" and i == 0)
                    if prog not in models:
                        models[prog] = trace.with_suffix(".model.json")
                    rc["originals"].append({"wall_s": wall, "io_s": phases_io_s(model),
                                            "shape": shape(model)})
                    rc["replays"].append(model_replay(c, models[prog], trace, rdir,
                                                      f"{prog}-replay-{i}"))
                    rc["fio"].append(fio_replay(c, trace, f"{prog}-fio-{i}"))
                shutil.rmtree(rdir)
                orig = med(x["io_s"] for x in rc["originals"])
                rep = med(x["io_s"] for x in rc["replays"])
                fio = med(x["io_s"] for x in rc["fio"])
                rc.update(original_io_median_s=orig, replay_io_median_s=rep,
                          fio_io_median_s=fio, replay_ratio=rep / max(orig, 1e-9),
                          fio_ratio=fio / max(orig, 1e-9))
                print(f"{cname} {prog}: original {orig:.3f} s in I/O, model replay {rep:.3f} s "
                      f"(ratio {rc['replay_ratio']:.2f}), fio replay {fio:.3f} s "
                      f"(ratio {rc['fio_ratio']:.2f}); load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr)
        finally:
            c.stop()
    for prog, r in result["programs"].items():
        a, b = r["A"], r["B"]
        r["B_over_A_original"] = b["original_io_median_s"] / max(a["original_io_median_s"], 1e-9)
        r["B_over_A_replay"] = b["replay_io_median_s"] / max(a["replay_io_median_s"], 1e-9)
        r["B_over_A_fio"] = b["fio_io_median_s"] / max(a["fio_io_median_s"], 1e-9)
    result["load_after"] = os.getloadavg()
    text = json.dumps(result, indent=1)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).write_text(text)


if __name__ == "__main__":
    main()
