"""The gRPC Remote APIs (REAPI v2) as the remote cache: a real BuildGrid server (`bgd`, one
for the module, an instance per test) as the third-party server, and a small server double
in this process (fakes/grpc_cache.py) that lies, demands a bearer token or speaks TLS.

Rules are the FakeExecutor's, so what ran is exactly `fake.ran`.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("grpc")
pytest.importorskip("buildgrid._protos")

from fakes.buildgrid_server import BuildGridServer  # noqa: E402
from fakes.fake_executor import FakeExecutor  # noqa: E402
from fakes.grpc_cache import GrpcCache  # noqa: E402

from hefbuild.declare.settings import CacheSettings, Credentials, load_settings  # noqa: E402
from hefbuild.errors import SpecError  # noqa: E402
from hefbuild.remote import grpc_transport  # noqa: E402
from hefbuild.remote.problems import CorruptSource, Problem, RemoteError  # noqa: E402
from hefbuild.remote.reapi import decode_action_result, encode_action_result  # noqa: E402
from hefbuild.remote.signing import generate  # noqa: E402
from hefbuild.remote.transport import transport_for  # noqa: E402

from .helpers import MODEL, TASKS, cache_toml, engine, make_project, run_all  # noqa: E402

INSTANCES = ("restore", "large", "stream", "entry")  # not "blobs": a resource name part
TOKEN = "s3cr3t-T0KEN.value"
SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def buildgrid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuildGridServer]:
    with BuildGridServer(tmp_path_factory.mktemp("bgd"), INSTANCES) as server:
        yield server


@pytest.fixture
def double() -> Iterator[GrpcCache]:
    with GrpcCache() as server:
        yield server


class Machines:
    """Clones of the tiny project, each with its own store, all on one cache URL."""

    def __init__(self, root: Path, url: str) -> None:
        self.root, self.url, self.made = root, url, 0

    def __call__(self, upload: bool = False, extra: str = ""):  # noqa: ANN204
        self.made += 1
        where = self.root / f"m{self.made}"
        proj = make_project(where / "proj", cache_toml(self.url, upload=upload, extra=extra))
        fake = FakeExecutor()
        return engine(proj, where / "store", fake), fake


def outputs(eng) -> dict[str, bytes]:  # noqa: ANN001
    build = eng.paths.root / "build" / MODEL
    return {str(p.relative_to(build)): p.read_bytes() for p in sorted(build.rglob("*"))
            if p.is_file() and p.name != "manifest.json"}


def digest_of(eng, stage: str) -> str:  # noqa: ANN001
    """The digest of the stage's first output."""
    import json

    manifest = json.loads((eng.paths.root / "build" / MODEL / stage / "manifest.json")
                          .read_text())
    return sorted(o["digest"] for o in manifest["outputs"].values())[0]


# -- a real BuildGrid --------------------------------------------------------------------


def test_a_fresh_clone_restores_everything_from_buildgrid(buildgrid, tmp_path):
    machine = Machines(tmp_path, buildgrid.url("restore"))
    ci, _ = machine(upload=True)
    assert run_all(ci) == ["built"] * len(TASKS)
    assert ci.warnings == [] and ci.remote.sent > 0
    dev, fake = machine()
    results = [dev.run(task) for task in TASKS]
    assert [r["outcome"] for r in results] == ["remote"] * len(TASKS), dev.warnings
    assert fake.ran == [] and dev.warnings == []
    assert all(r["bytes"] > 0 for r in results)
    assert outputs(dev) == outputs(ci)  # byte for byte
    # Built again on another runner, same bytes: FindMissingBlobs finds all, nothing is sent.
    again, fake = machine(upload=True)
    for task in TASKS:
        again.run(task, force=True)
    assert len(fake.ran) == len(TASKS) and again.remote.sent == 0


