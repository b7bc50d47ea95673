"""zstd on a gRPC cache's wire (`[cache] compression = "zstd"`, REAPI compressed-blobs):
against the server double told to speak zstd (fakes/grpc_cache.py, which records the bytes
each blob took on the wire), against a real BuildGrid (which does not list ZSTD: plain),
and against a double that sends wrong bytes, garbage or a decompression bomb in zstd.
"""

from __future__ import annotations

import hashlib
import os
import resource
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("grpc")
pytest.importorskip("buildgrid._protos")
zstandard = pytest.importorskip("zstandard")

from fakes.buildgrid_server import BuildGridServer  # noqa: E402
from fakes.grpc_cache import GrpcCache  # noqa: E402

from hefbuild.declare.settings import CacheSettings, load_settings  # noqa: E402
from hefbuild.errors import SpecError  # noqa: E402
from hefbuild.remote import grpc_stream, grpc_transport, grpc_zstd  # noqa: E402
from hefbuild.remote.cas import BadBlob, BlobStore, WrongBytes, WrongSize  # noqa: E402
from hefbuild.remote.problems import CorruptSource, Oversized  # noqa: E402
from hefbuild.remote.transport import transport_for  # noqa: E402
from hefbuild.store.statcache import StatCache  # noqa: E402
from hefbuild.store.store import Store  # noqa: E402

from .helpers import MODEL, TASKS, cache_toml, engine, make_project, run_all  # noqa: E402
from .test_grpc_remote import digest_of, outputs  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")
ZSTD = 'compression = "zstd"\n'
SMALL, LARGE = 200_000, 3 * grpc_transport.CHUNK + 5  # a batch blob, a ByteStream one


@pytest.fixture
def zstd_cache() -> Iterator[GrpcCache]:
    with GrpcCache(zstd=True) as server:
        yield server


@pytest.fixture(scope="module")
def buildgrid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuildGridServer]:
    with BuildGridServer(tmp_path_factory.mktemp("bgd"), ("plain", "engine")) as server:
        yield server


def weights(size: int) -> bytes:
    """float32 values whose low 16 bits are 0, as bf16 weights saved as float32 are."""
    high = os.urandom(size // 2 + 2)
    data = b"".join(b"\0\0" + high[i:i + 2] for i in range(0, len(high) - 1, 2))[:size]
    assert len(data) == size
    return data


def zstd_transport(url: str):  # noqa: ANN201
    return transport_for(CacheSettings(url, compression="zstd"))


def put_and_get(transport, tmp_path: Path, data: bytes) -> bytes:  # noqa: ANN001
    sha = hashlib.sha256(data).hexdigest()
    (tmp_path / sha).write_bytes(data)
    assert transport.put(f"cas/{sha}", tmp_path / sha, sha) == len(data)
    back: list[bytes] = []
    assert transport.get(f"cas/{sha}", lambda c: back.append(bytes(c)), len(data)) == len(data)
    return b"".join(back)


def bomb(inflated: int) -> bytes:
    """A zstd stream of `inflated` zero bytes (a few hundred KB for GiBs), made in pieces."""
    maker = zstandard.ZstdCompressor(level=1).compressobj()
    zeros = bytes(1 << 20)
    parts = [maker.compress(zeros) for _ in range(inflated >> 20)]
    return b"".join([*parts, maker.flush()])


# -- a server that speaks zstd -------------------------------------------------------------


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["batch", "bytestream"])
def test_blobs_cross_the_wire_compressed_and_come_back_the_same(zstd_cache, tmp_path, size):
    transport = zstd_transport(zstd_cache.url)
    data = weights(size)
    assert put_and_get(transport, tmp_path, data) == data
    sha = hashlib.sha256(data).hexdigest()
    assert zstd_cache.blobs[sha] == data  # stored as the bytes its digest names
    assert [(m.rpc, m.compressed) for m in zstd_cache.moved] == [("write", True),
                                                                ("read", True)]
    assert all(m.wire < 0.7 * size for m in zstd_cache.moved), zstd_cache.moved
    assert transport.compression == "zstd"
    assert zstd_cache.calls.count("GetCapabilities") == 1


