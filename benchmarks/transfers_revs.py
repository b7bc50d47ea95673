"""Transfers of small blobs by hefbuild at several git revisions, and by curl, raced side by
side in one run: a change's before and after on the same machine in the same minutes.

    python benchmarks/transfers_revs.py [--rounds N] [--small N] [--sendfile] [--up] REV [REV...]

REV is anything `git archive` takes (a commit, a tag, HEAD~2), or "." for the working tree.
Each revision's `src/` runs in a process of its own (extracted to a temporary folder), which
moves --small (200) blobs of 1 MiB from nginx on 127.0.0.1 into a store of its own with
`BlobStore.download_all`, 4 at once, as benchmarks/transfers.py does; curl fetches the same
blobs with `curl --parallel --parallel-max 4`. With --up, the other way: each revision sends
the blobs as objects of a store that vouches for them (`RemoteCache.put_objects`, as a build
sends its outputs), curl sends the same files with `-T`; the server's copies are taken away
before each round. Every round runs each contender once, in a
shuffled order, each after a sync (untimed), after an untimed warm-up each. The ratio is
curl's time / the contender's, the median of the rounds' own ratios, with its quartiles;
`cpu` is the contender's CPU seconds a round. Asserts nothing. Needs nginx and curl.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING

from scratch import in_scratch

if TYPE_CHECKING:  # each revision imports its own hefbuild, in its own process
    from hefbuild.store.store import Store

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def worker(src: str, url: str, work: str, pool: str, way: str) -> None:
    """In a revision's process: 'prep' empties its store (up: fills it, once), 'run'
    moves the blobs and reports."""
    sys.path.insert(0, src)
    from hefbuild.declare.settings import CacheSettings
    from hefbuild.remote.cache import RemoteCache
    from hefbuild.remote.cas import BlobStore
    from hefbuild.store.statcache import StatCache
    from hefbuild.store.store import Store

    root = Path(work)
    refs = [(d, os.stat(os.path.join(pool, d)).st_size) for d in sorted(os.listdir(pool))]
    retire = Retirer(root / "retired")
    settings = CacheSettings(remote=url, timeout_s=60.0, transfers=4)
    for line in sys.stdin:
        store = Store(root / "store", StatCache(root / "stat.sqlite3"))
        if way == "up":
            if line.strip() == "prep":
                stored(store, Path(pool), refs, root / "copy")
                print("ready", flush=True)
                continue
            cpu, start = _cpu(), time.perf_counter()
            sent = RemoteCache(settings, print).put_objects(store, [d for d, _ in refs])
            print(json.dumps([time.perf_counter() - start, _cpu() - cpu]), flush=True)
            assert sent == sum(size for _, size in refs), "an upload went short"
            continue
        if line.strip() == "prep":
            for digest, _ in refs:
                retire(store.object_path(digest))
            (root / "stat.sqlite3").unlink(missing_ok=True)
            print("ready", flush=True)
            continue
        blobs = BlobStore(settings)
        cpu, start = _cpu(), time.perf_counter()
        got = blobs.download_all(refs, store)
        print(json.dumps([time.perf_counter() - start, _cpu() - cpu]), flush=True)
        assert got == [size for _, size in refs], "a download came back short"


def stored(store: Store, pool: Path, refs: list[tuple[str, int]], copy: Path) -> None:
    """The blobs as objects of `store`, hashed in as a build stores its outputs (so its stat
    cache vouches for them); the ones already there stay."""
    for digest, _ in refs:
        if not store.object_path(digest).exists():
            shutil.copyfile(pool / digest, copy)
            assert store.put_file(copy).digest == digest


class Retirer:
    """Takes a round's files out of the way without deleting them (emptied, renamed aside):
    on ext4 every create scans past the inodes freed in the last minutes
    (benchmarks/transfers.py, `Bench.retire`)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.count = folder, 0
        folder.mkdir(parents=True, exist_ok=True)

    def __call__(self, path: Path) -> None:
        self.count += 1
        gone = self.folder / str(self.count)
        try:
            os.rename(path, gone)
        except FileNotFoundError:
            return
        if os.stat(gone).st_nlink == 1:  # never empty bytes another name still has
            os.chmod(gone, 0o600)  # store objects are read-only
            os.truncate(gone, 0)


def _cpu(children: bool = False) -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def extract(rev: str, into: Path) -> Path:
    """The revision's src/ (the working tree's for "."), as a folder of its own."""
    if rev == ".":
        return REPO / "src"
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev, "src"],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


