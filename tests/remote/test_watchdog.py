"""Every exchange's deadline is served by one watchdog thread (remote/watchdog.py): a stalled
exchange is still cut at its deadline, many deadlines at once are each served on time, and
no thread is started per exchange."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from fakes.cache_server import NginxCache, SilentServer

from hefbuild.declare.settings import CacheSettings
from hefbuild.remote import watchdog
from hefbuild.remote.http import HttpTransport
from hefbuild.remote.problems import Problem, RemoteError
from hefbuild.remote.watchdog import Watchdog


@pytest.fixture
def pairs() -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    made: list[tuple[socket.socket, socket.socket]] = []
    yield made
    for a, b in made:
        a.close()
        b.close()


def _stalled(pairs: list[tuple[socket.socket, socket.socket]]) -> socket.socket:
    """One end of a connected pair whose other end never sends."""
    pairs.append(socket.socketpair())
    return pairs[-1][0]


def test_a_stalled_read_is_cut_at_its_deadline(pairs: list) -> None:
    dog, sock = Watchdog(), _stalled(pairs)
    start = time.monotonic()
    deadline = dog.arm(0.3, sock)
    assert sock.recv(1) == b""  # shut down under the blocked call: it returns at once
    elapsed = time.monotonic() - start
    assert deadline.expired and 0.25 <= elapsed < 2.0, elapsed
    assert dog.pending() == 0


def test_many_deadlines_at_once_one_thread_each_on_time(pairs: list) -> None:
    dog = Watchdog(name="watchdog-under-test")
    socks = [_stalled(pairs) for _ in range(40)]
    deadlines = [dog.arm(2.0 - i * 0.04, s) for i, s in enumerate(socks)]  # latest first
    kept = deadlines[::2]
    for d in kept:  # disarmed: the exchange ended in time, its socket is never touched
        dog.disarm(d)
    watchdogs = [t for t in threading.enumerate() if t.name == "watchdog-under-test"]
    assert len(watchdogs) == 1
    cut = deadlines[1::2]
    end = time.monotonic() + 8.0
    while not all(d.expired for d in cut) and time.monotonic() < end:
        time.sleep(0.05)
    assert all(d.expired for d in cut) and not any(d.expired for d in kept)
    for i, s in enumerate(socks):
        s.setblocking(False)
        if i % 2:
            assert s.recv(1) == b""  # cut
        else:
            with pytest.raises(BlockingIOError):
                s.recv(1)  # still open, nothing to read


def test_an_earlier_deadline_wakes_the_watchdog(pairs: list) -> None:
    dog = Watchdog()
    late = dog.arm(30.0, _stalled(pairs))
    start = time.monotonic()
    soon = dog.arm(0.2, _stalled(pairs))
    while not soon.expired and time.monotonic() - start < 5.0:
        time.sleep(0.02)
    assert soon.expired and time.monotonic() - start < 2.0 and not late.expired
    dog.disarm(late)


class _CountingCondition(threading.Condition):
    def __init__(self) -> None:
        super().__init__()
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def test_only_the_last_disarm_wakes_the_watchdog(
        pairs: list, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exchanges that end while others are still armed wake no thread (a wake-up per blob
    cost 3 % of a download of many); the last one does, so the thread ends IDLE_S later."""
    monkeypatch.setattr(watchdog, "IDLE_S", 0.1)
    dog = Watchdog(name="lazy-watchdog")
    dog._cond = cond = _CountingCondition()
    armed = [dog.arm(30.0 + i, _stalled(pairs)) for i in range(4)]  # the first is the head
    for deadline in armed[:3]:
        dog.disarm(deadline)
    assert cond.notified == 0 and dog.pending() == 1
    dog.disarm(armed[3])
    assert cond.notified == 1 and dog.pending() == 0
    end = time.monotonic() + 5.0
    while any(t.name == "lazy-watchdog" for t in threading.enumerate()):
        assert time.monotonic() < end, "the idle watchdog thread did not end"
        time.sleep(0.02)
    assert not any(d.expired for d in armed)


def test_an_idle_watchdog_thread_ends_and_a_new_deadline_starts_one(
        pairs: list, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "IDLE_S", 0.1)
    dog = Watchdog(name="idle-watchdog")

    def running() -> int:
        return sum(t.name == "idle-watchdog" for t in threading.enumerate())

    dog.disarm(dog.arm(5.0, _stalled(pairs)))
    end = time.monotonic() + 5.0
    while running() and time.monotonic() < end:
        time.sleep(0.02)
    assert running() == 0
    again = dog.arm(0.1, _stalled(pairs))
    while not again.expired and time.monotonic() < end:
        time.sleep(0.02)
    assert again.expired


def test_no_thread_is_started_per_exchange(nginx_cache: NginxCache,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []
    real_start = threading.Thread.start

    def counting_start(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    http = HttpTransport(CacheSettings(remote=nginx_cache.url, timeout_s=10.0))
    digest = nginx_cache.seed_blob(b"x" * 5000)
    monkeypatch.setattr(threading.Thread, "start", counting_start)
    got: list[int] = []
    for _ in range(50):
        assert http.get(f"cas/{digest}", lambda c: got.append(len(c)), 5000) == 5000
        assert http.head(f"cas/{digest}") == 5000
    assert sum(got) == 50 * 5000
    # at most the shared watchdog, had it gone idle since an earlier test
    assert len(started) <= 1 and all(n == "hefbuild-watchdog" for n in started), started


def test_a_stalled_server_is_still_cut_off(silent_server: SilentServer) -> None:
    http = HttpTransport(CacheSettings(remote=silent_server.url, timeout_s=0.5, min_rate=1))
    start = time.monotonic()
    with pytest.raises(RemoteError) as err:
        http.head("cas/" + "0" * 64)
    assert err.value.problem is Problem.TIMEOUT and time.monotonic() - start < 5.0
