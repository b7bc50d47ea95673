"""One gRPC channel to a Remote APIs (REAPI v2) server, and what its failures mean.

`grpc://host:port/instance` or `grpcs://host:port/instance` (TLS; `ca_bundle` for a private
CA): the URL's path is the REAPI instance name (none: ""). A bearer token or user/password
goes in every call's `authorization` metadata, never in a message. Every call has a deadline
the way the HTTP transport computes one (timeout + size / min_rate). gRPC status codes become
the same `Problem`s as HTTP statuses (problems.py); NOT_FOUND is "absent", which callers say
as None. Only imported when a gRPC cache is configured (grpcio starts threads, loads TLS).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import grpc

from ..declare.settings import DEFAULT_MIN_RATE, CacheSettings
from .http import _auth_header, _rate  # the same header and wording as the HTTP transport
from .problems import Problem, RemoteError

# What each status says to a person. UNAVAILABLE is how gRPC reports a refused connection,
# a failed DNS lookup or TLS handshake as much as an overloaded server: "cannot be reached",
# worth a retry like a dropped HTTP connection (status -1 makes it transient).
_PROBLEMS = {
    grpc.StatusCode.UNAUTHENTICATED: Problem.UNAUTHORIZED,
    grpc.StatusCode.PERMISSION_DENIED: Problem.UNAUTHORIZED,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Problem.FULL,
    grpc.StatusCode.UNAVAILABLE: Problem.UNREACHABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: Problem.TIMEOUT,
    grpc.StatusCode.INTERNAL: Problem.SERVER,
    grpc.StatusCode.UNKNOWN: Problem.SERVER,
    grpc.StatusCode.DATA_LOSS: Problem.SERVER,
    grpc.StatusCode.ABORTED: Problem.SERVER,
}


class Absent(Exception):
    """NOT_FOUND: the server has no such entry or blob."""


class GrpcChannel:
    def __init__(self, settings: CacheSettings) -> None:
        parts = urlsplit(settings.remote or "")
        self.instance = parts.path.strip("/")
        # The netloc holds host[:port] only: settings moved any user:password out of it.
        # Without a port gRPC uses 443, its default.
        target = parts.netloc
        options = [("grpc.primary_user_agent", "hefbuild")]
        if parts.scheme == "grpcs":
            roots = settings.ca_bundle.read_bytes() if settings.ca_bundle else None
            self.channel = grpc.secure_channel(
                target, grpc.ssl_channel_credentials(root_certificates=roots), options)
        else:
            self.channel = grpc.insecure_channel(target, options)
        self.metadata = tuple((k.lower(), v) for k, v in _auth_header(settings).items())
        self.timeout = settings.timeout_s
        self.min_rate = settings.min_rate or DEFAULT_MIN_RATE

    def deadline(self, size: int = 0) -> float:
        """Seconds a call moving `size` bytes may take (an idle server is cut off too)."""
        return self.timeout + size / self.min_rate

    def error(self, exc: grpc.RpcError, rpc: str, size: int = 0) -> Exception:
        """The RemoteError (or Absent) a failed call means. The server's own details are
        left out: they are its words, not ours, and could echo what we sent."""
        code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
        return status_error(code, rpc, self, size, _details(exc))

    def close(self) -> None:
        self.channel.close()


def status_error(code: grpc.StatusCode, rpc: str, channel: GrpcChannel, size: int = 0,
                 details: str = "") -> Exception:
    """A status (of a call, or of one blob in a batch answer) as RemoteError or Absent."""
    if code is grpc.StatusCode.NOT_FOUND:
        return Absent(rpc)
    problem = _PROBLEMS.get(code, Problem.PROTOCOL)
    if problem is Problem.TIMEOUT:
        if size:
            return RemoteError(problem, f"slower than {_rate(channel.min_rate)} (cut off "
                               f"after {channel.deadline(size):.0f} s)")
        return RemoteError(problem, f"no answer within {channel.timeout:g} s")
    detail = f"gRPC {code.name} on {rpc}"
    if problem is Problem.UNREACHABLE and "handshake" in details.lower():
        detail += ", TLS handshake failed"
    status = -1 if problem is Problem.UNREACHABLE else None
    return RemoteError(problem, detail, status)


def _details(exc: grpc.RpcError) -> str:
    try:
        return str(exc.details() or "") if isinstance(exc, grpc.Call) else ""
    except Exception:  # a cancelled or half-made call may have none
        return ""
