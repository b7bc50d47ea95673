"""`Expect: 100-continue` on large uploads (remote/expect.py), against real nginx and against
a raw server on 127.0.0.1 that answers the header each way a server may: go on, refuse,
ignore it, not know it (417), or answer with no HTTP at all."""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.cache_server import NginxCache

from hefbuild.declare.settings import CacheSettings
from hefbuild.remote import expect
from hefbuild.remote.http import HttpTransport
from hefbuild.remote.problems import CorruptSource, Problem, RemoteError

MIB = 1 << 20


class RawServer:
    """One connection at a time; `answer` says what to do after a request's headers:
    "continue", "ignore", "refuse" (401), "417", "garbage". Records each request's head and
    how many body bytes it received."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.heads: list[str] = []
        self.bodies: list[int] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(0.2)
                self._exchange(conn)

    def _exchange(self, conn: socket.socket) -> None:
        while True:
            data = b""
            while b"\r\n\r\n" not in data:
                piece = self._recv(conn, 65536)
                if not piece:
                    return
                data += piece
            head, _, rest = data.partition(b"\r\n\r\n")
            text = head.decode()
            self.heads.append(text)
            expects = "expect: 100-continue" in text.lower()
            size = int(next(line.split(":")[1] for line in text.split("\r\n")
                            if line.lower().startswith("content-length")))
            if expects and self.answer == "refuse":
                conn.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
                self.bodies.append(len(rest) + _drain(conn, 0.3))
                return
            if expects and self.answer == "417":
                conn.sendall(b"HTTP/1.1 417 Expectation Failed\r\nContent-Length: 0\r\n\r\n")
                self.bodies.append(len(rest) + _drain(conn, 0.3))
                return
            if expects and self.answer == "garbage":
                conn.sendall(b"SSH-2.0-OpenSSH\r\n\r\n")
                return
            if expects and self.answer == "continue":
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            got = len(rest)
            while got < size:
                piece = self._recv(conn, min(1 << 20, size - got))
                if not piece:
                    return
                got += len(piece)
            self.bodies.append(got)
            conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")

    def _recv(self, conn: socket.socket, size: int) -> bytes:
        """The next bytes, b"" when the client hung up or the server is stopping."""
        while not self._stop.is_set():
            try:
                return conn.recv(size)
            except TimeoutError:
                continue
            except ConnectionError:
                return b""
        return b""

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


def _drain(conn: socket.socket, seconds: float) -> int:
    """What a client sends within `seconds` after a refusal (0: it sent nothing)."""
    conn.settimeout(seconds)
    got = 0
    try:
        while piece := conn.recv(65536):
            got += len(piece)
    except (TimeoutError, ConnectionError):
        pass
    return got


@pytest.fixture
def serve() -> Iterator:
    servers: list[RawServer] = []

    def start(answer: str) -> RawServer:
        servers.append(RawServer(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def blob(tmp_path: Path, size: int) -> tuple[Path, str]:
    path = tmp_path / f"blob-{size}"
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def transport(url: str) -> HttpTransport:
    return HttpTransport(CacheSettings(remote=url, timeout_s=10.0, min_rate=1 << 20))


def test_a_large_upload_waits_for_the_go_and_a_small_one_does_not(serve, tmp_path):
    server = serve("continue")
    t = transport(server.url)
    big, big_digest = blob(tmp_path, expect.FROM)
    small, small_digest = blob(tmp_path, expect.FROM - 1)
    assert t.put("cas/big", big, big_digest) == expect.FROM
    assert t.put("cas/small", small, small_digest) == expect.FROM - 1
    assert "Expect: 100-continue" in server.heads[0]
    assert "expect" not in server.heads[1].lower()
    assert server.bodies == [expect.FROM, expect.FROM - 1]


def test_a_refusal_before_the_body_sends_no_body(serve, tmp_path):
    server = serve("refuse")
    path, digest = blob(tmp_path, 4 * MIB)
    with pytest.raises(RemoteError) as caught:
        transport(server.url).put("cas/x", path, digest)
    assert caught.value.problem is Problem.UNAUTHORIZED and "before the body" in str(caught.value)
    server.stop()  # it has counted what came after its refusal
    assert server.bodies == [0]


def test_a_server_that_ignores_the_header_gets_the_body_after_the_wait(serve, tmp_path):
    server = serve("ignore")
    path, digest = blob(tmp_path, 2 * MIB)
    start = time.monotonic()
    assert transport(server.url).put("cas/x", path, digest) == 2 * MIB
    assert time.monotonic() - start >= expect.WAIT * 0.9
    assert server.bodies == [2 * MIB]


def test_a_server_that_answers_417_gets_the_request_again_without_it(serve, tmp_path):
    server = serve("417")
    t = transport(server.url)
    path, digest = blob(tmp_path, 2 * MIB)
    assert t.put("cas/x", path, digest) == 2 * MIB
    assert t.put("cas/y", path, digest) == 2 * MIB  # remembered: straight without it
    server.stop()
    assert ["expect: 100-continue" in h.lower() for h in server.heads] == [True, False, False]
    assert server.bodies == [0, 2 * MIB, 2 * MIB]


def test_an_answer_that_is_no_http_is_a_protocol_error(serve, tmp_path):
    server = serve("garbage")
    path, digest = blob(tmp_path, 2 * MIB)
    with pytest.raises(RemoteError) as caught:
        transport(server.url).put("cas/x", path, digest)
    assert caught.value.problem is Problem.PROTOCOL


def test_nginx_takes_large_uploads_through_the_header(tmp_path):
    path, digest = blob(tmp_path, 3 * MIB + 5)
    with NginxCache(root=tmp_path / "nginx") as nginx:
        t = transport(nginx.url)
        assert t.put(f"cas/{digest}", path, digest) == 3 * MIB + 5
        assert nginx.blob_path(digest).read_bytes() == path.read_bytes()


def test_a_corrupt_large_object_still_never_sends_its_last_chunk(serve, tmp_path):
    server = serve("continue")
    path, digest = blob(tmp_path, 3 * MIB)
    with pytest.raises(CorruptSource):
        transport(server.url).put("cas/x", path, "0" * 64)  # not what the bytes hash to
    server.stop()
    assert server.bodies == [] and digest != "0" * 64  # the body never completed


def _interim(*pieces: bytes, gap: float = 0.05,
             tls: tuple[ssl.SSLContext, Path] | None = None) -> tuple[bytes, bytes]:
    """What `_interim_head` takes when the server sends `pieces` with `gap` seconds between
    them (over TLS with `tls`: its server context and certificate), and what it leaves on
    the socket."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.settimeout(5)

        def send() -> None:
            peer = theirs if tls is None else tls[0].wrap_socket(theirs, server_side=True)
            for piece in pieces:
                peer.sendall(piece)
                time.sleep(gap)
            peer.shutdown(socket.SHUT_WR)
        sender = threading.Thread(target=send)
        sender.start()
        try:
            if tls is not None:
                client = ssl.create_default_context(cafile=tls[1])
                ours = client.wrap_socket(ours, server_hostname="127.0.0.1")
            head = expect._interim_head(ours)
        finally:
            sender.join()
        left = b""
        while piece := ours.recv(65536):
            left += piece
        return head, left


