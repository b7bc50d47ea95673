"""hefbuild's remote cache tier, as ratios against a baseline run side by side.

    python benchmarks/remote.py [--runs N] [--restore-runs N] [--blob-mib M] [--quiet S]

--runs: rounds of each transfer in (b), default 5; --restore-runs: rebuild/restore pairs
in (a), default 3 (a rebuild takes ~30-60 s); --blob-mib: default 1024; --quiet: on a
shared machine, wait up to S seconds before each timed transfer for other processes to go
idle (the last lines say how busy the machine was either way).

Everything talks to one real nginx WebDAV server on 127.0.0.1 (tests/fakes/cache_server.py),
which speaks Bazel's HTTP cache protocol (`{base}/cas/<sha256>`, `{base}/ac/<key>`).

(a) `doit verify:tiny-llama` in a fresh project copy with an empty store, restored from a
    warm remote (upload off) vs rebuilt from nothing without a remote (goal >= 20x faster).
    Every restored task must have outcome `remote` in build/events.jsonl, or the row says
    INVALID. The build that filled the remote (upload on) is shown against the rebuilds.
(b) a blob of random bytes (1 GiB by default) to and from the same nginx:
    upload   HttpTransport.put, hashing the bytes as it sends them (every upload does), vs
             `curl -T` (no hashing)
    download RemoteCache._download (what a restore does: stream into the store while
             hashing, then adopt) and the bare HttpTransport.get into a file (no hashing)
             vs `curl -o` (raw transfer, no hashing: the strongest baseline)
    (goal >= 0.8x curl's throughput), and the peak RSS of a process doing each transfer,
    to show that it streams.
Runs are interleaved (order rotated each round), medians reported. Prints a table; asserts
nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from fakes.cache_server import NginxCache  # noqa: E402
from run import DOIT, copy_project  # noqa: E402

from hefbuild.declare.settings import CacheSettings  # noqa: E402
from hefbuild.remote.cache import RemoteCache  # noqa: E402
from hefbuild.remote.http import HttpTransport  # noqa: E402
from hefbuild.store.statcache import StatCache  # noqa: E402
from hefbuild.store.store import Store  # noqa: E402

TARGET = "verify:tiny-llama"
CURL = "curl"
MB = 1e6
# Settings a caller's environment may carry that would change what these runs measure.
REMOTE_ENV = ("HEFBUILD_REMOTE_CACHE", "HEFBUILD_REMOTE_UPLOAD", "HEFBUILD_REMOTE_TIMEOUT",
              "HEFBUILD_TRUSTED_KEYS", "HEFBUILD_SIGNING_KEY", "HEFBUILD_REMOTE_TOKEN",
              "HEFBUILD_REMOTE_USER", "HEFBUILD_REMOTE_PASSWORD", "HEFBUILD_REMOTE_CA_BUNDLE")

Row = tuple[str, float, float, str, float, str]  # name, hefbuild, baseline, unit, ratio, goal


# -- (a) restore from the remote vs rebuild ---------------------------------------------


def doit_env(store: Path, remote: str | None, upload: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in REMOTE_ENV}
    # Without bytecode caching every run recompiles hefbuild from source while doit's
    # installed .pyc files are used: a skew that no user has (as in run.py).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["HEFBUILD_STORE"] = str(store)
    env["HEFBUILD_REMOTE_CACHE"] = remote or ""  # empty: no remote, whatever else says so
    env["HEFBUILD_REMOTE_UPLOAD"] = "1" if upload else "0"
    return env


def build_fresh(work: Path, name: str, remote: str | None, upload: bool) -> tuple[float, Counter]:
    """`doit verify:tiny-llama` in a new project copy with a new, empty store.

    Only the doit command is timed; returns its seconds and the outcomes of its events."""
    project = copy_project(work / name)
    store = work / f"{name}-store"
    start = time.perf_counter()
    done = subprocess.run(DOIT + [TARGET], cwd=project, env=doit_env(store, remote, upload),
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"`doit {TARGET}` failed in {project} (exit {done.returncode}):\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    outcomes = Counter()
    for line in (project / "build" / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if "outcome" in event:
            outcomes[event["outcome"]] += 1
    shutil.rmtree(project)
    shutil.rmtree(store)
    return seconds, outcomes


def bench_restore(work: Path, url: str, runs: int) -> tuple[list[Row], list[str]]:
    warm_s, warm = build_fresh(work, "warm", url, upload=True)
    tasks = sum(warm.values())
    rebuild, restore, remote_counts, bad_rebuilds = [], [], [], 0
    for i in range(runs):
        seconds, outcomes = build_fresh(work, f"rebuild-{i}", None, upload=False)
        rebuild.append(seconds)
        bad_rebuilds += outcomes["built"] != tasks
        seconds, outcomes = build_fresh(work, f"restore-{i}", url, upload=False)
        restore.append(seconds)
        remote_counts.append(outcomes["remote"])
    valid = warm["built"] == tasks and all(n == tasks for n in remote_counts)
    counts = "/".join(str(n) for n in remote_counts)
    label = (f"all {tasks} tasks `remote`" if valid else
             f"INVALID: tasks `remote` per run {counts} of {tasks}")
    rows: list[Row] = [
        (f"(a) {TARGET}: restore from remote ({label}) / rebuild, {runs} runs",
         statistics.median(restore), statistics.median(rebuild), "s",
         statistics.median(rebuild) / statistics.median(restore), ">= 20x"),
        ("(a) build that filled the remote (upload on, 1 run) / rebuild",
         warm_s, statistics.median(rebuild), "s", statistics.median(rebuild) / warm_s,
         "(context)"),
    ]
    notes = [
        f"(a) outcomes: warm build {dict(warm)}; tasks with outcome `remote` per restore "
        f"run: {counts} of {tasks}; rebuild runs not all `built`: {bad_rebuilds}",
        f"(a) rebuild runs (s): {fmt(rebuild)}; restore runs (s): {fmt(restore)}",
    ]
    return rows, notes


# -- (b) a large blob to and from the cache vs curl -------------------------------------


def make_blob(path: Path, mib: int) -> str:
    """`mib` MiB of random bytes, written 1 MiB at a time; returns their SHA-256."""
    hasher = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(mib):
            chunk = os.urandom(1 << 20)
            hasher.update(chunk)
            f.write(chunk)
    return hasher.hexdigest()


@dataclass(frozen=True)
class Contender:
    prepare: Callable[[], None]  # untimed: remove the last run's output, flush dirty pages
    run: Callable[[], object]  # timed
    written: Path  # where the bytes land (checked after each run, untimed)


def own_cpu() -> float:
    """CPU seconds of this process and of its children that were waited for (curl)."""
    me, kids = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                     resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def rounds(runs: int, size: int, contenders: dict[str, Contender],
           gate: Callable[[], None]) -> dict[str, tuple[list[float], list[float]]]:
    """One warm-up round (not counted), then `runs` rounds; each round runs every contender
    once, in an order rotated from round to round. Wall and client CPU seconds per run."""
    names = list(contenders)
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in names}
    for i in range(runs + 1):
        for name in names[i % len(names):] + names[:i % len(names)]:
            contender = contenders[name]
            contender.prepare()
            gate()
            cpu = own_cpu()
            start = time.perf_counter()
            contender.run()
            seconds = time.perf_counter() - start
            cpu = own_cpu() - cpu
            if contender.written.stat().st_size != size:
                raise SystemExit(f"{name} left {contender.written.stat().st_size} bytes in "
                                 f"{contender.written}, not {size}")
            if i:
                times[name][0].append(seconds)
                times[name][1].append(cpu)
    return times


def settle(*paths: Path) -> None:
    """Remove the last run's output and flush dirty pages, so no run pays for another's
    writeback. The page cache itself is not dropped."""
    for path in paths:
        path.unlink(missing_ok=True)
    os.sync()


def curl(*args: str) -> None:
    subprocess.run([CURL, "-sS", "--fail", *args], check=True, stdout=subprocess.DEVNULL)


def bench_upload(cache: NginxCache, blob: Path, digest: str, runs: int,
                 gate: Callable[[], None]) -> dict[str, tuple[list[float], list[float]]]:
    settings = CacheSettings(remote=cache.url, timeout_s=60)
    ours, theirs = cache.blob_path(digest), cache.blob_path(hashlib.sha256(b"curl").hexdigest())

    def put() -> None:  # a new transport, so a new connection, as curl makes; hashing
        HttpTransport(settings).put(f"cas/{digest}", blob, digest)  # as every upload does

    times = rounds(runs, blob.stat().st_size, {
        "put": Contender(lambda: settle(ours), put, ours),
        "curl -T": Contender(lambda: settle(theirs),
                             lambda: curl("-T", str(blob), f"{cache.url}/cas/{theirs.name}"),
                             theirs),
    }, gate)
    settle(theirs)  # hefbuild's copy stays: the downloads read it
    return times


def bench_download(cache: NginxCache, work: Path, digest: str, runs: int,
                   gate: Callable[[], None]) -> dict[str, tuple[list[float], list[float]]]:
    settings = CacheSettings(remote=cache.url, timeout_s=60)
    store = Store(work / "dl-store", StatCache(work / "dl-store" / "stat.sqlite3"))
    adopted, bare, raw = store.object_path(digest), work / "dl-bare.bin", work / "dl-curl.bin"

    size = cache.blob_path(digest).stat().st_size

    def verified() -> None:  # the restore path: stream into the store, hashing, then adopt
        RemoteCache(settings, warn=print)._download(digest, size, store, "bench")

    def bare_get() -> None:
        with open(bare, "wb") as out:
            HttpTransport(settings).get(f"cas/{digest}", out.write)

    times = rounds(runs, cache.blob_path(digest).stat().st_size, {
        "_download": Contender(lambda: settle(adopted), verified, adopted),
        "get": Contender(lambda: settle(bare), bare_get, bare),
        "curl -o": Contender(lambda: settle(raw),
                             lambda: curl("-o", str(raw), f"{cache.url}/cas/{digest}"), raw),
    }, gate)
    settle(adopted, bare, raw)
    return times


# One transfer in a process of its own, reporting its peak RSS before and after.
CHILD = """
import json, resource, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from hefbuild.remote.cache import RemoteCache
from hefbuild.remote.http import HttpTransport
from hefbuild.declare.settings import CacheSettings
from hefbuild.store.statcache import StatCache
from hefbuild.store.store import Store
mode, url, digest, where = sys.argv[2:6]
settings = CacheSettings(remote=url, timeout_s=60)
if mode == "download":
    store = Store(Path(where), StatCache(Path(where) / "stat.sqlite3"))
    remote = RemoteCache(settings, warn=print)
    size = int(sys.argv[6])
    run = lambda: remote._download(digest, size, store, "bench")
