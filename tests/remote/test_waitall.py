"""A small blob's body read in one `recv(MSG_WAITALL)` (remote/waitall.py), against a real
HTTP server on 127.0.0.1 that serves the bytes whole, in pieces, or half and then stalls or
hangs up: the bytes are the body, silence is still a timeout, a cut body is an error, and
the connection goes on serving the next request."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from pathlib import Path

import pytest
from fakes.hostile_cache import HostileCache

from hefbuild.declare.settings import CacheSettings
from hefbuild.remote.http import HttpTransport
from hefbuild.remote.problems import Problem, RemoteError
from hefbuild.remote.watchdog import Deadline, Watchdog

SIZE = 300_000  # several TCP segments, well under a small blob's limit


@pytest.fixture
def server(tmp_path: Path):  # noqa: ANN201
    with HostileCache(tmp_path / "srv", trickle_s=0.02) as srv:
        yield srv


def put(server: HostileCache, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    path = server.data / "cas" / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest


def transport(server: HostileCache, timeout_s: float = 5.0,
              min_rate: int = 1 << 20) -> HttpTransport:
    return HttpTransport(CacheSettings(remote=server.url, timeout_s=timeout_s,
                                       min_rate=min_rate))


def stalled(http: HttpTransport, digest: str) -> tuple[RemoteError, float]:
    """The TIMEOUT a GET of a stalled blob ends in, and the seconds it took."""
    start = time.monotonic()
    with pytest.raises(RemoteError) as err:
        http.get_into(f"cas/{digest}", memoryview(bytearray(SIZE + 1)))
    assert err.value.problem is Problem.TIMEOUT
    return err.value, time.monotonic() - start


def test_bodies_come_whole_and_the_connection_serves_the_next(server):
    blobs = [os.urandom(SIZE), os.urandom(SIZE // 3), b""]
    http = transport(server)
    socks = set()
    for data in blobs:
        into = memoryview(bytearray(len(data) + 1))
        assert http.get_into(f"cas/{put(server, data)}", into) == len(data)
        assert bytes(into[:len(data)]) == data
        socks.add(http._conn().sock)
        # the socket is back in timeout mode for http.client's next headers
        assert http._conn().sock.gettimeout() == 5.0
    assert len(socks) == 1, "a new connection per blob: the response was not finished"


def test_a_body_that_comes_in_pieces_is_read_whole(server):
    data = os.urandom(40)  # one byte every 20 ms: 40 receives' worth of arrivals
    digest = put(server, data)
    server.misbehave(f"cas/{digest}", "trickle")
    into = memoryview(bytearray(len(data) + 1))
    assert transport(server).get_into(f"cas/{digest}", into) == len(data)
    assert bytes(into[:len(data)]) == data


def test_silence_in_the_middle_of_a_body_is_the_idle_timeout(server):
    digest = put(server, os.urandom(SIZE))
    server.misbehave(f"cas/{digest}", "stall")
    # The deadline (0.5 s + SIZE at 1 KiB/s: about 5 min) is far off: only the idle
    # timeout can end this.
    error, seconds = stalled(transport(server, timeout_s=0.5, min_rate=1 << 10), digest)
    assert "no answer within 0.5 s" in str(error)
    assert seconds < 60, "the idle timeout did not end the read"
    assert server.streamed[f"/cas/{digest}"] == SIZE // 2


def test_a_body_cut_short_is_an_error_and_the_next_request_reconnects(server):
    data = os.urandom(SIZE)
    cut, whole = put(server, data), put(server, data[::-1])
    server.misbehave(f"cas/{cut}", "cut")
    http = transport(server)
    with pytest.raises(RemoteError) as err:
        http.get_into(f"cas/{cut}", memoryview(bytearray(SIZE + 1)))
    assert err.value.problem is Problem.UNREACHABLE
    assert f"connection closed after {SIZE // 2} of {SIZE} bytes" in str(err.value)
    into = memoryview(bytearray(SIZE + 1))
    assert http.get_into(f"cas/{whole}", into) == SIZE
    assert bytes(into[:SIZE]) == data[::-1]


class HastyWatchdog(Watchdog):
    """Every deadline 0.3 s, whatever the exchange's size: shorter than any idle timeout."""

    def arm(self, seconds: float, sock: socket.socket | None) -> Deadline:
        return super().arm(0.3, sock)


def test_the_deadline_cuts_a_blocked_read(server):
    digest = put(server, os.urandom(SIZE))
    server.misbehave(f"cas/{digest}", "stall")
    http = transport(server, timeout_s=30.0)
    http.watchdog = HastyWatchdog()
    error, seconds = stalled(http, digest)
    assert "cut off after 0 s" in str(error)
    assert seconds < 25, "only the idle timeout ended the read"
