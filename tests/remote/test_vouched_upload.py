"""Uploading store objects: what the store vouches for goes as it is, anything else is hashed.

An object hashed as it entered the store, whose inode has not changed since, is the object
a local restore trusts without reading it; an upload trusts it the same way and sends it
without hashing it again. An object the stat cache has no word for (a store copied from
elsewhere, a lost table) or one written since is hashed as it is sent, and is never sent
when it is not its name. Whatever a writer sends, a reader hashes every blob it takes.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from hefbuild.declare.settings import CacheSettings
from hefbuild.digest import Digest
from hefbuild.remote.cache import RemoteCache
from hefbuild.remote.cas import BlobStore, WrongBytes
from hefbuild.remote.http import HttpTransport
from hefbuild.remote.problems import CorruptSource
from hefbuild.store.statcache import StatCache
from hefbuild.store.store import Store

MIB = 1 << 20


class Recording(HttpTransport):
    """The real transport, noting the digest each PUT was asked to check."""

    def __init__(self, settings: CacheSettings) -> None:
        super().__init__(settings)
        self.checked: dict[str, str | None] = {}

    def put(self, path: str, body: Path | bytes, digest: str | None = None) -> int:
        self.checked[path] = digest
        return super().put(path, body, digest)


def settings(url: str) -> CacheSettings:
    return CacheSettings(remote=url, timeout_s=10.0, upload=True)


def stored(store: Store, folder: Path, data: bytes) -> str:
    path = folder / f"out-{len(data)}"
    path.write_bytes(data)
    return store.put_file(path).digest


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    os.chmod(path, 0o444)


@pytest.mark.parametrize("size", [1000, 6 * MIB + 5])  # a small body; one that waits for 100
def test_objects_the_store_vouches_for_go_as_they_are_and_arrive_whole(
        nginx_cache, tmp_path, size):
    store = Store(tmp_path / "store", StatCache(tmp_path / "stat.sqlite3"))
    data = os.urandom(size)
    digest = stored(store, tmp_path, data)
    transport = Recording(settings(nginx_cache.url))
    sent = RemoteCache(settings(nginx_cache.url), print, transport).put_objects(store, [digest])
    assert sent == size and transport.checked == {f"cas/{digest}": None}
    assert nginx_cache.blob_path(digest).read_bytes() == data


def test_an_object_the_stat_cache_has_no_word_for_is_hashed_and_never_sent_wrong(
        nginx_cache, tmp_path):
    made = Store(tmp_path / "store", StatCache(tmp_path / "stat.sqlite3"))
    good = stored(made, tmp_path, os.urandom(3 * MIB))
    wrong = stored(made, tmp_path, os.urandom(2 * MIB))
    flip(made.object_path(wrong))
    copied = Store(tmp_path / "store", StatCache(tmp_path / "lost.sqlite3"))  # no rows
    transport = Recording(settings(nginx_cache.url))
    cache = RemoteCache(settings(nginx_cache.url), print, transport)
    assert cache.put_objects(copied, [good]) == 3 * MIB
    assert transport.checked[f"cas/{good}"] == good  # hashed as it went
    with pytest.raises(CorruptSource):
        cache.put_objects(copied, [wrong])
    assert not nginx_cache.blob_path(wrong).exists()


def test_an_object_changed_since_it_was_stored_is_hashed_and_never_sent(nginx_cache, tmp_path):
    store = Store(tmp_path / "store", StatCache(tmp_path / "stat.sqlite3"))
    digest = stored(store, tmp_path, os.urandom(5 * MIB))
    flip(store.object_path(digest))  # a stray write: its ctime moved
    cache = RemoteCache(settings(nginx_cache.url), print)
    with pytest.raises(CorruptSource):
        cache.put_objects(store, [digest])
    assert not nginx_cache.blob_path(digest).exists()


def test_a_reader_refuses_what_a_writer_trusted_wrongly(nginx_cache, tmp_path):
    """Bytes that rot under an unchanged inode get past the writer's stat cache, as past a
    local restore; they never get past a reader, which hashes every blob it takes."""
    writer = Store(tmp_path / "writer", StatCache(tmp_path / "w.sqlite3"))
    digest = stored(writer, tmp_path, os.urandom(2 * MIB))
    obj = writer.object_path(digest)
    flip(obj)
    StatCache(tmp_path / "w.sqlite3").remember(obj, Digest(digest))  # the rot went unseen
    writer = Store(tmp_path / "writer", StatCache(tmp_path / "w.sqlite3"))
    RemoteCache(settings(nginx_cache.url), print).put_objects(writer, [digest])
    served = nginx_cache.blob_path(digest).read_bytes()
    assert hashlib.sha256(served).hexdigest() != digest  # sent as it was: the writer's word

    reader = Store(tmp_path / "reader", StatCache(tmp_path / "r.sqlite3"))
    with pytest.raises(WrongBytes):
        BlobStore(settings(nginx_cache.url)).download(digest, reader, len(served))
    assert not reader.object_path(digest).exists()