else:
    transport = HttpTransport(settings)
    run = lambda: transport.put(f"cas/{digest}", Path(where), digest)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
run()
seconds = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before_kib": before, "after_kib": after, "seconds": seconds}))
"""


def child_rss(mode: str, url: str, digest: str, where: Path, size: int) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", CHILD, str(REPO / "src"), mode, url, digest,
                           str(where), str(size)], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def bench_blob(cache: NginxCache, work: Path, mib: int, runs: int,
               gate: Callable[[], None]) -> tuple[list[Row], list[str]]:
    blob = work / "blob.bin"
    digest = make_blob(blob, mib)
    size = blob.stat().st_size
    up = bench_upload(cache, blob, digest, runs, gate)
    down = bench_download(cache, work, digest, runs, gate)  # reads the copy hefbuild put

    def mbps(times: list[float]) -> float:
        return statistics.median(size / MB / t for t in times)

    def row(name: str, ours: str, theirs: str, got: dict, goal: str) -> Row:
        a, b = mbps(got[ours][0]), mbps(got[theirs][0])
        return (name, a, b, "MB/s", a / b, goal)

    rows = [
        row(f"(b) upload {mib} MiB, hashed: HttpTransport.put / curl -T", "put", "curl -T", up,
            ">= 0.8x"),
        row(f"(b) download {mib} MiB, hashed+adopted: RemoteCache._download / curl -o (raw)",
            "_download", "curl -o", down, ">= 0.8x"),
        row(f"(b) download {mib} MiB, not hashed: HttpTransport.get to a file / curl -o",
            "get", "curl -o", down, "(context)"),
    ]
    notes = [f"(b) {name:<10} wall s {fmt(walls)}   client CPU s median "
             f"{statistics.median(cpus):.2f}"
             for name, (walls, cpus) in (up | down).items()]
    settle(cache.blob_path(digest))  # so the upload child writes a new file too
    for what, mode, where in (("upload (put)", "upload", blob),
                              ("download (_download)", "download", work / "rss-store")):
        rss = child_rss(mode, cache.url, digest, where, size)
        notes.append(f"(b) peak RSS of a process doing one {mib} MiB {what}: "
                     f"{rss['after_kib'] / 1024:.1f} MiB; before the transfer (interpreter, "
                     f"imports) {rss['before_kib'] / 1024:.1f} MiB, so the transfer raised the "
                     f"peak by {(rss['after_kib'] - rss['before_kib']) / 1024:.1f} MiB "
                     f"({size / MB / rss['seconds']:.0f} MB/s)")
    shutil.rmtree(work / "rss-store", ignore_errors=True)
    notes.append("(b) nothing dropped from the page cache: the blob and the server's copy are "
                 "cached; before each run the last output is deleted and os.sync() run, "
                 "untimed; one warm-up round not counted; each hefbuild run opens a new "
                 "connection, as curl does; curl's times include starting curl")
    return rows, notes


class Machine:
    """CPU time used on this machine during (b) by this benchmark (itself, curl, nginx) and by
    everything else: how noisy the numbers are. Not for (a): the CPU of the stages doit runs
    does not show in this process's RUSAGE_CHILDREN (~3 CPU-s for a CPU-bound ~40 s build),
    so it would count as someone else's."""

    def __init__(self, nginx_pid: int, quiet_s: float) -> None:
        self.nginx_pid = nginx_pid
        self.tick = os.sysconf("SC_CLK_TCK")
        self.quiet_s = quiet_s
        self.gated = Counter()

    def wait_quiet(self) -> None:
        """Wait (up to quiet_s) until the machine, this benchmark idle, is busy for less than
        a quarter of a core over two half-second windows in a row."""
        if self.quiet_s <= 0:
            return
        deadline, calm = time.monotonic() + self.quiet_s, 0
        while time.monotonic() < deadline:
            busy = self._busy()
            time.sleep(0.5)
            calm = calm + 1 if self._busy() - busy < 0.25 * 0.5 else 0
            if calm == 2:
                self.gated["quiet"] += 1
                return
        self.gated["not quiet"] += 1

    def _busy(self) -> float:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
        return (user + nice + system + irq + softirq) / self.tick

    def _nginx(self) -> float:
        total = 0.0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(entry.name) == self.nginx_pid or int(stat[1]) == self.nginx_pid:
                total += (int(stat[11]) + int(stat[12])) / self.tick
        return total

    def snapshot(self) -> tuple[float, float, float]:
        return time.perf_counter(), self._busy(), own_cpu() + self._nginx()

    def since(self, what: str, before: tuple[float, float, float]) -> str:
        wall, busy, ours = (b - a for a, b in zip(before, self.snapshot(), strict=True))
        others = max(0.0, busy - ours)
        return (f"{what}: other processes (and kernel threads) used {others:.0f} CPU-s in "
                f"{wall:.0f} s, {others / wall:.2f} of {os.cpu_count()} cores on average")


