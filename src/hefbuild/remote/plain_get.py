"""A small blob's GET written and read here, not by http.client, on the connection http.client
keeps (plain HTTP only).

Why: per blob of 1 MiB, http.client spent more CPU on the answer's head than anything of ours
but the hash: it builds the request header by header, and parses the head with the `email`
package (a MIME parser, with its feed parser and policies, for three fields we read). Four
connections at once on 2 cores that the server shares are bound by CPU (docs/transfers.md).

What is taken here is only the plain case: `HTTP/1.x`, a `Content-Length`, no
`Transfer-Encoding`, one of each field. Anything else (chunked, a length missing or said
twice, a 1xx, a head that is not one) raises `Unusual`, before a byte of the body is read,
and the transport asks again through http.client on a new connection, where every answer is
taken or refused as before: an answer without a length still stops at the limit, and so on.
An answer other than 2xx ends its connection, its body unread: a 404 is still "absent",
any other status raised as the transport raises it. The idle timeout and the deadline are
the transport's: the socket stays in timeout mode for the head, and the body is
waitall.py's.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable

from . import waitall
from .problems import Oversized

HEAD_MAX = 16 << 10  # a larger head goes to http.client (a blob's is some 250 bytes)
_ILLEGAL = re.compile(r"[\x00-\x20\x7f]")  # what http.client refuses in a request's path
_CRLF = re.compile(r"[\r\n]")


class Unusual(Exception):
    """An answer this reader does not take: asked again through http.client. Raised only
    after the request went (and `meanwhile` ran)."""


def takes(url: str) -> bool:
    """A path http.client would send as it is (no control character, no space)."""
    return not _ILLEGAL.search(url)


class PlainGet:
    """GET requests for one server (`host` as the Host field gives it), with `headers`."""

    def __init__(self, host: str, headers: dict[str, str]) -> None:
        fields = {"Host": host, "Accept-Encoding": "identity", **headers}
        if any(_CRLF.search(f"{k}{v}") for k, v in fields.items()):
            raise ValueError("a header with a line break")  # http.client refuses it too
        self._fields = "".join(f"{k}: {v}\r\n" for k, v in fields.items()).encode("latin-1")

    def get(self, sock: socket.socket, url: str, into: memoryview,
            meanwhile: Callable[[], None] | None) -> tuple[int, int, int, bool]:
        """(status, bytes read into `into`, bytes announced, whether the connection can
        serve the next request). `into` has room for one byte more than the body may have;
        `meanwhile` runs once the request is sent."""
        sock.sendall(b"GET " + url.encode("ascii") + b" HTTP/1.1\r\n" + self._fields + b"\r\n")
        if meanwhile is not None:
            meanwhile()
        head, early = _read_head(sock)
        status, length, keep = _parse(head)
        if not 200 <= status < 300:  # its body is not read: the connection goes
            return status, 0, length, False
        limit = len(into) - 1
        if length > limit:
            raise Oversized(limit, f"answer of {length} bytes, more than the {limit} expected")
        got = min(len(early), length)
        into[:got] = early[:got]
        if got < length:
            got += waitall.recv_all(sock, into[got:length])
        return status, got, length, keep and got == length and len(early) <= length


def _read_head(sock: socket.socket) -> tuple[bytes, memoryview]:
    """The head (up to its blank line) and the body bytes that came with it."""
    buf = bytearray(HEAD_MAX)
    view, filled = memoryview(buf), 0
    while True:
        n = sock.recv_into(view[filled:])
        if not n:
            raise ConnectionResetError("the server closed before its answer's head")
        start, filled = max(0, filled - 3), filled + n
        end = buf.find(b"\r\n\r\n", start, filled)
        if end >= 0:
            return bytes(buf[:end]), view[end + 4:filled]
        # Lines ended by a bare LF: no CRLF blank line may ever come (a body of its own size
        # would wait out the idle timeout); http.client takes them.
        if buf.find(b"\n\n", max(0, start - 1), filled) >= 0 or filled == HEAD_MAX:
            raise Unusual("a head with bare line feeds, or of more than HEAD_MAX bytes")


def _parse(head: bytes) -> tuple[int, int, bool]:
    """(status, Content-Length, keep-alive) of a plain answer; else Unusual."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if version not in ("HTTP/1.1", "HTTP/1.0") or not code.isdigit() or code[0] == "1":
        raise Unusual(lines[0])
    fields: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        name = name.lower()
        if not colon or name != name.strip() or name in fields:
            raise Unusual(line)
        fields[name] = value.strip()
    length = fields.get("content-length", "")
    if "transfer-encoding" in fields or not length.isdigit() or not length.isascii():
        raise Unusual("no plain Content-Length")
    tokens = {t.strip().lower() for t in fields.get("connection", "").split(",")}
    keep = "close" not in tokens and (version == "HTTP/1.1" or "keep-alive" in tokens)
    return int(code), int(length), keep
