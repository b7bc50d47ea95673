"""Remote-cache transfers against curl, side by side, on real nginx (WebDAV) on 127.0.0.1.

    python benchmarks/transfers.py [--runs N] [--big-mib M] [--small N] [--links loopback shaped]
                                   [--only WORD...]

Contenders move the same bytes to and from the same server, alternating, after one untimed
warm-up each, --runs rounds (three times as many for the small blobs, whose rounds are short),
each after a sync, so that no round shares the disk with what the rounds before it wrote;
the ratio is the median of the rounds' own ratios, with its quartiles:
- download: hefbuild's verified download into its store (`BlobStore.download_all`, as a
  cache hit fetches its blobs: SHA-256 checked, inserted only if it matches; a large blob
  is hashed by a second thread as it streams in, a small one received whole
  and landed beside the next) vs
  `curl -o FILE` (no hashing);
- upload: hefbuild's upload of store objects (`RemoteCache.put_objects`, as a build sends
  its outputs) vs `curl -T FILE`. An object the store's stat cache saw stored, its inode
  unchanged since, goes as it is (the trust a local restore gives it); the "not vouched"
  row empties the stat cache, so every object is hashed as it is sent (a large one by a
  second thread; the last chunk only goes once the digest matched);
each for one --big-mib blob (default 1 GiB), and for --small 1 MiB blobs (default 200)
moved `transfers` (4) at a time by `RemoteCache` vs `curl --parallel --parallel-max 4`, and
one at a time vs a single sequential curl (keep-alive) as a baseline.
Links: plain loopback, and a link shaped to 100 MB/s with 20 ms round trip by a proxy on
127.0.0.1 the benchmark starts (`shaping_proxy.py`; the kernel here has no netem) that both
contenders go through. The server is nginx as it ships (`sendfile off`, its own default:
a read and a write per 32 KiB); `--links sendfile` also races loopback against an nginx
with `sendfile on`, as Debian's nginx.conf sets it (not by default: with it, curl's
200 x 1 MiB down was the slower, so it is the weaker baseline). The ratio is curl's time /
hefbuild's (>= 1: hefbuild as fast); the goal is >= 0.95. Each row also gives the CPU
seconds each client used (ours/curl): hashing 200 MiB with SHA-256 is about 0.12 s of CPU
that curl does not spend, so on a machine whose few cores nginx shares, the loopback rows
that hash are bound by CPU. Needs nginx and curl
(`.ci/setup` installs both). Asserts nothing.

Run it on a quiet machine, which here also means: nothing deleted many files on the same
filesystem in the last 6 minutes. On an ext4 without a journal, every new file scans past
the inodes freed in that time (`Bench.retire`), so the rounds that follow a big deletion
measure that scan (on 2026-12-05, hefbuild's 200 x 1 MiB down 4 at once gave 0.51 of curl's
speed in a run started 30 s after the previous one's clean-up, where it gives 0.82-0.90).
The benchmark deletes nothing until it ends; leave 6 minutes between two runs.
docs/transfers.md has the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakes.cache_server import NginxCache  # noqa: E402
from scratch import in_scratch  # noqa: E402
from shaping_proxy import ShapingProxy  # noqa: E402

from hefbuild.declare.settings import CacheSettings  # noqa: E402
from hefbuild.remote.cache import RemoteCache  # noqa: E402
from hefbuild.remote.cas import BlobStore  # noqa: E402
from hefbuild.store.piecefile import PIECE, reporting_order  # noqa: E402
from hefbuild.store.statcache import StatCache  # noqa: E402
from hefbuild.store.store import Store  # noqa: E402

MIB = 1 << 20
GOAL = 0.95
SHAPED_RATE, SHAPED_RTT = 100e6, 0.020


def random_blob(folder: Path, size: int) -> tuple[str, Path]:
    """A file of random bytes, named by its SHA-256 (written in 4 MiB pieces)."""
    hasher, tmp = hashlib.sha256(), folder / f"tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        left = size
        while left:
            piece = os.urandom(min(left, 4 * MIB))
            hasher.update(piece)
            f.write(piece)
            left -= len(piece)
    digest = hasher.hexdigest()
    path = folder / digest
    tmp.rename(path)
    return digest, path


@dataclass
class Contender:
    """`run` is timed; `prepare` (taking the files it writes away, taking blobs off the
    server) runs before it, untimed: deleting 200 files is not a transfer. Both keep the
    folders they write into."""

    prepare: Callable[[], None]
    run: Callable[[], None]


@dataclass
class Run:
    seconds: float
    cpu: float  # user + system seconds of this process and of the children it reaped


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), \
        resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(contender: Contender) -> Run:
    contender.prepare()
    # What the rounds before wrote is written back now, not while this one is timed (a row
    # raced while the blobs' 1.2 GiB were still being written gave 0.79 of curl's speed,
    # 1.00-1.05 after a sync; a 1 GiB row leaves gigabytes behind).
    os.sync()
    cpu, start = _cpu(), time.perf_counter()
    contender.run()
    return Run(time.perf_counter() - start, _cpu() - cpu)


class Bench:
    def __init__(self, work: Path, nginx: NginxCache, blobs: dict[str, Path]) -> None:
        self.work, self.nginx, self.blobs = work, nginx, blobs
        self.retired = work / "retired"
        self.retired.mkdir()
        self._names = itertools.count()

    def retire(self, path: Path) -> None:
        """Take `path` out of the way between rounds without deleting it: renamed into
        `retired/` and emptied unless another name has it (its blocks are freed; its inode
        stays until the end).
        Why: on an ext4 without a journal (this machine's), the kernel does not reuse an
        inode freed in the last minute, or 6 while its inode table block is dirty: every
        new file scans past each of them (`recently_deleted` under `find_inode_bit`).
        Deleting a round's 200 files made the creates of the next rounds pay that scan,
        curl's more than the store's (probably as it writes into one folder, the store into
        many): curl's 200 x 1 MiB down 4 at once went from 1275-1294 to 1395-1439 MiB/s
        without the deletions, hefbuild's did not move. A CI runner filling a fresh store
        deletes nothing."""
        gone = self.retired / str(next(self._names))
        try:
            os.rename(path, gone)
        except FileNotFoundError:
            return
        if os.stat(gone).st_nlink == 1:  # a seeded blob shares its inode with the pool
            os.chmod(gone, 0o600)  # store objects are read-only
            os.truncate(gone, 0)

    def settings(self, url: str, transfers: int) -> CacheSettings:
        return CacheSettings(remote=url, timeout_s=60.0, min_rate=1 << 20, transfers=transfers)

    def seed(self, digests: list[str]) -> None:
        for d in digests:
            dest = self.nginx.blob_path(d)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():
                os.link(self.blobs[d], dest)

    def unseed(self, digests: list[str]) -> None:
        for d in digests:
            self.retire(self.nginx.blob_path(d))

    # -- downloads -----------------------------------------------------------------------

    def ours_down(self, url: str, digests: list[str], transfers: int) -> Contender:
        def prepare() -> None:
            # The objects go, their shard folders stay, as in any store that has been used
            # (curl's folder stays too): making 148 folders is not a transfer, and on this
            # ext4 a new inode costs up to 1 ms while inodes freed a minute ago are skipped.
            store = Store(self.work / "store", StatCache(self.work / "stat.sqlite3"))
            for d in digests:
                self.retire(store.object_path(d))
            (self.work / "stat.sqlite3").unlink(missing_ok=True)

        def run() -> None:
            store = Store(self.work / "store", StatCache(self.work / "stat.sqlite3"))
            blobs = BlobStore(self.settings(url, transfers))
            sizes = [self.blobs[d].stat().st_size for d in digests]
            got = blobs.download_all(list(zip(digests, sizes, strict=True)), store)
            assert got == sizes, "a download came back short"
        return Contender(prepare, run)

    def curl_down(self, url: str, digests: list[str], parallel: int) -> Contender:
        out = self.work / "curl-out"

        def prepare() -> None:
            out.mkdir(exist_ok=True)
            for d in digests:
                self.retire(out / d)

        def run() -> None:
            args = ["curl", "-sSf", "--no-progress-meter", "--max-time", "600"]
            if parallel > 1:
                args += ["--parallel", "--parallel-max", str(parallel)]
            for d in digests:
                args += ["-o", str(out / d), f"{url}/cas/{d}"]
            subprocess.run(args, check=True)
        return Contender(prepare, run)

    # -- uploads -------------------------------------------------------------------------

    def ours_up(self, url: str, digests: list[str], transfers: int,
                vouched: bool = True) -> Contender:
        """A build's upload of store objects (`RemoteCache.put_objects`), from a store whose
        stat cache saw them stored (read from its table, as by a later `doit`), or, not
        `vouched`, from the same store with an empty stat cache (every object hashed as
        it is sent)."""
        def run() -> None:
            table = "stat.sqlite3" if vouched else f"empty-{time.monotonic_ns()}.sqlite3"
            store = Store(self.work / "up-store", StatCache(self.work / "up" / table))
            RemoteCache(self.settings(url, transfers), print).put_objects(store, digests)
        self.stored(digests)
        return Contender(lambda: self.unseed(digests), run)

    def stored(self, digests: list[str]) -> None:
        """The blobs as objects of a store, hashed as a build stores its outputs."""
        store = Store(self.work / "up-store", StatCache(self.work / "up" / "stat.sqlite3"))
        for d in digests:
            if not store.object_path(d).exists():
                copy = self.work / "up-copy"
                shutil.copyfile(self.blobs[d], copy)
                assert store.put_file(copy).digest == d

    def curl_up(self, url: str, digests: list[str], parallel: int) -> Contender:
        def run() -> None:
            args = ["curl", "-sSf", "--no-progress-meter", "--max-time", "600", "-o", "/dev/null"]
            if parallel > 1:
                args += ["--parallel", "--parallel-max", str(parallel)]
            for d in digests:
                args += ["-T", str(self.blobs[d]), f"{url}/cas/{d}"]
            subprocess.run(args, check=True)
        return Contender(lambda: self.unseed(digests), run)


def race(rounds: int, a: Contender, b: Contender) -> tuple[list[Run], list[Run]]:
    """`rounds` alternating runs (the order flips each round), after a warm-up: the times of
    each, round by round."""
    timed(a), timed(b)
    ta, tb = [], []
    for i in range(rounds):
        for first in ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta)):
            first[1].append(timed(first[0]))
    return ta, tb


def row(label: str, nbytes: int, ours: list[Run], curl: list[Run]) -> None:
    """Throughputs are medians; the ratio is the median of each round's own ratio, so that
    a machine slower for a while slows both sides of the rounds it spans (the quartiles of
    those ratios show the noise). The CPU seconds (medians) are the client's: where the
    server shares the cores, a client that needs more CPU cannot keep up however it
    overlaps its work, and hefbuild hashes every byte while curl hashes none."""
    ratios = sorted(c.seconds / o.seconds for c, o in zip(curl, ours, strict=True))
    ratio = statistics.median(ratios)
    low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratio,) * 3
    mib = nbytes / MIB

    def median(runs: list[Run], field: str) -> float:
        return statistics.median(getattr(r, field) for r in runs)
    cpu = f"{median(ours, 'cpu'):.2f}/{median(curl, 'cpu'):.2f}"
    print(f"{label:<58} {mib / median(ours, 'seconds'):>6.0f} "
          f"{mib / median(curl, 'seconds'):>6.0f}  {ratio:>5.2f} ({low:.2f}-{high:.2f}) "
          f"{cpu:>10}  {'met' if ratio >= GOAL else 'MISSED'}")


def bench(args: argparse.Namespace, work: Path) -> None:
    pool = work / "blobs"
    pool.mkdir(parents=True)
    big, big_path = random_blob(pool, args.big_mib * MIB)
    small = [random_blob(pool, MIB)[0] for _ in range(args.small)]
    blobs = {big: big_path, **{d: pool / d for d in small}}
    print(f"store writes in pieces of {PIECE >> 10} KiB "
          f"(page_reporting_order: {reporting_order() or 'none'})")
    print(f"{'row (MiB/s: hefbuild, curl; ratio curl/hefbuild time, quartiles)':<58} "
          f"{'ours':>6} {'curl':>6}  ratio             cpu s o/c  goal {GOAL}")
    with NginxCache(root=work / "nginx") as nginx:
        b = Bench(work, nginx, blobs)
        for name in args.links:
            if name == "sendfile":  # the same rows against a second nginx, sendfile on
                with NginxCache(root=work / "nginx-sendfile", sendfile=True) as other:
                    b.nginx = other
                    link(args, b, other.url, "loopback, nginx sendfile on", big, small)
                    b.nginx = nginx
            elif name == "shaped":
                with ShapingProxy(("127.0.0.1", nginx.port), SHAPED_RATE, SHAPED_RTT) as proxy:
                    link(args, b, f"http://127.0.0.1:{proxy.port}", f"shaped "
                         f"{SHAPED_RATE / 1e6:.0f} MB/s, {SHAPED_RTT * 1000:.0f} ms RTT",
                         big, small)
            else:
                link(args, b, nginx.url, "loopback", big, small)


def link(args: argparse.Namespace, b: Bench, url: str, where: str, big: str,
         small: list[str]) -> None:
    """Every row (or those --only names) against the server at `url`."""
    b.seed([big, *small])
    total = args.small * MIB
    cases = [
        (f"download {args.big_mib} MiB, {where}", args.big_mib * MIB,
         b.ours_down(url, [big], 1), b.curl_down(url, [big], 1)),
        (f"download {args.small} x 1 MiB, 4 at once, {where}", total,
         b.ours_down(url, small, 4), b.curl_down(url, small, 4)),
        (f"download {args.small} x 1 MiB, one at a time, {where}", total,
         b.ours_down(url, small, 1), b.curl_down(url, small, 1)),
        (f"upload {args.big_mib} MiB, {where}", args.big_mib * MIB,
         b.ours_up(url, [big], 1), b.curl_up(url, [big], 1)),
        (f"upload {args.small} x 1 MiB, 4 at once, {where}", total,
         b.ours_up(url, small, 4), b.curl_up(url, small, 4)),
        (f"upload {args.small} x 1 MiB, 4 at once, not vouched, {where}", total,
         b.ours_up(url, small, 4, vouched=False), b.curl_up(url, small, 4)),
    ]
    for label, nbytes, ours, curl in cases:
        if args.only and not any(word in label for word in args.only):
            continue
        # a round of small blobs is short, and short runs are the noisiest
        rounds = args.runs if nbytes == args.big_mib * MIB else 3 * args.runs
        row(label, nbytes, *race(rounds, ours, curl))
        b.seed([big, *small])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--small", type=int, default=200)
    ap.add_argument("--links", nargs="+", default=["loopback", "shaped"],
                    choices=["loopback", "shaped", "sendfile"])
    ap.add_argument("--only", nargs="+", metavar="WORD",
                    help="only the rows whose label has one of these words")
    args = ap.parse_args()
    return in_scratch("transfers", lambda work: bench(args, work))


if __name__ == "__main__":
    sys.exit(main())