# -- the table ---------------------------------------------------------------------------


def fmt(values: list[float]) -> str:
    return " ".join(f"{v:.3f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="rounds of each transfer (b)")
    parser.add_argument("--restore-runs", type=int, default=3,
                        help="rebuild/restore pairs (a); a rebuild takes ~30-60 s")
    parser.add_argument("--blob-mib", type=int, default=1024)
    parser.add_argument("--quiet", type=float, default=0, metavar="S",
                        help="before each timed transfer (b), wait up to S seconds for other "
                             "processes to go idle (a shared machine); default 0: no waiting")
    args = parser.parse_args()
    if shutil.which(CURL) is None:
        raise SystemExit("curl is missing: apt-get install -y curl")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hefbuild-bench-remote-") as tmp:
        work = Path(tmp)
        cache = NginxCache(root=work / "nginx").start()
        try:
            rows, notes = bench_restore(work, cache.url, args.restore_runs)
            machine = Machine(cache.pid, args.quiet)
            before = machine.snapshot()
            more_rows, more_notes = bench_blob(cache, work, args.blob_mib, args.runs,
                                               machine.wait_quiet)
            load = [machine.since("machine during (b)", before)]
            if args.quiet > 0:
                load.append(f"(b) --quiet {args.quiet:g}: runs (warm-up round included) that "
                            f"started on a quiet machine / after waiting in vain: "
                            f"{machine.gated['quiet']} / {machine.gated['not quiet']}")
        finally:
            cache.stop()
    rows += more_rows
    notes += more_notes + load
    width = max(len(row[0]) for row in rows)
    print(f"{'benchmark':<{width}} {'hefbuild':>9} {'baseline':>9} {'unit':<5} {'ratio':>7}  goal")
    for name, ours, theirs, unit, ratio, goal in rows:
        print(f"{name:<{width}} {ours:>9.3f} {theirs:>9.3f} {unit:<5} {ratio:>6.2f}x  {goal}")
    print("ratio: how many times faster hefbuild is (baseline seconds / hefbuild seconds, or "
          "hefbuild MB/s / baseline MB/s); medians")
    for note in notes:
        print(note)
    print(f"wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
