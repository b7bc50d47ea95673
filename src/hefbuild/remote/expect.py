"""`Expect: 100-continue` on a large upload (RFC 9110, section 10.1.1): the headers go first,
and the body only once the server said to go on.

A server that will refuse the body (401, 403, 413) says so before a gigabyte is sent. And
it is what curl does for a body of 1 MiB or more: nginx took 200 uploads of 1 MiB, 4 at
once on loopback, with a third less CPU and in 30 % less time when each body came after
its `100 Continue` than when it followed the headers at once (curl with and without the
header: 0.18 vs 0.27 s of nginx CPU; hefbuild's uploads went from 0.65-0.72 to 0.82-0.85 of
curl's speed, the rest being its SHA-256 of every byte, which curl does not compute). A
server that ignores the header gets the body after `WAIT` seconds, as RFC 9110 lets a
client do; one that answers 417 gets the request again without it (the transport
remembers).
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl

from .problems import Problem, RemoteError

FROM = 1 << 20  # bodies from this size on wait for the server's go (curl's threshold)
WAIT = 1.0  # seconds without an answer after which the body goes anyway (curl's default)
_HEAD_MAX = 8192  # an interim answer longer than this is no HTTP


def send_headers_expecting(conn: http.client.HTTPConnection, method: str, url: str,
                           headers: dict[str, str]) -> int | None:
    """Send the request's headers with `Expect: 100-continue` and wait for the server's
    go. None: send the body now (a 100, or no answer within WAIT); else the final status
    the server answered instead, before any of the body (the connection is then spent)."""
    conn.putrequest(method, url, skip_accept_encoding="accept-encoding" in
                    {k.lower() for k in headers})
    for name, value in headers.items():
        conn.putheader(name, value)
    conn.putheader("Expect", "100-continue")
    conn.endheaders()
    sock = conn.sock
    assert sock is not None
    if not (getattr(sock, "pending", lambda: 0)() or select.select([sock], [], [], WAIT)[0]):
        return None
    status = _status(_interim_head(sock))
    return None if status == 100 else status


def _interim_head(sock: socket.socket) -> bytes:
    """The server's first answer up to its blank line: nothing of what may follow it (the
    final answer, after the body) is taken from the socket. A plain socket is peeked at and
    only the head taken; TLS cannot peek, so it goes a byte at a time (from the decrypted
    record: no system call a byte).
    Why peek: a byte at a time on a plain socket was 26 polls and 26 receives per large
    upload, each letting go of the GIL that the other connections' threads then fought
    over (330 futex calls an upload, 75 now); 200 x 1 MiB, 4 at once, took 0.145 s of
    CPU where it takes 0.131 now and curl 0.132 (benchmarks/transfers_revs.py --up)."""
    if isinstance(sock, ssl.SSLSocket):
        return _bytewise_head(sock)
    head = bytearray()
    while True:
        seen = sock.recv(_HEAD_MAX + 1 - len(head), socket.MSG_PEEK)
        end = (head[-3:] + seen).find(b"\r\n\r\n")
        if seen and end >= 0:  # the blank line may begin in bytes already taken
            return bytes(head + _take(sock, end + 4 - len(head[-3:])))
        _check_head(seen, len(head) + len(seen))
        head += _take(sock, len(seen))  # all head: taken, then wait for more


def _take(sock: socket.socket, n: int) -> bytes:
    """`n` bytes that a peek saw (so already received: one call takes them, but a short
    one must not leave part of the head behind)."""
    got = bytearray()
    while len(got) < n:
        piece = sock.recv(n - len(got))
        _check_head(piece, 0)
        got += piece
    return bytes(got)


def _bytewise_head(sock: socket.socket) -> bytes:
    head = bytearray()
    while not head.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        _check_head(byte, len(head) + 1)
        head += byte
    return bytes(head)


def _check_head(got: bytes, length: int) -> None:
    if not got:
        raise RemoteError(Problem.UNREACHABLE, "connection closed before the body was "
                          "asked for", status=-1)
    if length > _HEAD_MAX:
        raise RemoteError(Problem.PROTOCOL, "an answer to Expect: 100-continue that is "
                          "no HTTP status")


def _status(head: bytes) -> int:
    parts = head.split(b"\r\n", 1)[0].split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit() or \
            len(parts[1]) != 3:
        raise RemoteError(Problem.PROTOCOL, "an answer to Expect: 100-continue that is no "
                          f"HTTP status: {head[:60]!r}")
    return int(parts[1])
