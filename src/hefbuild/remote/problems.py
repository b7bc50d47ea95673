"""What can go wrong moving bytes to and from a remote cache, as types. Every failure of
the cache becomes a `RemoteError` with a `Problem` that says what a person should hear
(not authorized is not "cannot reach"); http.py and folder.py make them.

    RemoteError
     ├── problem = UNREACHABLE   connection refused, DNS, TLS, a shared folder missing
     ├── problem = TIMEOUT       no byte within the idle timeout, or a transfer slower
     │                           than the minimum rate (its deadline: timeout + size/rate)
     ├── problem = UNAUTHORIZED  401 / 403, or a folder we may not write
     ├── problem = FULL          413 / 507, or no space left on the cache
     ├── problem = SERVER        5xx
     └── problem = PROTOCOL      any other answer we cannot use
          ├── Oversized          more bytes than the entry can have (stopped at the limit)
          └── Undecodable        a compressed blob that does not decompress

Failures on this side are not the cache's and are never a `RemoteError`:
`CorruptSource` (a local file does not hash to the digest it is sent as: the upload is
aborted before its last byte, so no server keeps it) and `SinkError` (writing what arrived
failed here, e.g. the local disk is full).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

Sink = Callable[[bytes | memoryview], None]


class Problem(str, Enum):
    UNREACHABLE = "cannot be reached"
    TIMEOUT = "did not answer in time"
    UNAUTHORIZED = "not authorized"
    FULL = "is full or refused the size"
    SERVER = "answered with a server error"
    PROTOCOL = "gave an unexpected answer"


class RemoteError(Exception):
    def __init__(self, problem: Problem, detail: str, status: int | None = None) -> None:
        super().__init__(f"{problem.value} ({detail})")
        self.problem, self.detail, self.status = problem, detail, status

    @property
    def transient(self) -> bool:
        """Worth one more try: a dropped connection or a 502/503/504."""
        return (self.problem is Problem.SERVER and self.status in (502, 503, 504)) or \
            (self.problem is Problem.UNREACHABLE and self.status == -1)


class Oversized(RemoteError):
    """The cache sent more bytes than the entry can have."""

    def __init__(self, limit: int, detail: str) -> None:
        super().__init__(Problem.PROTOCOL, detail)
        self.limit = limit


class Undecodable(RemoteError):
    """The cache's compressed bytes for a blob are no valid stream: that blob is bad, as
    one of wrong bytes would be, not the cache."""

    def __init__(self, detail: str) -> None:
        super().__init__(Problem.PROTOCOL, detail)


class CorruptSource(Exception):
    """A local file about to be uploaded does not hash to the digest it is sent as."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"local bytes of sha256:{expected[:12]}… hash to "
                         f"sha256:{actual[:12]}…")
        self.expected, self.actual = expected, actual


class SinkError(Exception):
    """Storing downloaded bytes failed on this machine (`cause` is the OSError)."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


def sunk(sink: Callable[..., None], *chunk: object) -> None:
    """`sink(*chunk)`; the OSError of the local disk it writes to comes out as SinkError."""
    try:
        sink(*chunk)
    except OSError as exc:
        raise SinkError(exc) from exc


