"""What a node sends of a stage's outputs: objects its store just hashed go as they are;
an object changed since it was stored is hashed as it goes (execute/ray_worker.py)."""

from __future__ import annotations

import os
from pathlib import Path

from hefbuild.execute.ray_worker import _send
from hefbuild.store.statcache import StatCache
from hefbuild.store.store import Store


class Blobs:
    """The CAS side of a node (remote/cas.py BlobStore.ensure), noting what it was asked."""

    def __init__(self) -> None:
        self.sent: list[tuple[Path, str, bool]] = []

    def ensure(self, path: Path, digest: str, check: bool = True) -> None:
        self.sent.append((path, digest, check))


def test_a_fresh_output_is_not_hashed_again_and_a_changed_one_is(tmp_path):
    store = Store(tmp_path / "store", StatCache(tmp_path / "stat.sqlite3"))
    out = tmp_path / "model.onnx"
    out.write_bytes(b"weights" * 1000)
    digest = store.put_file(out).digest
    blobs = Blobs()
    _send(store, blobs, digest)
    obj = store.object_path(digest)
    os.chmod(obj, 0o644)
    obj.write_bytes(b"WEIGHTS" * 1000)
    _send(store, blobs, digest)
    assert blobs.sent == [(obj, digest, False), (obj, digest, True)]