def test_blobs_over_the_batch_limit_stream_through_bytestream_both_ways(
        buildgrid, tmp_path, monkeypatch):
    monkeypatch.setattr(grpc_transport, "BATCH_LIMIT", 64)  # every output, log and record
    monkeypatch.setattr(grpc_transport, "CHUNK", 16)  # several WriteRequests each
    streamed: dict[str, list[int]] = {"read": [], "write": []}
    read, write = grpc_transport.GrpcTransport._stream_read, \
        grpc_transport.GrpcTransport._stream_write
    monkeypatch.setattr(grpc_transport.GrpcTransport, "_stream_read", lambda self, sha, size, sink:
                        streamed["read"].append(size) or read(self, sha, size, sink))
    monkeypatch.setattr(grpc_transport.GrpcTransport, "_stream_write", lambda self, sha, p, size:
                        streamed["write"].append(size) or write(self, sha, p, size))
    machine = Machines(tmp_path, buildgrid.url("large"))
    ci, _ = machine(upload=True)
    assert run_all(ci) == ["built"] * len(TASKS) and ci.warnings == []
    dev, fake = machine()
    assert run_all(dev) == ["remote"] * len(TASKS) and fake.ran == []
    assert outputs(dev) == outputs(ci)
    assert streamed["write"] and min(streamed["write"]) > 64
    assert sorted(streamed["read"]) == sorted(streamed["write"])  # each blob, back the same way


def test_a_large_file_streams_in_chunks_and_never_whole(buildgrid, tmp_path):
    transport = transport_for(CacheSettings(buildgrid.url("stream")))
    data = os.urandom(3 * grpc_transport.CHUNK + 5)
    sha = hashlib.sha256(data).hexdigest()
    (tmp_path / "big").write_bytes(data)
    assert transport.missing([(sha, len(data))]) == {sha}
    assert transport.put(f"cas/{sha}", tmp_path / "big", sha) == len(data)
    assert transport.missing([(sha, len(data))]) == set()
    chunks: list[int] = []
    got = hashlib.sha256()
    assert transport.get(f"cas/{sha}", lambda c: (chunks.append(len(c)), got.update(c)),
                         len(data)) == len(data)
    assert got.hexdigest() == sha
    assert len(chunks) >= 3 and max(chunks) <= 4 << 20  # chunk by chunk into the sink
    assert transport.get(f"cas/{'0' * 64}", lambda c: None, 10) is None  # absent: None


def test_an_action_result_goes_out_and_comes_back_as_the_codecs_bytes(buildgrid, double,
                                                                        tmp_path):
    machine = Machines(tmp_path, double.url)
    ci, _ = machine(upload=True)
    run_all(ci)
    assert len(double.updates) == len(TASKS)
    for update in double.updates:  # what the transport sent is what reapi.py encoded
        raw = update.action_result.SerializeToString(deterministic=True)
        assert encode_action_result(decode_action_result(raw)) == raw
        assert update.action_digest.size_bytes == grpc_transport.AC_SIZE_BYTES
        assert update.instance_name == "main"
    # Through BuildGrid: the bytes read back equal the bytes put, byte for byte.
    transport = transport_for(CacheSettings(buildgrid.url("entry")))
    raw = double.updates[0].action_result.SerializeToString(deterministic=True)
    for blob in [*(f.digest for f in double.updates[0].action_result.output_files),
                 double.updates[0].action_result.stdout_digest]:  # BuildGrid checks them
        transport.put(f"cas/{blob.hash}", double.blobs[blob.hash], blob.hash)
    key = double.updates[0].action_digest.hash
    transport.put(f"ac/{key}", raw)
    back: list[bytes] = []
    assert transport.get(f"ac/{key}", back.append, 1 << 20) == len(raw)
    assert back == [raw]


def test_a_corrupt_local_file_is_never_committed_by_bytestream(double, tmp_path, monkeypatch):
    monkeypatch.setattr(grpc_transport, "BATCH_LIMIT", 64)
    monkeypatch.setattr(grpc_transport, "CHUNK", 16)
    transport = transport_for(CacheSettings(double.url))
    good = b"the bytes this blob is named after, a few chunks long" * 3
    sha = hashlib.sha256(good).hexdigest()
    (tmp_path / "blob").write_bytes(good[:-1] + b"!")  # bit rot since it was stored
    with pytest.raises(CorruptSource):
        transport.put(f"cas/{sha}", tmp_path / "blob", sha)
    assert sha not in double.blobs  # cancelled before its last chunk (finish_write)
    (tmp_path / "blob").write_bytes(good)
    assert transport.put(f"cas/{sha}", tmp_path / "blob", sha) == len(good)
    assert double.blobs[sha] == good


