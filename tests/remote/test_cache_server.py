"""The remote-cache test server itself: a real nginx on 127.0.0.1 behaves as a Bazel HTTP cache
(and as the broken caches the options ask for); SilentServer never answers."""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fakes.cache_server import NginxCache, SilentServer, free_port

Response = tuple[int, dict[str, str], bytes]


def call(cache: NginxCache, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> Response:
    conn = http.client.HTTPConnection("127.0.0.1", cache.port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def basic_header(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def digest_of(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def test_put_get_head_round_trip(nginx_cache: NginxCache) -> None:
    content = os.urandom(100_000)
    digest = digest_of(content)
    path = f"/cas/{digest}"
    assert nginx_cache.url == f"http://127.0.0.1:{nginx_cache.port}"

    assert call(nginx_cache, "PUT", path, content)[0] == 201
    assert call(nginx_cache, "PUT", path, content)[0] == 204  # already there
    status, headers, body = call(nginx_cache, "GET", path)
    assert (status, body) == (200, content)
    status, headers, body = call(nginx_cache, "HEAD", path)
    assert (status, headers["content-length"], body) == (200, str(len(content)), b"")
    assert nginx_cache.blob_path(digest).read_bytes() == content


def test_missing_blob_is_404_and_eviction_by_deleting_the_file(nginx_cache: NginxCache) -> None:
    assert call(nginx_cache, "GET", f"/cas/{'0' * 64}")[0] == 404
    assert call(nginx_cache, "HEAD", f"/cas/{'0' * 64}")[0] == 404
    digest = nginx_cache.seed_blob(b"seeded")
    assert call(nginx_cache, "GET", f"/cas/{digest}")[2] == b"seeded"
    nginx_cache.blob_path(digest).unlink()
    assert call(nginx_cache, "GET", f"/cas/{digest}")[0] == 404


def test_nginx_verifies_nothing(nginx_cache: NginxCache) -> None:
    digest = digest_of(b"right")
    assert call(nginx_cache, "PUT", f"/cas/{digest}", b"wrong")[0] == 201
    assert call(nginx_cache, "GET", f"/cas/{digest}")[2] == b"wrong"


def test_nested_ac_put_creates_folders(nginx_cache: NginxCache) -> None:
    key = "deep/er/" + digest_of(b"action")
    assert call(nginx_cache, "PUT", f"/ac/{key}", b"result")[0] == 201
    assert nginx_cache.ac_path(key).read_bytes() == b"result"
    assert call(nginx_cache, "GET", f"/ac/{key}")[2] == b"result"
    assert call(nginx_cache, "DELETE", f"/ac/{key}")[0] == 204
    assert not nginx_cache.ac_path(key).exists()


def test_bearer_token_for_writes(make_cache: Callable[..., NginxCache]) -> None:
    cache = make_cache(auth="s3cret-T0ken")
    path = f"/cas/{digest_of(b'x')}"
    assert call(cache, "PUT", path, b"x")[0] == 401
    assert call(cache, "PUT", path, b"x", bearer("wrong"))[0] == 401
    assert call(cache, "PUT", path, b"x", {"Authorization": "bearer s3cret-T0ken"})[0] == 401
    assert call(cache, "DELETE", path)[0] == 401
    assert not cache.blob_path(digest_of(b"x")).exists()
    assert call(cache, "PUT", path, b"x", bearer("s3cret-T0ken"))[0] in (201, 204)
    assert call(cache, "GET", path)[:3:2] == (200, b"x")
    assert call(cache, "HEAD", path)[0] == 200


def test_bearer_token_for_everything(make_cache: Callable[..., NginxCache]) -> None:
    cache = make_cache(auth="tok", auth_scope="all")
    path = f"/cas/{digest_of(b'x')}"
    assert call(cache, "PUT", path, b"x")[0] == 401
    assert call(cache, "PUT", path, b"x", bearer("tok"))[0] == 201
    assert call(cache, "GET", path)[0] == 401
    assert call(cache, "HEAD", path)[0] == 401
    assert call(cache, "GET", path, headers=bearer("tok"))[:3:2] == (200, b"x")


def test_basic_auth(make_cache: Callable[..., NginxCache]) -> None:
    cache = make_cache(basic=("builder", "pass word"))
    path = f"/cas/{digest_of(b'x')}"
    status, headers, _ = call(cache, "GET", path)
    assert status == 401
    assert headers["www-authenticate"] == 'Basic realm="hefbuild-cache"'
    assert call(cache, "PUT", path, b"x", basic_header("builder", "wrong"))[0] == 401
    assert call(cache, "PUT", path, b"x", basic_header("builder", "pass word"))[0] == 201
    assert call(cache, "GET", path, headers=basic_header("builder", "pass word"))[2] == b"x"


@pytest.mark.parametrize("code", [500, 503, 507])
def test_status_answers_everything(make_cache: Callable[..., NginxCache], code: int) -> None:
    cache = make_cache(status=code)
    digest = cache.seed_blob(b"present")
    for method, body in (("GET", None), ("HEAD", None), ("PUT", b"x"), ("DELETE", None)):
        assert call(cache, method, f"/cas/{digest}", body)[0] == code, method


def test_put_status_only_for_put(make_cache: Callable[..., NginxCache]) -> None:
    cache = make_cache(put_status=507)
    digest = cache.seed_blob(b"present")
    new = digest_of(b"new")
    assert call(cache, "PUT", f"/cas/{new}", b"new")[0] == 507
    assert not cache.blob_path(new).exists()
    assert call(cache, "GET", f"/cas/{digest}")[:3:2] == (200, b"present")
    assert call(cache, "HEAD", f"/cas/{new}")[0] == 404


def test_access_log_records_requests(nginx_cache: NginxCache) -> None:
    digest = digest_of(b"logged")
    call(nginx_cache, "PUT", f"/cas/{digest}", b"logged", bearer("not-logged-secret"))
    call(nginx_cache, "GET", f"/cas/{digest}")
    call(nginx_cache, "HEAD", "/ac/missing")
    assert nginx_cache.requests(wait_for=3) == [
        ("PUT", f"/cas/{digest}", 201),
        ("GET", f"/cas/{digest}", 200),
        ("HEAD", "/ac/missing", 404),
    ]
    assert "not-logged-secret" not in nginx_cache.access_log.read_text()


def test_stop_leaves_no_process_and_restart_keeps_port_and_data(
    make_cache: Callable[..., NginxCache],
) -> None:
    cache = make_cache()
    digest = cache.seed_blob(b"kept")
    pid, port = cache.pid, cache.port
    assert Path(f"/proc/{pid}").exists()
    cache.stop()
    assert not Path(f"/proc/{pid}").exists()
    assert not cache.running
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    cache.start()
    assert (cache.port, call(cache, "GET", f"/cas/{digest}")[2]) == (port, b"kept")
    cache.stop()
    cache.stop()  # idempotent


def test_context_manager(tmp_path: Path, make_cache: Callable[..., NginxCache]) -> None:
    del make_cache  # requested for its skip (or CI failure) when nginx is missing
    with NginxCache(root=tmp_path / "cm") as cache:
        pid = cache.pid
        assert call(cache, "GET", "/cas/none")[0] == 404
    assert not Path(f"/proc/{pid}").exists()


def test_bad_options() -> None:
    with pytest.raises(ValueError):
        NginxCache(auth='has "quote"')
    with pytest.raises(ValueError):
        NginxCache(auth_scope="read")
    with pytest.raises(ValueError):
        NginxCache(auth="t", basic=("u", "p"))


def test_silent_server_never_answers(silent_server: SilentServer) -> None:
    assert silent_server.url == f"http://127.0.0.1:{silent_server.port}"
    conn = http.client.HTTPConnection("127.0.0.1", silent_server.port, timeout=0.5)
    started = time.monotonic()
    with pytest.raises(socket.timeout):
        conn.request("GET", f"/cas/{'0' * 64}")
        conn.getresponse()
    conn.close()
    assert time.monotonic() - started < 3
    assert silent_server.accepted == 1


def test_silent_server_stop_closes_connections() -> None:
    server = SilentServer().start()
    client = socket.create_connection(("127.0.0.1", server.port), timeout=2)
    client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    deadline = time.monotonic() + 2
    while server.bytes_received == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    server.stop()
    assert client.recv(10) == b""  # closed without a byte of answer
    client.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
