"""Fixtures for the remote-cache tests: a real nginx WebDAV server on 127.0.0.1 as the cache.

Skipped when /usr/sbin/nginx is missing, unless CI=true (then they fail: `.ci/nginx-up`
installs nginx and the dav_ext module).
"""

from __future__ import annotations

import os
import ssl
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakes.cache_server import NGINX, NginxCache, SilentServer


def require_nginx() -> None:
    if not Path(NGINX).is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{NGINX} missing on CI: run .ci/nginx-up first")
        pytest.skip(f"{NGINX} is missing (run .ci/nginx-up, or apt-get install nginx "
                    "libnginx-mod-http-dav-ext)")


@pytest.fixture(autouse=True)
def _no_cache_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's own cache settings must not reach the engines these tests make."""
    for name in list(os.environ):
        if name.startswith("HEFBUILD_REMOTE") or name in ("HEFBUILD_SIGNING_KEY",
                                                         "HEFBUILD_TRUSTED_KEYS"):
            monkeypatch.delenv(name)


@pytest.fixture
def make_cache(tmp_path: Path) -> Iterator[Callable[..., NginxCache]]:
    """make_cache(**NginxCache options) -> a started NginxCache; all stopped after the test."""
    require_nginx()
    made: list[NginxCache] = []

    def make(**options: object) -> NginxCache:
        options.setdefault("root", tmp_path / f"nginx-{len(made)}")
        cache = NginxCache(**options)  # type: ignore[arg-type]
        made.append(cache)
        return cache.start()

    try:
        yield make
    finally:
        errors = []
        for cache in made:
            try:
                cache.stop()
            except Exception as exc:  # stop the others regardless
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture
def nginx_cache(make_cache: Callable[..., NginxCache]) -> NginxCache:
    """A started NginxCache with no auth and no injected failures."""
    return make_cache()


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    """A started SilentServer: accepts connections on 127.0.0.1 and never answers."""
    with SilentServer() as server:
        yield server


@pytest.fixture
def tls(tmp_path: Path) -> tuple[ssl.SSLContext, Path]:
    """A server context with a self-signed certificate for 127.0.0.1, and the certificate."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context, cert
