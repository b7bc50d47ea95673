"""A small blob's body in one system call: `recv(MSG_WAITALL)` on the socket, blocking.

Why: http.client reads a body through a socket in timeout mode, and there every read is a
`poll` and then a `recv` of whatever has arrived, each of which lets go of the GIL and takes it
back. A 1 MiB blob over loopback came in about 17 pieces: some 35 hand-offs of the GIL a blob,
among the 4 connections in flight and the threads that hash and write. curl, with no GIL, did
the same bytes at 1/0.93 of our speed. Asked for the whole rest of the body at once, the kernel
fills the buffer as the segments come and wakes the thread once.

What does not change: the body ends at the Content-Length the answer announced (checked
against the limit before this runs), the watchdog's deadline still cuts the exchange (its
`shutdown` ends a blocked `recv`), and silence is still an error: the socket's kernel receive
timeout (`SO_RCVTIMEO`) is the idle timeout while it blocks. One difference: a call that got
some bytes before falling silent returns them after the timeout, and the next one waits again,
so a server that goes quiet mid-body is cut after one to two idle timeouts (or at the
deadline), not one. TLS sockets cannot take the flag: they read as before.
"""

from __future__ import annotations

import socket
import ssl
import struct
from http.client import HTTPResponse


def fits(sock: socket.socket | None, resp: HTTPResponse) -> bool:
    """The body can be read this way: plain TCP, not chunked, its length announced."""
    return (sock is not None and not isinstance(sock, ssl.SSLSocket) and not resp.chunked
            and resp.length is not None)


def read_body(resp: HTTPResponse, sock: socket.socket, into: memoryview) -> int:
    """The rest of `resp`'s body (resp.length bytes, at most len(into)) into `into`, first
    what http.client's reader already holds, then the rest in one `recv`; the response
    is done after this (its connection free for the next request). The bytes read; fewer
    than announced when the connection ended (the watchdog, or the server)."""
    want = min(resp.length or 0, len(into))
    total = _buffered(resp, into[:want])
    if total < want:
        total += _recv_all(sock, into[total:want])
    resp.length = 0  # what http.client would have read; `read()` now ends the response
    resp.read()
    return total


def _buffered(resp: HTTPResponse, into: memoryview) -> int:
    """The body bytes that arrived with the headers (no system call when there are any)."""
    if not len(into):
        return 0
    fp = resp.fp
    assert fp is not None  # a response whose body is unread is open
    ahead = len(fp.peek())  # a read only if nothing is held: then the body's first bytes
    return fp.readinto(into[:min(ahead, len(into))])


def _recv_all(sock: socket.socket, into: memoryview) -> int:
    idle = sock.gettimeout()
    total = 0
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(idle))
    sock.settimeout(None)  # blocking: SO_RCVTIMEO only acts on a blocking socket
    try:
        while total < len(into):
            try:
                got = sock.recv_into(into[total:], 0, socket.MSG_WAITALL)
            except BlockingIOError:  # SO_RCVTIMEO with nothing received
                raise TimeoutError("no byte within the idle timeout") from None
            if not got:
                break
            total += got
    finally:
        sock.settimeout(idle)
    return total


def _timeval(seconds: float | None) -> bytes:
    """A `struct timeval` for SO_RCVTIMEO; zero means no timeout, so a timeout is never 0."""
    usec = 0 if seconds is None else max(1, round(seconds * 1e6))
    return struct.pack("@ll", usec // 1_000_000, usec % 1_000_000)
