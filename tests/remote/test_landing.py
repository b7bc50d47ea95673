"""Blobs fetched as a batch (`BlobStore.download_all`, as a cache hit fetches its blobs): a
small one is received whole, then hashed and written beside the receive of the next
(remote/landing.py), a large one streams to disk. Against a real HTTP server on 127.0.0.1
(fakes/hostile_cache.py) and a shared folder: a blob of wrong bytes, or longer or shorter
than declared, or streamed without end, is refused while the good ones of its batch are
stored; a trickle is cut off at its deadline; nothing of a refused blob is left in the
store."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest
from fakes.hostile_cache import HostileCache

from hefbuild.declare.settings import CacheSettings
from hefbuild.remote import cas, http
from hefbuild.remote.cas import BlobStore, WrongBytes, WrongSize
from hefbuild.remote.landing import Landing
from hefbuild.remote.problems import Problem, RemoteError
from hefbuild.store.statcache import StatCache
from hefbuild.store.store import Store


@pytest.fixture
def server(tmp_path: Path):  # noqa: ANN201
    with HostileCache(tmp_path / "server", trickle_s=0.2) as cache:
        yield cache


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store", StatCache(tmp_path / "stat.sqlite3"))


def served(folder: Path, data: bytes, name: str | None = None) -> str:
    """`data` in the cache as `name` (default: its own digest); the name."""
    name = name or hashlib.sha256(data).hexdigest()
    (folder / "cas").mkdir(parents=True, exist_ok=True)
    (folder / "cas" / name).write_bytes(data)
    return name


def goods(folder: Path, count: int = 6) -> list[tuple[str, int]]:
    blobs = [os.urandom(3000 + 17 * i) for i in range(count)]
    return [(served(folder, b), len(b)) for b in blobs]


def blob_store(url: str, transfers: int, timeout_s: float = 10.0) -> BlobStore:
    return BlobStore(CacheSettings(remote=url, timeout_s=timeout_s, min_rate=1 << 20,
                                   transfers=transfers))


def left_in(store: Store) -> list[Path]:
    """Files in the store's scratch folder (a refused download must leave none; a blob
    refused before it landed made not even the folder)."""
    tmp = store.root / "tmp"
    return list(tmp.iterdir()) if tmp.exists() else []


def stored(store: Store, refs: list[tuple[str, int]]) -> bool:
    return all(store.verify(d) for d, _ in refs)


@pytest.mark.parametrize("transfers", [1, 4])
def test_a_batch_of_good_blobs_is_stored_verified(server, store, transfers) -> None:
    refs = goods(server.data, 12)
    got = blob_store(server.url, transfers).download_all(refs, store)
    assert got == [size for _, size in refs]
    assert stored(store, refs) and left_in(store) == []


@pytest.mark.parametrize("transfers", [1, 4])
def test_one_wrong_blob_is_refused_and_the_good_ones_are_stored(server, store,
                                                                transfers) -> None:
    refs = goods(server.data)
    wrong = served(server.data, b"not these bytes", hashlib.sha256(b"other").hexdigest())
    blobs = blob_store(server.url, transfers)
    with pytest.raises(WrongBytes) as caught:
        blobs.download_all(refs[:3] + [(wrong, 15)] + refs[3:], store)
    assert caught.value.expected == wrong
    assert stored(store, refs)
    assert not store.object_path(wrong).exists() and wrong in blobs.bad
    assert left_in(store) == []


@pytest.mark.parametrize("how", ["endless", "oversize"])
@pytest.mark.parametrize("transfers", [1, 4])
def test_a_blob_longer_than_declared_is_refused(server, store, transfers, how) -> None:
    refs = goods(server.data)
    data = os.urandom(5000)
    long = served(server.data, data)
    server.misbehave(f"cas/{long}", how)
    blobs = blob_store(server.url, transfers)
    with pytest.raises(WrongSize):
        blobs.download_all([(long, len(data)), *refs], store)
    assert stored(store, refs)
    assert not store.object_path(long).exists() and long in blobs.bad
    assert left_in(store) == []
    assert server.streamed.get(f"/cas/{long}", 0) < 64 << 20  # stopped, not read to the end


@pytest.mark.parametrize("transfers", [1, 4])
def test_a_blob_shorter_than_declared_is_refused(server, store, transfers) -> None:
    short = served(server.data, b"short")
    refs = goods(server.data)
    blobs = blob_store(server.url, transfers)
    with pytest.raises(WrongSize):
        blobs.download_all([(short, 6), *refs], store)
    assert stored(store, refs)
    assert not store.object_path(short).exists() and left_in(store) == []


def test_an_absent_blob_is_none_and_the_others_land(server, store) -> None:
    refs = goods(server.data)
    absent = hashlib.sha256(b"never uploaded").hexdigest()
    got = blob_store(server.url, 1).download_all([(absent, 14), *refs], store)
    assert got == [None] + [size for _, size in refs]
    assert stored(store, refs) and left_in(store) == []


def test_a_trickled_blob_is_cut_off_at_its_deadline(server, store) -> None:
    data = os.urandom(100)
    slow = served(server.data, data)
    server.misbehave(f"cas/{slow}", "trickle")
    start = time.monotonic()
    with pytest.raises(RemoteError) as caught:
        blob_store(server.url, 1, timeout_s=0.5).download_all([(slow, len(data))], store)
    assert caught.value.problem is Problem.TIMEOUT
    assert time.monotonic() - start < 5  # 100 bytes at 0.2 s each would take 20 s
    assert not store.object_path(slow).exists() and left_in(store) == []


@pytest.mark.parametrize("transfers", [1, 4])
def test_a_blob_over_the_small_size_streams_to_disk_verified(server, store, monkeypatch,
                                                            transfers) -> None:
    monkeypatch.setattr(cas, "SMALL", 3100)  # some of `goods` above it, some below
    refs = goods(server.data)
    wrong = served(server.data, b"x" * 4000, hashlib.sha256(b"y").hexdigest())
    with pytest.raises(WrongBytes):
        blob_store(server.url, transfers).download_all([(wrong, 4000), *refs], store)
    assert stored(store, refs)
    assert not store.object_path(wrong).exists() and left_in(store) == []


@pytest.mark.parametrize("transfers", [1, 4])
def test_a_folder_cache_lands_through_a_sink(tmp_path, store, transfers) -> None:
    folder = tmp_path / "shared"
    refs = goods(folder)
    wrong = served(folder, b"12345", hashlib.sha256(b"54321").hexdigest())
    long = served(folder, b"longer than declared")
    blobs = blob_store(f"file://{folder}", transfers)
    with pytest.raises(WrongBytes):
        blobs.download_all([*refs, (wrong, 5)], store)
    with pytest.raises(WrongSize):
        blobs.download_all([(long, 6)], store)
    assert stored(store, refs) and {wrong, long} <= blobs.bad
    assert not store.object_path(wrong).exists() and not store.object_path(long).exists()


def test_landing_holds_at_most_its_room_in_memory() -> None:
    held, outstanding, most = 3, 0, 0
    lock = threading.Lock()

    def land(digest: str, data: memoryview) -> None:
        nonlocal outstanding
        time.sleep(0.01)  # slower than the receiving side: buffers pile up unless bounded
        with lock:
            outstanding -= 1

    def receive(landing: Landing, i: int) -> None:
        nonlocal outstanding, most
        data = landing.buffer(100)
        with lock:
            outstanding += 1
            most = max(most, outstanding)
        landing.hand_over(str(i), data[:100])

    with Landing(land, held, threads=2) as landing:
        workers = [threading.Thread(target=lambda k=k: [receive(landing, k * 10 + j)
                                                        for j in range(10)])
                   for k in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert outstanding == 0 and most == held


def test_an_owed_blob_lands_at_its_threads_next_settle_or_at_the_end() -> None:
    landed: list[str] = []
    with Landing(lambda digest, data: landed.append(digest), held=4, threads=0) as landing:
        landing.owe("a", landing.buffer(10)[:10])
        assert landed == []  # owed, not landed yet
        other = threading.Thread(target=landing.settle)  # another thread owes nothing
        other.start()
        other.join()
        assert landed == []
        landing.settle()
        assert landed == ["a"]
        landing.settle()  # nothing owed twice
        landing.owe("b", landing.buffer(10)[:10])
        landing.owe("c", landing.buffer(10)[:10])  # owing again lands what was owed
        assert landed == ["a", "b"]
        mine = threading.Thread(target=lambda: landing.owe("d", landing.buffer(10)[:10]))
        mine.start()
        mine.join()
    assert sorted(landed) == ["a", "b", "c", "d"]  # the rest landed at the end


def test_what_is_owed_still_lands_when_the_batch_fails() -> None:
    landed: list[str] = []
    with pytest.raises(RuntimeError), \
            Landing(lambda digest, data: landed.append(digest), held=2, threads=0) as landing:
        landing.owe("a", landing.buffer(10)[:10])
        raise RuntimeError("the cache went away")
    assert landed == ["a"]


def test_each_connection_lands_its_last_blob_after_it_sent_the_next_request(
        server, store, monkeypatch) -> None:
    """Four connections, each landing its own: a blob lands while the request for the next
    one travels, never before that request is sent."""
    refs = goods(server.data, 12)
    events: list[tuple[int, str, str]] = []  # (thread, what, digest)
    lock = threading.Lock()

    def note(what: str, digest: str) -> None:
        with lock:
            events.append((threading.get_ident(), what, digest))

    real_exchange = http.HttpTransport._exchange

    def exchange(self, conn, method, path, body, reader, meanwhile=None):  # noqa: ANN001, ANN202
        def then() -> None:
            note("sent", path.rpartition("/")[2])
            if meanwhile is not None:
                meanwhile()
        return real_exchange(self, conn, method, path, body, reader, then)

    real_put = Store.put_verified_bytes

    def put(self, data, digest):  # noqa: ANN001, ANN202
        note("landed", digest)
        return real_put(self, data, digest)

    monkeypatch.setattr(http.HttpTransport, "_exchange", exchange)
    monkeypatch.setattr(Store, "put_verified_bytes", put)
    assert blob_store(server.url, 4).download_all(refs, store) == [s for _, s in refs]
    assert stored(store, refs)
    threads = {t for t, _, _ in events}
    assert len(threads) > 1
    for thread in threads:
        mine = [(what, d) for t, what, d in events if t == thread]
        requests = [d for what, d in mine if what == "sent"]
        for earlier, later in zip(requests, requests[1:], strict=False):
            # `earlier` lands on this thread once `later` is asked for, and not before
            assert mine.index(("landed", earlier)) > mine.index(("sent", later))
    assert sorted(d for _, what, d in events if what == "landed") == sorted(d for d, _ in refs)