def test_a_server_slower_than_the_timeout_is_cut_off(double):
    double.delay_s = 1.5
    transport = transport_for(CacheSettings(double.url, timeout_s=0.3))
    with pytest.raises(RemoteError) as err:
        transport.get(f"ac/{'a' * 64}", lambda c: None, 100)
    assert err.value.problem is Problem.TIMEOUT and "no answer within 0.3 s" in str(err.value)


def test_generic_code_never_imports_grpc():
    code = ("import sys, hefbuild.engine.engine, hefbuild.remote.cache, hefbuild.cli.main; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'buildgrid', "
            "'google')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": SRC})
    assert out.stdout.strip() == "[]"


# -- a server that lies ------------------------------------------------------------------


@pytest.mark.parametrize("lie", ["wrong bytes", "shorter", "longer", "missing"])
def test_a_lying_server_is_never_trusted_and_the_stage_builds_locally(double, tmp_path, lie):
    machine = Machines(tmp_path, double.url)
    ci, _ = machine(upload=True)
    run_all(ci)
    digest = digest_of(ci, "export")
    good = double.blobs[digest]
    if lie == "missing":
        double.forget(digest)  # the entry still names it
    else:
        double.lie(digest, {"wrong bytes": bytes([good[0] ^ 1]) + good[1:],
                            "shorter": good[:-3], "longer": good + b"more"}[lie])
    dev, fake = machine()
    assert run_all(dev) == ["remote", "built", "remote", "remote", "remote"]
    assert fake.ran == [f"export:{MODEL}"]
    warning = {"wrong bytes": "has wrong bytes", "shorter": f"the cache has {len(good) - 3}",
               "longer": "the cache has more", "missing": None}[lie]
    if warning is None:
        assert dev.warnings == []  # evicted: a plain miss, as over HTTP
    else:
        assert len(dev.warnings) == 1 and warning in dev.warnings[0], dev.warnings
        assert digest[:12] in dev.warnings[0] and "built locally" in dev.warnings[0]
    assert outputs(dev) == outputs(ci)  # what it built itself


def test_signing_is_checked_as_over_http(double, tmp_path):
    public = generate("ci-main", tmp_path / "ci.secret")
    generate("ci-main", tmp_path / "forged.secret")
    machine = Machines(tmp_path, double.url)
    unsigned, _ = machine(upload=True)
    run_all(unsigned)
    trusting = f'trusted_keys = ["{public}"]\n'
    reader, fake = machine(extra=trusting)
    assert run_all(reader) == ["built"] * len(TASKS)
    assert sum("is unsigned" in w for w in reader.warnings) == len(TASKS)

    double.entries.clear()
    forged, _ = machine(upload=True, extra=f'signing_key = "{tmp_path / "forged.secret"}"\n')
    run_all(forged)
    reader, _ = machine(extra=trusting)
    assert run_all(reader) == ["built"] * len(TASKS)
    assert all("not by a trusted key" in w for w in reader.warnings) and reader.warnings

    double.entries.clear()
    signed, _ = machine(upload=True, extra=f'signing_key = "{tmp_path / "ci.secret"}"\n')
    run_all(signed)
    reader, fake = machine(extra=trusting)
    assert run_all(reader) == ["remote"] * len(TASKS) and reader.warnings == []


# -- TLS and a bearer token --------------------------------------------------------------


@pytest.fixture
def tls_cache(tmp_path) -> Iterator[tuple[GrpcCache, Path]]:
    key_pem, cert_pem = self_signed()
    (tmp_path / "ca.pem").write_bytes(cert_pem)
    with GrpcCache(token=TOKEN, tls=(key_pem, cert_pem)) as server:
        yield server, tmp_path / "ca.pem"


