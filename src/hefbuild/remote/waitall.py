"""A small blob's body in one system call: `recv(MSG_WAITALL)` on the socket, blocking
(plain_get.py reads the body this way).

Why: http.client reads a body through a socket in timeout mode, and there every read is a
`poll` and then a `recv` of whatever has arrived, each of which lets go of the GIL and takes it
back. A 1 MiB blob over loopback came in about 17 pieces: some 35 hand-offs of the GIL a blob,
among the 4 connections in flight, which hash and write between their receives. Asked for the
whole rest of the body at once, the kernel fills the buffer as the segments come and wakes the
thread once.

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
import struct


def recv_all(sock: socket.socket, into: memoryview) -> int:
    """`into` filled from the socket in one `recv` (more only after an idle timeout's
    partial return); fewer bytes when the connection ended."""
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
