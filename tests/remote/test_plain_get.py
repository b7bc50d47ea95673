"""A small blob's GET without http.client (remote/plain_get.py): the same request on the
wire as http.client's, the plain answers taken, every other answer handed to http.client."""

from __future__ import annotations

import http.client
import os

import pytest
from fakes.scripted_server import ScriptedServer

from hefbuild.declare.settings import CacheSettings, Credentials
from hefbuild.remote.http import HttpTransport
from hefbuild.remote.plain_get import Unusual, _parse
from hefbuild.remote.problems import Oversized, Problem, RemoteError

BODY = os.urandom(5000)


def ok(body: bytes = BODY, extra: str = "", version: str = "HTTP/1.1") -> bytes:
    return (f"{version} 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def chunked(body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


def transport(url: str, **creds: str) -> HttpTransport:
    return HttpTransport(CacheSettings(remote=url, timeout_s=5.0,
                                       credentials=Credentials(**creds)))


def fetch(http: HttpTransport, size: int = len(BODY)) -> tuple[int | None, bytes]:
    into = memoryview(bytearray(size + 1))
    got = http.get_into("cas/" + "ab" * 32, into)
    return got, bytes(into[:got or 0])


def test_the_request_is_byte_for_byte_http_clients():
    with ScriptedServer([(ok(), "whole"), (ok(), "whole")]) as server:
        http = transport(server.url + "/base", token="s3cret")
        assert fetch(http) == (len(BODY), BODY)
        conn = http_client_request(server.url, "/base/cas/" + "ab" * 32, http._headers)
        (_, ours), (_, theirs) = server.requests
        assert ours == theirs
        assert b"Authorization: Bearer s3cret\r\n" in ours
        conn.close()


def http_client_request(url: str, path: str, headers: dict[str, str]) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", path, headers=dict(headers))
    conn.getresponse().read()
    return conn


@pytest.mark.parametrize("how", ["whole", "pieces"])
def test_a_plain_answer_is_taken_and_the_connection_kept(how):
    with ScriptedServer([(ok(), how), (ok(BODY[::-1]), how)]) as server:
        http = transport(server.url)
        assert fetch(http) == (len(BODY), BODY)
        assert fetch(http) == (len(BODY), BODY[::-1])
        assert [n for n, _ in server.requests] == [1, 1], "one connection for both"


@pytest.mark.parametrize("answer", [
    ok(extra="Connection: close\r\n"),
    ok(version="HTTP/1.0"),
], ids=["connection-close", "http-1.0"])
def test_an_answer_that_ends_its_connection_is_taken_and_the_next_reconnects(answer):
    with ScriptedServer([(answer, "close"), (ok(), "whole")]) as server:
        http = transport(server.url)
        assert fetch(http) == (len(BODY), BODY)
        assert fetch(http) == (len(BODY), BODY)
        assert [n for n, _ in server.requests] == [1, 2]


def test_a_chunked_answer_is_asked_again_through_http_client():
    with ScriptedServer([(chunked(BODY), "whole"), (chunked(BODY), "whole")]) as server:
        http = transport(server.url)
        assert fetch(http) == (len(BODY), BODY)
        # the plain reader left its connection at the head; http.client asked on a new one
        assert [n for n, _ in server.requests] == [1, 2]


def test_a_head_of_bare_line_feeds_is_asked_again_through_http_client():
    bare = f"HTTP/1.1 200 OK\nContent-Length: {len(BODY)}\n\n".encode() + BODY
    with ScriptedServer([(bare, "whole"), (bare, "whole")]) as server:
        assert fetch(transport(server.url)) == (len(BODY), BODY)
        assert [n for n, _ in server.requests] == [1, 2]


def test_an_answer_longer_than_the_limit_is_refused_unread():
    with ScriptedServer([(ok(), "whole")]) as server, pytest.raises(Oversized):
        fetch(transport(server.url), size=len(BODY) - 1)


def test_a_missing_blob_is_none_and_an_error_status_is_raised():
    missing = b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found"
    busy = b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy"
    with ScriptedServer([(missing, "whole"), (busy, "whole"), (ok(), "whole")]) as server:
        http = transport(server.url)
        assert fetch(http) == (None, b"")
        with pytest.raises(RemoteError) as err:
            fetch(http)
        assert err.value.problem is Problem.SERVER and err.value.transient
        assert fetch(http) == (len(BODY), BODY)
        assert [n for n, _ in server.requests] == [1, 2, 3], "an error's body is never read"


def test_a_body_cut_short_says_how_much_came():
    with ScriptedServer([(ok()[:-100], "close")]) as server:
        with pytest.raises(RemoteError) as err:
            fetch(transport(server.url))
        assert f"connection closed after {len(BODY) - 100} of {len(BODY)} bytes" \
            in str(err.value)


def test_a_head_cut_short_is_a_dropped_connection():
    with ScriptedServer([(b"HTTP/1.1 200 OK\r\nContent-Le", "close")]) as server:
        with pytest.raises(RemoteError) as err:
            fetch(transport(server.url))
        assert err.value.problem is Problem.UNREACHABLE


def test_plain_heads_parse():
    assert _parse(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nServer: nginx") == (200, 12, True)
    assert _parse(b"HTTP/1.1 204 No Content\r\ncontent-length:0") == (204, 0, True)
    assert _parse(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: Close") == (200, 1, False)
    assert _parse(b"HTTP/1.0 200 OK\r\nContent-Length: 1") == (200, 1, False)
    assert _parse(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\nConnection: keep-alive") \
        == (200, 1, True)


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked",  # the TE counts
    b"HTTP/1.1 200 OK\r\nServer: x",  # no length: the body ends at the close
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1",
    b"HTTP/1.1 200 OK\r\nContent-Length: \xd9\xa3",  # a digit, not an ASCII one
    b"HTTP/1.1 100 Continue\r\nContent-Length: 0",
    b"HTTP/2 200\r\nContent-Length: 1",
    b"ICY 200 OK\r\nContent-Length: 1",
    b"HTTP/1.1 200 OK\r\nContent-Length : 1",
    b"HTTP/1.1 200 OK\r\n folded: value\r\nContent-Length: 1",
    b"HTTP/1.1 200 OK\r\nno colon here\r\nContent-Length: 1",
])
def test_anything_else_goes_to_http_client(head):
    with pytest.raises(Unusual):
        _parse(head)


def test_over_tls_http_client_reads_every_answer(tls):
    context, cert = tls
    answers = [(ok(), "whole"), (chunked(BODY[::-1]), "whole"), (ok(BODY[:7]), "pieces")]
    with ScriptedServer(answers, tls=context) as server:
        http = HttpTransport(CacheSettings(remote=server.url, timeout_s=5.0, ca_bundle=cert))
        assert fetch(http) == (len(BODY), BODY)
        assert fetch(http) == (len(BODY), BODY[::-1])
        assert fetch(http, size=7) == (7, BODY[:7])
        assert [n for n, _ in server.requests] == [1, 1, 1], "one connection for all three"


def test_a_server_whose_certificate_is_not_trusted_is_unreachable(tls):
    context, _ = tls
    with ScriptedServer([(ok(), "whole")], tls=context) as server:
        with pytest.raises(RemoteError) as err:
            fetch(transport(server.url))
        assert err.value.problem is Problem.UNREACHABLE and "TLS" in str(err.value)
        assert server.requests == []