@pytest.mark.parametrize("token", [TOKEN, "wrong-token", None])
def test_grpcs_with_a_bearer_token(tls_cache, tmp_path, monkeypatch, token):
    server, ca = tls_cache
    if token:
        monkeypatch.setenv("HEFBUILD_REMOTE_TOKEN", token)
    machine = Machines(tmp_path, server.url)
    ci, _ = machine(upload=True, extra=f'ca_bundle = "{ca}"\n')
    outcomes = run_all(ci)
    assert outcomes == ["built"] * len(TASKS)  # the build goes on either way
    if token == TOKEN:
        assert ci.warnings == [] and server.entries
        dev, fake = machine(extra=f'ca_bundle = "{ca}"\n')
        assert run_all(dev) == ["remote"] * len(TASKS) and fake.ran == []
    else:
        assert len(ci.warnings) == 1 and "not authorized" in ci.warnings[0], ci.warnings
        assert "for the rest of this run" in ci.warnings[0] and server.entries == {}
        assert len(server.calls) == 1  # then off: no more requests
    assert all(TOKEN not in w and (token or TOKEN) not in w for w in ci.warnings)
    assert set(server.auth_seen) == {f"Bearer {token}" if token else ""}


def test_grpcs_without_the_servers_ca_cannot_reach_it(tls_cache, tmp_path, monkeypatch):
    server, _ = tls_cache
    monkeypatch.setenv("HEFBUILD_REMOTE_TOKEN", TOKEN)
    eng, _ = Machines(tmp_path, server.url)()
    assert run_all(eng) == ["built"] * len(TASKS)
    assert len(eng.warnings) == 1 and "cannot be reached" in eng.warnings[0], eng.warnings
    assert TOKEN not in eng.warnings[0] and server.auth_seen == []  # never sent in clear


def test_a_refused_connection_switches_the_cache_off_once(tmp_path):
    from fakes.cache_server import free_port

    eng, fake = Machines(tmp_path, f"grpc://127.0.0.1:{free_port()}/main")()
    assert run_all(eng) == ["built"] * len(TASKS)
    assert len(eng.warnings) == 1 and "cannot be reached" in eng.warnings[0]


def self_signed() -> tuple[bytes, bytes]:
    """A key and a self-signed certificate for 127.0.0.1 (PEM), its own CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


# -- settings ----------------------------------------------------------------------------


@pytest.mark.parametrize("url,kept,instance", [
    ("grpc://127.0.0.1:9092/main", "grpc://127.0.0.1:9092/main", "main"),
    ("grpcs://cache.example.org/a/b/", "grpcs://cache.example.org/a/b", "a/b"),
    ("grpcs://cache.example.org:443", "grpcs://cache.example.org:443", ""),
])
def test_grpc_urls_are_accepted_and_name_the_instance(tmp_path, url, kept, instance):
    from hefbuild.remote.grpc_channel import GrpcChannel

    (tmp_path / "hefbuild.toml").write_text(f'[cache]\nremote = "{url}"\n')
    settings = load_settings(tmp_path, env={"HEFBUILD_REMOTE_TOKEN": TOKEN}).cache
    assert settings.remote == kept
    assert settings.credentials == Credentials(token=TOKEN) and TOKEN not in repr(settings)
    channel = GrpcChannel(settings)  # connects at its first call only
    try:
        assert channel.instance == instance
        assert channel.metadata == (("authorization", f"Bearer {TOKEN}"),)
    finally:
        channel.close()


@pytest.mark.parametrize("url", ["grpc://", "grpcs:///main", "grpc+tls://host/x"])
def test_a_grpc_url_without_a_host_is_refused_in_one_line(tmp_path, url):
    (tmp_path / "hefbuild.toml").write_text(f'[cache]\nremote = "{url}"\n')
    with pytest.raises(SpecError) as err:
        load_settings(tmp_path, env={})
    message = str(err.value)
    assert "\n" not in message and "hefbuild.toml" in message and "cache.remote" in message
    assert ("no host" in message) if "+" not in url else ("grpc(s)://" in message)


def test_a_grpc_cache_without_grpcio_says_what_to_install(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "hefbuild.remote.grpc_transport")
    monkeypatch.setitem(sys.modules, "grpc", None)  # as if grpcio were not installed
    with pytest.raises(SpecError) as err:
        transport_for(CacheSettings("grpc://127.0.0.1:1/main"))
    assert "pip install 'hefbuild[grpc]'" in str(err.value) and "\n" not in str(err.value)
