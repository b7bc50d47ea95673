"""What a cluster node checks before it runs a stage, and what the driver checks of a node.

A stage's key describes the driver's toolchain (execute/toolchain.py probes it there). A node
with another interpreter or another package version would store its result under a key
that describes something else, so the node probes the toolchain it would run, the same way,
and refuses on any difference. It also refuses when it runs another hefbuild than the
driver: the same version string over other source (an edited checkout) is another hefbuild.

Pure functions, no Ray: the worker and the driver call them, the unit tests too.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import hefbuild

# Identity fields a node can probe of its own interpreter (a host or venv toolchain's).
PROBED = ("python", "implementation", "platform")


@functools.cache
def hefbuild_identity() -> dict[str, str]:
    """This process's hefbuild: its version and the digest of its installed source files
    (computed once per process)."""
    return {"version": hefbuild.__version__,
            "source": source_digest(Path(hefbuild.__file__).parent)}


def source_digest(package: Path) -> str:
    """One digest of every .py file under `package`, by relative path and content; bytecode
    caches are left out (written or not depending on the machine's settings)."""
    whole = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" not in path.relative_to(package).parts:
            whole.update(path.relative_to(package).as_posix().encode() + b"\0")
            whole.update(hashlib.sha256(path.read_bytes()).digest())
    return f"sha256:{whole.hexdigest()}"


def hefbuild_differs(node: str, driver: dict[str, str], here: dict[str, str]) -> str | None:
    """Why `node` (running `here`) must not run the driver's stage, or None."""
    if not driver or driver == here:
        return None
    return (f"node {node} runs hefbuild {here['version']} (source {_short(here['source'])}), "
            f"the driver {driver['version']} (source {_short(driver['source'])}): install "
            f"the driver's hefbuild on that node")


def probe_wanted(kind: str, identity: dict[str, Any]) -> list[str] | None:
    """The packages to probe on the node, or None when the node cannot probe this kind:
    an image is its ID (the node runs exactly it or fails), a device's pins are checked
    against the device by the stage itself."""
    if kind not in ("host", "venv") or not all(f in identity for f in PROBED):
        return None
    return sorted(identity.get("packages", {}))


def toolchain_differs(node: str, toolchain: str, wanted: dict[str, Any],
                      found: dict[str, Any]) -> str | None:
    """The first difference between the key's toolchain identity and the node's, in one
    line naming the node, what differs, what it has and what the key was made for."""
    where = f"(toolchain {toolchain})"
    for field in PROBED:
        if found.get(field) != wanted[field]:
            return (f"node {node} has {field} {found.get(field)}, the key was made for "
                    f"{wanted[field]} {where}")
    have = found.get("packages", {})
    for name, version in sorted(wanted.get("packages", {}).items()):
        if have.get(name) == version:
            continue
        if have.get(name) is None:
            return f"node {node} has no {name} installed, the key was made for {version} {where}"
        if version is None:
            return f"node {node} has {name} {have[name]}, the key was made without it {where}"
        return f"node {node} has {name} {have[name]}, the key was made for {version} {where}"
    return None


def loopback_cache(driver_address: str, node: str, node_address: str,
                   cache_url: str) -> str | None:
    """The warning when the cache URL names loopback and `node` is on another host: there
    it reaches itself, not the driver's cache. A node that reports a loopback address
    itself is on the head's host, as is a node with the driver's own address."""
    host = urlsplit(cache_url).hostname
    if host is None or not _loopback(host):
        return None
    if not node_address or node_address == driver_address or _loopback(node_address):
        return None
    return (f"the remote cache {cache_url} is on loopback, and node {node} ({node_address}) "
            f"is not on this host ({driver_address}): there {host} is the node itself; set "
            f"[cache] remote to an address every node reaches")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _short(digest: str) -> str:
    return digest[:len("sha256:") + 12] + "…"
