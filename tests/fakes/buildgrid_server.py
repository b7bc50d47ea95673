"""A real BuildGrid server (`bgd server start`, from the buildgrid wheel) on 127.0.0.1 as a
third-party REAPI v2 cache: an in-memory LRU CAS, an LRU ActionCache that takes updates, and
ByteStream, for each instance named (each its own storage). No auth, no TLS, no execution.

`BuildGridServer.start()` waits until the port answers gRPC (a channel_ready future) and the
CAS answers a FindMissingBlobs; `stop()` ends the process group it started (bgd runs in a
session of its own) by its PID, then waits for it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from fakes.cache_server import free_port

BGD = Path(sys.executable).with_name("bgd")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0

SERVER = """\
server:
  - !channel
    address: "127.0.0.1:{port}"
    insecure-mode: true
authorization:
  method: none
thread-pool-size: 10
"""
# One LRU CAS and ActionCache per instance: tests that build the same project (the same
# keys) each get a cold cache of their own from one server.
STORAGE = """\
  - !lru-storage &cas-{n}
    size: 64MB
"""
CACHE = """\
  - !lru-action-cache &ac-{n}
    storage: *cas-{n}
    max-cached-refs: 1024
    allow-updates: true
    cache-failed-actions: false
"""
INSTANCE = """\
  - name: {name}
    services:
      - !action-cache
        cache: *ac-{n}
      - !cas
        storage: *cas-{n}
      - !bytestream
        storage: *cas-{n}
"""


def config(port: int, instances: tuple[str, ...]) -> str:
    each = list(enumerate(instances))
    return (SERVER.format(port=port)
            + "storages:\n" + "".join(STORAGE.format(n=n) for n, _ in each)
            + "caches:\n" + "".join(CACHE.format(n=n) for n, _ in each)
            + "instances:\n" + "".join(INSTANCE.format(n=n, name=name) for n, name in each))


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class BuildGridServer:
    def __init__(self, root: Path, instances: tuple[str, ...] = ("main",)) -> None:
        self.root, self.instances = root, instances
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    def url(self, instance: str | None = None) -> str:
        return f"grpc://127.0.0.1:{self.port}/{instance or self.instances[0]}"

    def start(self) -> BuildGridServer:
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        path = self.root / "bgd.yml"
        path.write_text(config(self.port, self.instances))
        log = open(self.root / "bgd.log", "wb")  # noqa: SIM115 - the child keeps it open
        self._proc = subprocess.Popen([str(BGD), "server", "start", str(path)], stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        # A TCP probe first: a gRPC channel that met a refused port backs off for seconds.
        while not _listening(self.port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"bgd did not start: {self.log()[-2000:]}")
            time.sleep(0.05)
        self._wait_ready(deadline - time.monotonic())
        return self

    def _wait_ready(self, seconds: float) -> None:
        """The CAS answers a FindMissingBlobs for our instance (the services are up)."""
        import grpc
        from buildgrid._protos.build.bazel.remote.execution.v2 import (
            remote_execution_pb2 as re_pb2,
        )
        from buildgrid._protos.build.bazel.remote.execution.v2 import (
            remote_execution_pb2_grpc as re_grpc,
        )

        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=max(seconds, 1))
            re_grpc.ContentAddressableStorageStub(channel).FindMissingBlobs(
                re_pb2.FindMissingBlobsRequest(instance_name=self.instances[0]),
                timeout=max(seconds, 1), wait_for_ready=True)

    def log(self) -> str:
        path = self.root / "bgd.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: bgd and any child of it
        except ProcessLookupError:
            return
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(STOP_TIMEOUT_S)

    def __enter__(self) -> BuildGridServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