class Contender:
    def __init__(self, name: str, src: Path, url: str, work: Path, pool: Path, way: str) -> None:
        self.name = name
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE")}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(src), url, str(work), str(pool), way],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def round(self) -> tuple[float, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("prep\n")
        self.proc.stdin.flush()
        self.proc.stdout.readline()
        os.sync()
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        seconds, cpu = json.loads(self.proc.stdout.readline())
        return seconds, cpu

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


class Curl:
    name = "curl"

    def __init__(self, url: str, digests: list[str], out: Path, up: Path | None) -> None:
        """Downloads into `out`; with `up`, uploads of the files there instead."""
        self.url, self.digests, self.out, self.up = url, digests, out, up
        out.mkdir()
        self.retire = Retirer(out.parent / "curl-retired")

    def round(self) -> tuple[float, float]:
        args = ["curl", "-sSf", "--no-progress-meter", "--parallel", "--parallel-max", "4"]
        if self.up is not None:
            args += ["-o", "/dev/null"]
        for digest in self.digests:
            if self.up is not None:
                args += ["-T", str(self.up / digest), f"{self.url}/cas/{digest}"]
            else:
                self.retire(self.out / digest)
                args += ["-o", str(self.out / digest), f"{self.url}/cas/{digest}"]
        os.sync()
        cpu, start = _cpu(children=True), time.perf_counter()
        subprocess.run(args, check=True)
        return time.perf_counter() - start, _cpu(children=True) - cpu

    def stop(self) -> None:
        pass


def blobs(pool: Path, count: int) -> list[str]:
    pool.mkdir()
    digests = []
    for _ in range(count):
        data = os.urandom(MIB)
        digest = hashlib.sha256(data).hexdigest()
        (pool / digest).write_bytes(data)
        digests.append(digest)
    return sorted(digests)


def race(args: argparse.Namespace, work: Path) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from fakes.cache_server import NginxCache

    digests = blobs(work / "pool", args.small)
    way = "up" if args.up else "down"
    with NginxCache(root=work / "nginx", sendfile=args.sendfile) as nginx:
        for digest in digests:
            dest = nginx.blob_path(digest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.link(work / "pool" / digest, dest)
        racers: list[Contender | Curl] = [
            Curl(nginx.url, digests, work / "curl", work / "pool" if args.up else None)]
        for i, rev in enumerate(args.revs):
            src = extract(rev, work / f"rev{i}")
            racers.append(Contender(rev, src, nginx.url, work / f"store{i}", work / "pool", way))
        retire = Retirer(work / "server-retired")

        def unseed() -> None:  # an upload finds the server without the blobs
            for digest in digests:
                retire(nginx.blob_path(digest))
        try:
            runs = measure(racers, args.rounds, unseed if args.up else lambda: None)
        finally:
            for racer in racers:
                racer.stop()
    report(runs, args)


def measure(racers: list[Contender | Curl], rounds: int,
            before: Callable[[], None]) -> dict[str, list[tuple[float, float]]]:
    for racer in racers:
        before()
        racer.round()  # warm-up, untimed
    runs: dict[str, list[tuple[float, float]]] = {racer.name: [] for racer in racers}
    for _ in range(rounds):
        for racer in random.sample(racers, len(racers)):
            before()
            runs[racer.name].append(racer.round())
    return runs


def report(runs: dict[str, list[tuple[float, float]]], args: argparse.Namespace) -> None:
    server = "nginx sendfile on" if args.sendfile else "nginx sendfile off"
    way = "up (store objects, vouched)" if args.up else "down"
    print(f"{args.small} x 1 MiB {way}, 4 at once, loopback, {server}, {args.rounds} rounds")
    print(f"{'contender':<24} {'median s':>9} {'MiB/s':>7}  {'ratio (quartiles)':<18} cpu s")
    curl = [seconds for seconds, _ in runs["curl"]]
    for name, rounds in runs.items():
        times = [seconds for seconds, _ in rounds]
        ratios = [c / t for c, t in zip(curl, times, strict=True)]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        median = statistics.median(times)
        print(f"{name:<24} {median:9.3f} {args.small / median:7.0f}  "
              f"{statistics.median(ratios):.2f} ({q1:.2f}-{q3:.2f})    "
              f"{statistics.median(cpu for _, cpu in rounds):.3f}")


def main() -> int:
    if sys.argv[1:2] == ["--worker"]:
        worker(*sys.argv[2:7])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revs", nargs="+", metavar="REV")
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--small", type=int, default=200)
    ap.add_argument("--sendfile", action="store_true", help="nginx with sendfile on")
    ap.add_argument("--up", action="store_true", help="uploads instead of downloads")
    args = ap.parse_args()
    if len(set(args.revs)) != len(args.revs):
        ap.error("each revision once")
    return in_scratch("transfers_revs", lambda work: race(args, work))


if __name__ == "__main__":
    sys.exit(main())