def test_capabilities_are_asked_once_per_transport(zstd_cache, tmp_path):
    transport = zstd_transport(zstd_cache.url)
    for n in range(3):
        put_and_get(transport, tmp_path, weights(SMALL + n))
    assert zstd_cache.calls.count("GetCapabilities") == 1
    zstd_transport(zstd_cache.url).missing([("0" * 64, 1)])  # no blob moved: not asked
    assert zstd_cache.calls.count("GetCapabilities") == 1


def test_compression_off_moves_plain_bytes_even_where_the_server_takes_zstd(zstd_cache,
                                                                             tmp_path):
    transport = transport_for(CacheSettings(zstd_cache.url))
    put_and_get(transport, tmp_path, weights(LARGE))
    assert [m.compressed for m in zstd_cache.moved] == [False, False]
    assert "GetCapabilities" not in zstd_cache.calls and transport.compression == "none"


def test_a_build_restores_through_a_compressed_cache(zstd_cache, tmp_path, monkeypatch):
    monkeypatch.setattr(grpc_transport, "BATCH_LIMIT", 64)  # records and logs stream too
    ci = engine(make_project(tmp_path / "ci", cache_toml(zstd_cache.url, True, ZSTD)),
                tmp_path / "ci-store", _fake())
    assert run_all(ci) == ["built"] * len(TASKS) and ci.warnings == []
    dev = engine(make_project(tmp_path / "dev", cache_toml(zstd_cache.url, extra=ZSTD)),
                 tmp_path / "dev-store", fake := _fake())
    assert run_all(dev) == ["remote"] * len(TASKS) and fake.ran == [] and dev.warnings == []
    assert outputs(dev) == outputs(ci)
    assert {m.compressed for m in zstd_cache.moved} == {True}
    reads = [m for m in zstd_cache.moved if m.rpc == "read"]
    assert reads and sum(m.wire for m in reads) < sum(len(zstd_cache.blobs[m.sha])
                                                       for m in reads)


def _fake():  # noqa: ANN202
    from fakes.fake_executor import FakeExecutor

    return FakeExecutor()


# -- servers without zstd: plain -----------------------------------------------------------


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["batch", "bytestream"])
def test_buildgrid_does_not_list_zstd_and_gets_plain_blobs(buildgrid, tmp_path, size):
    transport = zstd_transport(buildgrid.url("plain"))
    data = weights(size)
    assert put_and_get(transport, tmp_path, data) == data
    assert transport.compression == "none"


def test_a_build_with_compression_on_works_against_buildgrid(buildgrid, tmp_path):
    url = buildgrid.url("engine")
    ci = engine(make_project(tmp_path / "ci", cache_toml(url, True, ZSTD)),
                tmp_path / "ci-store", _fake())
    assert run_all(ci) == ["built"] * len(TASKS) and ci.warnings == []
    dev = engine(make_project(tmp_path / "dev", cache_toml(url, extra=ZSTD)),
                 tmp_path / "dev-store", fake := _fake())
    assert run_all(dev) == ["remote"] * len(TASKS) and fake.ran == [] and dev.warnings == []
    assert outputs(dev) == outputs(ci)


def test_a_server_without_get_capabilities_gets_plain_blobs(tmp_path):
    with GrpcCache() as plain:  # no Capabilities service: UNIMPLEMENTED
        transport = zstd_transport(plain.url)
        stub, asked = transport._capabilities, []
        ask = stub.GetCapabilities
        stub.GetCapabilities = lambda *a, **kw: asked.append(a) or ask(*a, **kw)
        put_and_get(transport, tmp_path, weights(SMALL))
        put_and_get(transport, tmp_path, weights(LARGE))
        assert [m.compressed for m in plain.moved] == [False] * 4
        assert len(asked) == 1 and transport.compression == "none"  # the answer is kept


# -- a server that lies in zstd ------------------------------------------------------------


