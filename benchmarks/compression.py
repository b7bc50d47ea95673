"""zstd on a gRPC cache's wire (`[cache] compression = "zstd"`) vs plain, for one real file.

    python benchmarks/compression.py --file PATH [--runs N] [--links loopback shaped]

PATH: any artifact worth caching, e.g. a float32 model's weights (model.safetensors) or an
exported ONNX. The server is the REAPI double of the tests (tests/fakes/grpc_cache.py, with
ZSTD on, in this process): it stores blobs uncompressed, decompresses and hashes an upload
as a real server verifies one, and serves a blob's zstd form compressed once (at level 3)
as a server that stores it so. Each contender, alternating, after one untimed warm-up:
- upload: `GrpcTransport.put` of the file (hashed as it is read; compressed in chunks with
  zstd on; once more with zstd's workers, one a core, to show what they are worth: not
  hefbuild's default, grpc_zstd.THREADS), the blob taken off the server first, untimed;
- download: `BlobStore.download` into an empty store (decompressed as it arrives, hashed,
  inserted only if it matches), the store emptied first, untimed.
Printed: the bytes the blob took on the wire (as the server counted them) and the median
seconds of --runs rounds, on loopback and on a link shaped to 100 MB/s, 20 ms round trip
(`shaping_proxy.py`). Client and server share this machine's cores. Asserts nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakes.grpc_cache import GrpcCache  # noqa: E402
from shaping_proxy import ShapingProxy  # noqa: E402

from hefbuild.declare.settings import CacheSettings  # noqa: E402
from hefbuild.remote import grpc_zstd  # noqa: E402
from hefbuild.remote.cas import BlobStore  # noqa: E402
from hefbuild.remote.transport import transport_for  # noqa: E402
from hefbuild.store.statcache import StatCache  # noqa: E402
from hefbuild.store.store import Store  # noqa: E402

MB = 1e6
SHAPED_RATE, SHAPED_RTT = 100e6, 0.020
# Uploads also race zstd with its workers, one a core (grpc_zstd.THREADS = -1).
UP_MODES = ("none", "zstd", "zstd workers")
DOWN_MODES = ("none", "zstd")


def sha256_of(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(1 << 22):
            hasher.update(piece)
    return hasher.hexdigest()


class Bench:
    def __init__(self, work: Path, server: GrpcCache, file: Path, digest: str) -> None:
        self.work, self.server, self.file, self.digest = work, server, file, digest
        self.size = file.stat().st_size

    def settings(self, url: str, mode: str) -> CacheSettings:
        return CacheSettings(url, timeout_s=60.0, compression=mode.split()[0])

    def upload(self, url: str, mode: str) -> tuple[Callable[[], None], Callable[[], None]]:
        def prepare() -> None:
            self.server.blobs.pop(self.digest, None)

        def run() -> None:
            grpc_zstd.THREADS = -1 if mode.endswith("workers") else threads
            try:
                transport_for(self.settings(url, mode)).put(f"cas/{self.digest}", self.file,
                                                            self.digest)
            finally:
                grpc_zstd.THREADS = threads
        threads = grpc_zstd.THREADS
        return prepare, run

    def download(self, url: str, mode: str) -> tuple[Callable[[], None], Callable[[], None]]:
        def prepare() -> None:
            shutil.rmtree(self.work / "store", ignore_errors=True)
            (self.work / "stat.sqlite3").unlink(missing_ok=True)
            if self.digest not in self.server.blobs:
                self.server.blobs[self.digest] = self.file.read_bytes()

        def run() -> None:
            store = Store(self.work / "store", StatCache(self.work / "stat.sqlite3"))
            got = BlobStore(self.settings(url, mode)).download(self.digest, store, self.size)
            assert got == self.size, "the download came back short"
        return prepare, run

    def timed(self, contender: tuple[Callable[[], None], Callable[[], None]], rpc: str
              ) -> tuple[float, int]:
        """Seconds of one run, and the bytes its blob took on the wire."""
        prepare, run = contender
        prepare()
        before = len(self.server.moved)
        start = time.perf_counter()
        run()
        seconds = time.perf_counter() - start
        wire = sum(m.wire for m in self.server.moved[before:] if m.rpc == rpc)
        return seconds, wire


def race(bench: Bench, url: str, rpc: str, rounds: int) -> dict[str, tuple[float, int]]:
    """Each mode's median seconds and its bytes on the wire, alternating, after a warm-up."""
    make, modes = (bench.upload, UP_MODES) if rpc == "write" else (bench.download, DOWN_MODES)
    contenders = {mode: make(url, mode) for mode in modes}
    for mode in modes:
        bench.timed(contenders[mode], rpc)
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    wire: dict[str, int] = {}
    for i in range(rounds):
        for mode in modes if i % 2 == 0 else modes[::-1]:
            took, wire[mode] = bench.timed(contenders[mode], rpc)
            seconds[mode].append(took)
    return {mode: (statistics.median(seconds[mode]), wire[mode]) for mode in modes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--file", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--links", nargs="+", default=["loopback", "shaped"],
                        choices=["loopback", "shaped"])
    args = parser.parse_args()
    digest = sha256_of(args.file)
    size = args.file.stat().st_size
    print(f"{args.file.name}: {size / MB:.1f} MB; medians of {args.runs} rounds")
    print(f"{'':<42} {'wire MB':>9} {'of blob':>8} {'seconds':>8}")
    with tempfile.TemporaryDirectory(prefix="hefbuild-zstd-") as tmp, \
            GrpcCache(zstd=True) as server:
        bench = Bench(Path(tmp), server, args.file, digest)
        for link in args.links:
            proxy = ShapingProxy(("127.0.0.1", server.port), SHAPED_RATE, SHAPED_RTT).start() \
                if link == "shaped" else None
            url = f"grpc://127.0.0.1:{proxy.port}/main" if proxy else server.url
            where = "loopback" if proxy is None else "100 MB/s, 20 ms RTT"
            try:
                for rpc, verb in (("write", "upload"), ("read", "download")):
                    for mode, (seconds, wire) in race(bench, url, rpc, args.runs).items():
                        print(f"{verb + ' ' + mode + ', ' + where:<42} {wire / MB:>9.1f} "
                              f"{wire / size:>8.1%} {seconds:>8.2f}")
            finally:
                if proxy is not None:
                    proxy.stop()


if __name__ == "__main__":
    main()
