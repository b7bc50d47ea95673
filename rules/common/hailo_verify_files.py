"""hailo10h verify's files on the device host, named and checked by content digest: a file
already there with the right sha256 (checked there with sha256sum) is not copied again."""

from __future__ import annotations

import hashlib
from pathlib import Path

from common.hailo_verify_retry import UTILITY_TIMEOUT_S, Device, DeviceFailure, tail


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_file(dev: Device, local: Path, remote: str, digest: str) -> None:
    """Copy unless the remote file is there with this sha256 (checked with sha256sum)."""
    t = dev.transport
    if t.exists(remote):
        done = t.run(["sha256sum", remote], UTILITY_TIMEOUT_S)
        if done.code == 0 and done.stdout.split()[:1] == [digest]:
            print(f"[device] already there, sha256 verified: {remote} ({local.name})")
            return
        print(f"[device] {remote} does not match sha256 {digest[:12]}: copying again")
    t.put(local, remote)
    done = t.run(["sha256sum", remote], UTILITY_TIMEOUT_S)
    if done.code != 0 or done.stdout.split()[:1] != [digest]:
        raise DeviceFailure(f"copy of {local.name} to the device host is corrupt "
                            f"(sha256sum: {tail(done)})")
    print(f"[device] uploaded {local.name} ({local.stat().st_size} bytes) -> {remote}")