def test_the_interim_head_is_taken_and_nothing_after_it():
    final = b"HTTP/1.1 413 Too Large\r\nContent-Length: 2\r\n\r\nno"
    head, left = _interim(b"HTTP/1.1 100 Continue\r\n\r\n" + final)
    assert (head, left) == (b"HTTP/1.1 100 Continue\r\n\r\n", final)


@pytest.mark.parametrize("cut", [1, 10, 22, 23, 24, 25])  # 22-24: inside the blank line
def test_an_interim_head_that_comes_in_pieces_is_put_together(cut):
    whole = b"HTTP/1.1 100 Continue\r\n\r\n"
    head, left = _interim(whole[:cut], whole[cut:] + b"after")
    assert (head, left) == (whole, b"after")


@pytest.mark.parametrize("cut", [10, 23])
def test_over_tls_the_interim_head_is_taken_and_nothing_after_it(cut, tls):
    whole = b"HTTP/1.1 100 Continue\r\n\r\n"
    head, left = _interim(whole[:cut], whole[cut:] + b"HTTP/1.1 201 Created", tls=tls)
    assert (head, left) == (whole, b"HTTP/1.1 201 Created")


def test_an_interim_head_that_never_ends_is_refused_within_its_limit():
    with pytest.raises(RemoteError) as caught:
        _interim(b"HTTP/1.1 100 Continue\r\n", b"X-Long: " + b"y" * 9000)
    assert caught.value.problem is Problem.PROTOCOL


def test_a_connection_closed_inside_the_interim_head_is_unreachable():
    with pytest.raises(RemoteError) as caught:
        _interim(b"HTTP/1.1 100 Cont")
    assert caught.value.problem is Problem.UNREACHABLE


def test_bodies_sent_one_after_another_through_the_reused_buffer_are_each_their_own(tmp_path):
    """A vouched upload (no digest) is read through the thread's one buffer: a short body
    after a long one must not carry the long one's bytes."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_bytes(os.urandom(2 * MIB + 5))  # two full chunks and a short one
    second.write_bytes(b"short")
    with NginxCache(root=tmp_path / "nginx") as nginx:
        t = transport(nginx.url)
        for path in (first, second, first):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            assert t.put(f"cas/{digest}", path) == path.stat().st_size
            assert nginx.blob_path(digest).read_bytes() == path.read_bytes()
