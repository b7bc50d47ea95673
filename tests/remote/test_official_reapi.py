"""Every entry hefbuild writes decodes with protobuf tooling: the REAPI classes generated from
the official remote_execution.proto (as BuildGrid ships them), and hefbuild's own
signature.proto compiled here by protoc. A JSON view of an entry (as bazel-remote's web view
gives) resolves the signature's Any; timestamps are whole nanoseconds; the worker is not
the machine's hostname unless the project names one."""

from __future__ import annotations

import base64
import importlib.util
import json
import socket
from pathlib import Path
from types import ModuleType

import pytest
from fakes.fake_executor import FakeExecutor

from hefbuild.remote.signing import generate, signed_text

from .helpers import MODEL, TASKS, cache_toml, engine, make_project, run_all

PROTO = Path(__file__).resolve().parents[2] / "src" / "hefbuild" / "remote" / "signature.proto"


@pytest.fixture(scope="module")
def reapi() -> ModuleType:
    return pytest.importorskip(
        "buildgrid._protos.build.bazel.remote.execution.v2.remote_execution_pb2")


@pytest.fixture(scope="module")
def signature_pb2(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    protoc = pytest.importorskip("grpc_tools.protoc")
    out = tmp_path_factory.mktemp("signature_pb2")
    assert protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={out}",
                        PROTO.name]) == 0
    spec = importlib.util.spec_from_file_location("signature_pb2", out / "signature_pb2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_signed(tmp_path: Path, url: str, extra: str = "") -> tuple[Path, str]:
    public = generate("ci-2026", tmp_path / "ci.secret")
    settings = cache_toml(url, upload=True,
                          extra=f'signing_key = "{tmp_path / "ci.secret"}"\n{extra}')
    root = make_project(tmp_path / "ci", settings)
    assert run_all(engine(root, tmp_path / "store", FakeExecutor())) == ["built"] * len(TASKS)
    return root, public


def manifest(root: Path, stage: str) -> dict:
    return json.loads((root / "build" / MODEL / stage / "manifest.json").read_text())


def test_entries_decode_with_the_official_classes_and_the_signature_unpacks(
        tmp_path, make_cache, reapi, signature_pb2):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from google.protobuf import json_format

    server = make_cache()
    root, public = build_signed(tmp_path, server.url)
    key_bytes = base64.b64decode(public.partition(":")[2])
    for stage in ("fetch", "quantize", "verify"):
        m = manifest(root, stage)
        entry = reapi.ActionResult.FromString(server.ac_path(m["key"]).read_bytes())
        record = next(f.digest for f in entry.output_files if f.path == ".hefbuild/record.json")
        meta = entry.execution_metadata
        assert meta.worker == "hefbuild" and meta.worker != socket.gethostname()
        (signed,) = meta.auxiliary_metadata
        assert signed.type_url == "type.googleapis.com/hefbuild.v1.Signature"
        assert signed.Is(signature_pb2.Signature.DESCRIPTOR)
        sig = signature_pb2.Signature()
        assert signed.Unpack(sig)
        assert sig.key_name == "ci-2026" and len(sig.signature) == 64
        Ed25519PublicKey.from_public_bytes(key_bytes).verify(  # raises if it does not hold
            sig.signature, signed_text(m["key"], record.hash))
        view = json.loads(json_format.MessageToJson(entry))  # resolves the Any by its type
        assert view["executionMetadata"]["auxiliaryMetadata"][0]["keyName"] == "ci-2026"
        start, end = meta.execution_start_timestamp, meta.execution_completed_timestamp
        took_ns = (end.seconds - start.seconds) * 10**9 + end.nanos - start.nanos
        assert took_ns == round(m["build_seconds"] * 1000) * 10**6  # exact, no float drift
        assert end.nanos % 10**6 == 0  # the record keeps milliseconds: nothing invented


def test_the_worker_name_is_the_projects_choice(tmp_path, make_cache, reapi):
    server = make_cache()
    root, _ = build_signed(tmp_path, server.url, extra='worker = "ci-runner-7"\n')
    entry = reapi.ActionResult.FromString(
        server.ac_path(manifest(root, "export")["key"]).read_bytes())
    assert entry.execution_metadata.worker == "ci-runner-7"
