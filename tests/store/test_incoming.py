"""An incoming object is published whole under its digest, or leaves nothing at all: not when
it is abandoned, not when its process is killed mid-write, with or without O_TMPFILE."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hefbuild.store import incoming as incoming_module
from hefbuild.store.statcache import StatCache
from hefbuild.store.store import Store

DATA = os.urandom(3 << 20)
DIGEST = hashlib.sha256(DATA).hexdigest()
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(params=["unnamed", "named"])
def new_store(request, tmp_path, monkeypatch) -> Store:
    """A store whose downloads land as unnamed files, or (a filesystem without O_TMPFILE)
    as named temp files."""
    if request.param == "named":
        real_open = os.open

        def no_tmpfile(path, flags, *args, **kwargs):
            if flags & os.O_TMPFILE == os.O_TMPFILE:
                raise OSError(errno.EOPNOTSUPP, "Operation not supported")
            return real_open(path, flags, *args, **kwargs)
        monkeypatch.setattr(incoming_module.os, "open", no_tmpfile)
    return Store(tmp_path / "store", StatCache(tmp_path / "stat.sqlite3"))


def leftovers(store: Store) -> list[str]:
    """Every file in the store that is not a published object."""
    tmp = [p.name for p in (store.root / "tmp").iterdir()]
    shards = [p for p in (store.root / "objects").glob("*/*")]
    return tmp + [p.name for p in shards if p.name != DIGEST[2:]]


def test_a_published_object_has_its_bytes_read_only_and_nothing_else(new_store):
    old_umask = os.umask(0o077)  # a user's tight umask must not hide objects from others
    try:
        with new_store.incoming(DIGEST) as new:
            new.out.write(DATA)
            new_store.adopt(new, DIGEST)
    finally:
        os.umask(old_umask)
    path = new_store.object_path(DIGEST)
    assert path.read_bytes() == DATA
    assert path.stat().st_mode & 0o777 == 0o444
    assert new_store.verify(DIGEST)
    assert leftovers(new_store) == []


def test_an_abandoned_object_leaves_nothing(new_store):
    with pytest.raises(RuntimeError), new_store.incoming(DIGEST) as new:
        new.out.write(DATA[:1000])
        raise RuntimeError("the digest did not match")
    assert not new_store.object_path(DIGEST).exists()
    assert leftovers(new_store) == []


def test_publishing_replaces_a_damaged_object_in_one_step(new_store):
    path = new_store.object_path(DIGEST)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"damaged")
    with new_store.incoming(DIGEST) as new:
        new.out.write(DATA)
        new_store.adopt(new, DIGEST)
    assert path.read_bytes() == DATA
    assert leftovers(new_store) == []


def test_small_objects_through_the_store(new_store):
    blobs = [os.urandom(n) for n in (0, 1, 4096, 1 << 20)]
    for blob in blobs:
        new_store.put_verified_bytes(memoryview(blob), hashlib.sha256(blob).hexdigest())
    for blob in blobs:
        assert new_store.object_path(hashlib.sha256(blob).hexdigest()).read_bytes() == blob


KILLED = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from pathlib import Path
    from hefbuild.store import incoming
    from hefbuild.store.statcache import StatCache
    from hefbuild.store.store import Store
    if sys.argv[3] == "named":
        incoming.Incoming._unnamed = lambda self: None
    store = Store(Path(sys.argv[2]) / "store", StatCache(Path(sys.argv[2]) / "stat.sqlite3"))
    with store.incoming("ab" * 32) as new:
        new.out.write(b"x" * (1 << 20))
        new.out.flush()
        print("written", flush=True)
        sys.stdin.read()
""")


@pytest.mark.parametrize("kind", ["unnamed", "named"])
def test_a_download_killed_mid_write_leaves_nothing_a_later_run_trusts(tmp_path, kind):
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(SRC), str(tmp_path), kind],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "written\n"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    store = Store(tmp_path / "store", StatCache(tmp_path / "stat.sqlite3"))
    assert not store.object_path("ab" * 32).exists()
    left = [p.name for p in (store.root / "tmp").iterdir()]
    if kind == "unnamed":
        assert left == []  # the kernel freed the file with its last descriptor
        assert list((store.root / "objects").glob("*/*")) == []
    else:
        assert len(left) == 1 and left[0].startswith(f"incoming-{proc.pid}-")
        assert store.sweep_stale() == 1
        assert list((store.root / "tmp").iterdir()) == []
