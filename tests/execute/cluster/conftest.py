"""A real Ray cluster for the tests, inside a network namespace that only has loopback.

Ray binds the machine's interface address by default, and our machines allow test traffic
on loopback only. The fixtures make a network namespace (`unshare --net`, held open by a
`sleep` whose PID the test owns), move this test thread into it (setns(2): the thread's
sockets and every process it starts from then on live there), and start the cluster, the
remote cache (nginx) and every `doit` run inside it. Leaving restores the thread's own
namespace. Skipped without unshare or ray, unless CI=true (then they fail).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

# The session's local tiny-llama build (made once for every worker), compared with a cluster's.
from e2e.conftest import built_store  # noqa: F401
from fakes.cache_server import NginxCache

from .raycluster import start, stop

CLONE_NEWNET = 0x40000000
# Three nodes: plain CPUs (the head), the device host, the GPU host; all on one machine.
NODES = [
    {"num_cpus": 2, "node_name": "cpu-node"},
    {"num_cpus": 1, "node_name": "device-node", "resources": {"hailo10h": 1}},
    {"num_cpus": 1, "num_gpus": 1, "node_name": "gpu-node", "resources": {"gpu_host": 1}},
]
# A package only as installed metadata, of another version on the device node than here
# (the test that a node refuses a key made for another toolchain pins it).
PINNED = "npu-runtime"
NODE_VERSION = "2.0"


def site_with(folder: Path, package: str, version: str) -> Path:
    """A folder that, on PYTHONPATH, makes `package` report `version` (metadata only)."""
    info = folder / f"{package.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\n"
                                   f"Version: {version}\n")
    return folder


def _require(ok: bool, why: str) -> None:
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why} (CI must provide it)")
        pytest.skip(why)


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns(CLONE_NEWNET) failed")


# The namespace the tests started in (this file is imported before any fixture moves the
# thread): what must reach the world from inside a cluster's fixture goes back there.
_STARTED_IN = os.open("/proc/thread-self/ns/net", os.O_RDONLY)


@contextmanager
def _joined(ns: int) -> Iterator[None]:
    """This thread (and what it starts) in the network namespace `ns`, then back."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _setns(ns)
        yield
    finally:
        _setns(own)
        os.close(own)


@contextmanager
def inside(holder_pid: int) -> Iterator[None]:
    """This thread (and what it starts) in the namespace of `holder_pid`, then back."""
    theirs = os.open(f"/proc/{holder_pid}/ns/net", os.O_RDONLY)
    try:
        with _joined(theirs):
            yield
    finally:
        os.close(theirs)


def outside() -> AbstractContextManager[None]:
    """This thread in the namespace the tests started in, then back: the package's cluster
    keeps it inside a loopback-only one, where a package registry cannot be reached."""
    return _joined(_STARTED_IN)


@contextmanager
def loopback_namespace() -> Iterator[int]:
    """A network namespace with only `lo`, up; yields the PID that holds it."""
    _require(shutil.which("unshare") is not None and os.geteuid() == 0,
             "unshare --net (as root) is needed for a loopback-only Ray cluster")
    holder = subprocess.Popen(["unshare", "--net", "sh", "-c",
                               "ip link set lo up && echo up && exec sleep infinity"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
        yield holder.pid
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()


@contextmanager
def ray_sessions() -> Iterator[Path]:
    """A folder for the cluster's Ray sessions (RAY_TMPDIR), removed after it. Ray's own,
    /tmp/ray, keeps every session's logs and sockets after the cluster is gone; the name is
    short because Ray's sockets live under it (a socket's path has at most 107 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="hefbuild-ray-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="package")
def netns() -> Iterator[int]:
    with loopback_namespace() as holder:
        yield holder


@pytest.fixture(scope="package")
def cluster(netns: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The cluster (its nodes keep their own store: outputs travel through the CAS) and an
    nginx remote cache, both inside the namespace; this thread stays inside meanwhile."""
    try:
        import ray  # noqa: F401
    except ImportError:
        _require(False, "ray is not installed (pip install -e '.[test]')")
    tmp = tmp_path_factory.mktemp("ray")
    env = {**os.environ, "HEFBUILD_STORE": str(tmp / "node-store"),
           "RAY_BACKEND_LOG_LEVEL": "error", "RAY_USAGE_STATS_ENABLED": "0"}
    site = site_with(tmp / "device-site", PINNED, NODE_VERSION)
    nodes = [dict(n, env_vars={"PYTHONPATH": str(site)}) if n["node_name"] == "device-node"
             else n for n in NODES]
    with ray_sessions() as sessions, inside(netns):
        env["RAY_TMPDIR"] = str(sessions)
        proc, address = start(nodes, tmp / "cluster.err", env)
        cache = NginxCache(root=tmp / "nginx").start()
        try:
            yield {"address": address, "cache": cache, "pid": proc.pid,
                   "node_store": tmp / "node-store"}
        finally:
            cache.stop()
            stop(proc)