def stored(tmp_path: Path) -> Store:
    return Store(tmp_path / "store", StatCache(tmp_path / "state.sqlite3"))


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["batch", "bytestream"])
def test_compressed_wrong_bytes_are_refused_and_not_stored(zstd_cache, tmp_path, size):
    data = weights(size)
    sha = hashlib.sha256(data).hexdigest()
    zstd_cache.blobs[sha] = data
    zstd_cache.lie(sha, bytes([data[0] ^ 1]) + data[1:])  # served compressed, as zstd
    blobs, store = BlobStore(CacheSettings(zstd_cache.url, compression="zstd")), stored(tmp_path)
    with pytest.raises(WrongBytes):
        blobs.download(sha, store, size)
    assert not store.verify(sha) and sha in blobs.bad
    assert zstd_cache.moved[-1].compressed


def test_a_build_never_uses_compressed_wrong_bytes(zstd_cache, tmp_path):
    ci = engine(make_project(tmp_path / "ci", cache_toml(zstd_cache.url, True, ZSTD)),
                tmp_path / "ci-store", _fake())
    run_all(ci)
    digest = digest_of(ci, "export")
    good = zstd_cache.blobs[digest]
    zstd_cache.lie(digest, bytes([good[0] ^ 1]) + good[1:])
    dev = engine(make_project(tmp_path / "dev", cache_toml(zstd_cache.url, extra=ZSTD)),
                 tmp_path / "dev-store", fake := _fake())
    assert run_all(dev) == ["remote", "built", "remote", "remote", "remote"]
    assert fake.ran == [f"export:{MODEL}"]
    assert len(dev.warnings) == 1 and "has wrong bytes" in dev.warnings[0], dev.warnings
    assert outputs(dev) == outputs(ci)


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["batch", "bytestream"])
def test_a_decompression_bomb_is_cut_off_at_the_declared_size(zstd_cache, tmp_path, size):
    data = weights(size)
    sha = hashlib.sha256(data).hexdigest()
    zstd_cache.blobs[sha] = data
    raw = bomb(1 << 30)  # 1 GiB of zeros
    assert len(raw) < 64 << 10
    zstd_cache.lie_zstd(sha, raw)
    got: list[int] = []
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    with pytest.raises(Oversized):
        zstd_transport(zstd_cache.url).get(f"cas/{sha}", lambda c: got.append(len(c)), size)
    assert sum(got) <= size and max(got, default=0) <= grpc_transport.CHUNK  # chunk by chunk
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 256 << 10  # KiB
    blobs, store = BlobStore(CacheSettings(zstd_cache.url, compression="zstd")), stored(tmp_path)
    with pytest.raises(WrongSize) as err:
        blobs.download(sha, store, size)
    assert err.value.found == "more" and not store.verify(sha) and sha in blobs.bad


def test_a_zstd_stream_without_end_is_cut_off(zstd_cache):
    data = weights(LARGE)
    sha = hashlib.sha256(data).hexdigest()
    zstd_cache.blobs[sha] = data
    skippable = struct.pack("<II", 0x184D2A50, 1 << 16) + bytes(1 << 16)  # inflates to nothing
    zstd_cache.lie_zstd(sha, skippable * 64)  # 4 MiB of zstd for a 3 MiB blob
    got: list[int] = []
    with pytest.raises(Oversized):
        zstd_transport(zstd_cache.url).get(f"cas/{sha}", lambda c: got.append(len(c)), LARGE)
    assert got == []


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["batch", "bytestream"])
def test_bytes_that_are_no_zstd_are_a_bad_blob(zstd_cache, tmp_path, size):
    data = weights(size)
    sha = hashlib.sha256(data).hexdigest()
    zstd_cache.blobs[sha] = data
    zstd_cache.lie_zstd(sha, b"this is not a zstd frame at all" * 100)
    blobs, store = BlobStore(CacheSettings(zstd_cache.url, compression="zstd")), stored(tmp_path)
    with pytest.raises(BadBlob) as err:
        blobs.download(sha, store, size)
    assert "does not decompress" in str(err.value) and not store.verify(sha)


