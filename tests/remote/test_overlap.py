"""Hashing beside the socket (remote/overlap.py): the bytes and digests are those of a plain
hashlib pass, a failing disk comes back to the caller, a corrupt upload never gives its last
chunk, and no worker thread outlives its transfer. Then both ends through real nginx and a
raw server on 127.0.0.1."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import threading
from pathlib import Path

import pytest
from fakes.cache_server import NginxCache

from hefbuild.declare.settings import CacheSettings
from hefbuild.remote import http as http_module
from hefbuild.remote import overlap
from hefbuild.remote.cas import BlobStore, WrongBytes
from hefbuild.remote.http import HttpTransport
from hefbuild.remote.overlap import CHUNK, HashingReader, HashingWriter
from hefbuild.remote.problems import CorruptSource, Oversized, SinkError
from hefbuild.store.statcache import StatCache
from hefbuild.store.store import Store

from .test_http_expect import serve  # noqa: F401 - the raw server fixture

MIB = 1 << 20


def workers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("hefbuild-hash")]


def data_of(size: int) -> bytes:
    return os.urandom(size)


@pytest.mark.parametrize("overlapped", [True, False])
def test_a_writer_writes_and_hashes_every_chunk_in_order(overlapped):
    data = data_of(5 * MIB + 123)
    out = io.BytesIO()
    with HashingWriter(out, overlapped) as sink:
        # chunks of every kind a transport gives: small, ours, larger than ours, a view
        for start, end in [(0, 10), (10, CHUNK + 10), (CHUNK + 10, 3 * CHUNK + 7),
                           (3 * CHUNK + 7, len(data))]:
            piece = data[start:end]
            sink(memoryview(bytearray(piece)) if start else piece)
        digest = sink.digest()
    assert out.getvalue() == data
    assert digest == hashlib.sha256(data).hexdigest()
    assert workers() == []


def test_a_writer_reuses_a_view_the_transport_overwrites_next():
    """A transport reads the next chunk into the buffer it just handed over."""
    data = data_of(8 * CHUNK)
    buf, out = bytearray(CHUNK), io.BytesIO()
    with HashingWriter(out) as sink:
        for i in range(8):
            buf[:] = data[i * CHUNK:(i + 1) * CHUNK]
            sink(memoryview(buf))
        digest = sink.digest()
    assert out.getvalue() == data and digest == hashlib.sha256(data).hexdigest()


class FullDisk(io.RawIOBase):
    def __init__(self, room: int) -> None:
        self.room = room

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # noqa: ANN001
        if len(b) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(b)
        return len(b)


def test_a_full_disk_comes_back_as_the_oserror_it_was():
    with pytest.raises(OSError) as caught, HashingWriter(FullDisk(2 * CHUNK)) as sink:
        for _ in range(64):
            sink(bytes(CHUNK))
        sink.digest()
    assert caught.value.errno == errno.ENOSPC
    assert workers() == []


def reader_chunks(reader: HashingReader) -> list[bytes]:
    chunks = []
    while chunk := reader.read():
        chunks.append(bytes(chunk))
    return chunks


def test_a_reader_gives_the_file_in_order_then_the_end(tmp_path):
    data = data_of(5 * MIB + 77)
    path = tmp_path / "blob"
    path.write_bytes(data)
    with open(path, "rb") as f, HashingReader(f, hashlib.sha256(data).hexdigest(), len(data),
                                              CorruptSource) as reader:
        chunks = reader_chunks(reader)
    assert b"".join(chunks) == data and len(chunks) == 6
    assert workers() == []


@pytest.mark.parametrize("flaw", ["last byte", "first byte", "shorter", "longer"])
def test_a_corrupt_file_never_gives_its_last_chunk(tmp_path, flaw):
    data = data_of(5 * MIB + 77)
    digest = hashlib.sha256(data).hexdigest()
    bad = {"last byte": data[:-1] + bytes([data[-1] ^ 1]),
           "first byte": bytes([data[0] ^ 1]) + data[1:],
           "shorter": data[:-1], "longer": data + b"!"}[flaw]
    path = tmp_path / "blob"
    path.write_bytes(bad)
    given = []
    with open(path, "rb") as f, HashingReader(f, digest, len(data), CorruptSource) as reader, \
            pytest.raises(CorruptSource):
        while chunk := reader.read():
            given.append(len(chunk))
    assert sum(given) < len(data) - 1  # the server never has a whole body
    assert workers() == []


def test_a_connection_that_fails_early_stops_the_reader(tmp_path):
    data = data_of(12 * MIB)
    path = tmp_path / "blob"
    path.write_bytes(data)
    with open(path, "rb") as f, HashingReader(f, hashlib.sha256(data).hexdigest(), len(data),
                                              CorruptSource) as reader:
        assert len(reader.read()) == CHUNK  # then the socket breaks: nothing else is read
    assert workers() == []


def blob_file(folder: Path, size: int) -> tuple[Path, str]:
    data = data_of(size)
    path = folder / "object"
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def settings(url: str) -> CacheSettings:
    return CacheSettings(remote=url, timeout_s=10.0)


def test_a_large_corrupt_upload_never_completes_its_body(serve, tmp_path):  # noqa: F811
    server = serve("continue")
    path, digest = blob_file(tmp_path, overlap.FROM + 3 * MIB)
    with pytest.raises(CorruptSource):
        HttpTransport(settings(server.url)).put("cas/x", path, "0" * 64)
    server.stop()
    assert server.bodies == [] and digest != "0" * 64
    assert workers() == []


def test_large_blobs_go_up_and_come_back_verified_through_nginx(tmp_path):
    path, digest = blob_file(tmp_path, overlap.FROM + 5 * MIB + 3)
    store = Store(tmp_path / "store", StatCache(tmp_path / "stat.sqlite3"))
    with NginxCache(root=tmp_path / "nginx") as nginx:
        HttpTransport(settings(nginx.url)).put(f"cas/{digest}", path, digest)
        assert nginx.blob_path(digest).read_bytes() == path.read_bytes()
        size = path.stat().st_size
        assert BlobStore(settings(nginx.url)).download(digest, store, size) == size
        assert store.object_path(digest).read_bytes() == path.read_bytes()

        # the server's copy goes bad: the download is refused and nothing is kept
        wrong = bytearray(path.read_bytes())
        wrong[-1] ^= 1
        nginx.blob_path(digest).write_bytes(wrong)
        store.drop_object(digest)
        with pytest.raises(WrongBytes):
            BlobStore(settings(nginx.url)).download(digest, store, size)
        assert not store.object_path(digest).exists()
        assert list((store.root / "tmp").iterdir()) == []
    assert workers() == []


class Body:
    """An HTTP response's body as http.client gives it: readinto in pieces of odd sizes."""

    def __init__(self, data: bytes, length: int | None = None) -> None:
        self.data, self.at, self.closed = data, 0, False
        self.buffers: set[int] = set()  # the buffers it was asked to fill
        self.length = len(data) if length is None else length

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return str(self.length) if name.lower() == "content-length" else default

    def readinto(self, buf) -> int:  # noqa: ANN001
        self.buffers.add(id(buf))
        n = min(len(buf), 300_007, len(self.data) - self.at)
        buf[:n] = self.data[self.at:self.at + n]
        self.at += n
        return n

    def close(self) -> None:
        self.closed = True


def test_a_body_is_received_straight_into_the_hashing_ring():
    data = data_of(overlap.FROM + 3 * MIB + 5)
    out, body = io.BytesIO(), Body(data)
    with HashingWriter(out) as sink:
        assert http_module._drain(body, sink, len(data)) == len(data)
        digest = sink.digest()
    assert out.getvalue() == data and digest == hashlib.sha256(data).hexdigest()
    # filled in turn in the ring's buffers, where a copy to hash used a single one
    assert 1 < len(body.buffers) <= overlap.DEPTH
    assert workers() == []


def test_a_body_longer_than_the_limit_is_refused_before_its_excess_is_written():
    data = data_of(3 * MIB)
    out, body = io.BytesIO(), Body(data, length=2 * MIB)  # a server that lies about it
    with pytest.raises(Oversized), HashingWriter(out) as sink:
        http_module._drain(body, sink, 2 * MIB)
    assert body.closed and len(out.getvalue()) <= 2 * MIB
    assert workers() == []


def test_a_full_disk_under_the_ring_is_the_local_disk_not_the_cache():
    with pytest.raises(SinkError) as caught, HashingWriter(FullDisk(2 * CHUNK)) as sink:
        http_module._drain(Body(data_of(8 * MIB)), sink, 8 * MIB)
    assert caught.value.cause.errno == errno.ENOSPC
    assert workers() == []