@pytest.mark.parametrize("threads", [0, -1], ids=["one-thread", "zstd-workers"])
def test_a_corrupt_local_file_is_never_committed_compressed(zstd_cache, tmp_path,
                                                            monkeypatch, threads):
    monkeypatch.setattr(grpc_transport, "CHUNK", 1 << 16)  # several WriteRequests
    monkeypatch.setattr(grpc_zstd, "THREADS", threads)  # workers give it all at the end
    sent: list[tuple[int, bool]] = []
    requests = grpc_stream.Upload.requests

    def spied(self):  # noqa: ANN001, ANN202
        for request in requests(self):
            sent.append((len(request.data), request.finish_write))
            yield request

    monkeypatch.setattr(grpc_stream.Upload, "requests", spied)
    transport = zstd_transport(zstd_cache.url)
    good = weights(LARGE)
    sha = hashlib.sha256(good).hexdigest()
    (tmp_path / "blob").write_bytes(good[:-1] + b"!")  # bit rot since it was stored
    with pytest.raises(CorruptSource):
        transport.put(f"cas/{sha}", tmp_path / "blob", sha)
    assert sha not in zstd_cache.blobs and zstd_cache.moved == []  # never finished
    assert not any(last for _, last in sent)
    if threads == 0:
        assert len(sent) >= 2  # compressed chunks went out, the frame's end did not
    sent.clear()
    (tmp_path / "blob").write_bytes(good)
    assert transport.put(f"cas/{sha}", tmp_path / "blob", sha) == len(good)
    assert zstd_cache.blobs[sha] == good and zstd_cache.moved[-1].compressed
    assert sent[-1][1] and sum(n for n, _ in sent) == zstd_cache.moved[-1].wire
    assert max(n for n, _ in sent) <= 1 << 16  # the workers' bursts too, under gRPC's limit


# -- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["file", "env"])
def test_a_bad_compression_value_is_one_line(tmp_path, where):
    url = "grpc://127.0.0.1:9092/main"
    if where == "file":
        (tmp_path / "hefbuild.toml").write_text(f'[cache]\nremote = "{url}"\n'
                                                f'compression = "gzip"\n')
        env = {}
    else:
        (tmp_path / "hefbuild.toml").write_text(f'[cache]\nremote = "{url}"\n')
        env = {"HEFBUILD_REMOTE_COMPRESSION": "gzip"}
    with pytest.raises(SpecError) as err:
        load_settings(tmp_path, env=env)
    message = str(err.value)
    assert "\n" not in message and "hefbuild.toml" in message, message
    assert "cache.compression" in message and '"zstd" or "none"' in message
    assert "gzip" in message


@pytest.mark.parametrize("url", ["https://cache.example.org/h", "grpcs://cache.example.org/m"])
def test_compression_is_read_and_the_env_wins(tmp_path, url):
    (tmp_path / "hefbuild.toml").write_text(f'[cache]\nremote = "{url}"\n{ZSTD}')
    assert load_settings(tmp_path, env={}).cache.compression == "zstd"  # HTTP: accepted
    none = {"HEFBUILD_REMOTE_COMPRESSION": "none"}
    assert load_settings(tmp_path, env=none).cache.compression == "none"
    (tmp_path / "hefbuild.toml").write_text(f'[cache]\nremote = "{url}"\n')
    assert load_settings(tmp_path, env={}).cache.compression == "none"  # the default


def test_zstd_without_zstandard_says_what_to_install(monkeypatch):
    monkeypatch.delitem(sys.modules, "hefbuild.remote.grpc_zstd", raising=False)
    monkeypatch.setitem(sys.modules, "zstandard", None)  # as if it were not installed
    with pytest.raises(SpecError) as err:
        zstd_transport("grpc://127.0.0.1:1/main")
    message = str(err.value)
    assert "cache.compression" in message and "pip install 'hefbuild[grpc]'" in message
    assert "\n" not in message


def test_zstandard_is_imported_only_with_compression_on():
    code = ("import sys; from hefbuild.declare.settings import CacheSettings; "
            "from hefbuild.remote.transport import transport_for; "
            "transport_for(CacheSettings('grpc://127.0.0.1:1/main')); "
            "print([m for m in sys.modules if m.startswith(('zstandard', "
            "'hefbuild.remote.grpc_zstd'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": SRC})
    assert out.stdout.strip() == "[]"
