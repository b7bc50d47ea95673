"""Every entry hefbuild writes decodes with protobuf tooling: the REAPI classes generated from
the official remote_execution.proto (as BuildGrid ships them), and hefbuild's own
signature.proto compiled here by protoc. A JSON view of an entry (as bazel-remote's web view
gives) resolves the signature's Any; timestamps are whole nanoseconds; the worker is not
the machine's hostname unless the project names one."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from fakes.fake_executor import FakeExecutor

from hefbuild.remote.signing import generate, signed_text

from .helpers import MODEL, TASKS, cache_toml, engine, make_project, run_all

PROTO = Path(__file__).resolve().parents[2] / "src" / "hefbuild" / "remote" / "signature.proto"


# Run apart: the excerpt test compiles the same package into this process's descriptor pool.
DECODE = """
import importlib.util, json, sys
from google.protobuf import json_format
from buildgrid._protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as reapi
spec = importlib.util.spec_from_file_location("signature_pb2", sys.argv[1])
signature_pb2 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(signature_pb2)
out = []
for path in sys.argv[2:]:
    entry = reapi.ActionResult.FromString(open(path, "rb").read())
    meta = entry.execution_metadata
    sigs = []
    for any_ in meta.auxiliary_metadata:
        sig = signature_pb2.Signature()
        sigs.append({"type_url": any_.type_url, "is": any_.Is(signature_pb2.Signature.DESCRIPTOR),
                     "unpacked": any_.Unpack(sig), "key_name": sig.key_name,
                     "signature": sig.signature.hex()})
    stamp = lambda t: [t.seconds, t.nanos]
    out.append({"record": next(f.digest.hash for f in entry.output_files
                               if f.path == ".hefbuild/record.json"),
                "worker": meta.worker, "signatures": sigs,
                "start": stamp(meta.execution_start_timestamp),
                "end": stamp(meta.execution_completed_timestamp),
                "json": json.loads(json_format.MessageToJson(entry))})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def signature_pb2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("buildgrid._protos")
    protoc = pytest.importorskip("grpc_tools.protoc")
    out = tmp_path_factory.mktemp("signature_pb2")
    assert protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={out}",
                        PROTO.name]) == 0
    return out / "signature_pb2.py"


def decoded(signature_pb2: Path, *entries: Path) -> list[dict]:
    done = subprocess.run([sys.executable, "-c", DECODE, str(signature_pb2),
                           *map(str, entries)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


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
        tmp_path, make_cache, signature_pb2):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    server = make_cache()
    root, public = build_signed(tmp_path, server.url)
    key_bytes = base64.b64decode(public.partition(":")[2])
    manifests = [manifest(root, stage) for stage in ("fetch", "quantize", "verify")]
    views = decoded(signature_pb2, *(server.ac_path(m["key"]) for m in manifests))
    for m, view in zip(manifests, views, strict=True):
        assert view["worker"] == "hefbuild" and view["worker"] != socket.gethostname()
        (sig,) = view["signatures"]
        assert sig["type_url"] == "type.googleapis.com/hefbuild.v1.Signature"
        assert sig["is"] and sig["unpacked"] and sig["key_name"] == "ci-2026"
        Ed25519PublicKey.from_public_bytes(key_bytes).verify(  # raises if it does not hold
            bytes.fromhex(sig["signature"]), signed_text(m["key"], view["record"]))
        # The JSON view resolves the Any by its type: a field of hefbuild's own message.
        assert view["json"]["executionMetadata"]["auxiliaryMetadata"][0]["keyName"] == "ci-2026"
        (s0, n0), (s1, n1) = view["start"], view["end"]
        took_ns = (s1 - s0) * 10**9 + n1 - n0
        assert took_ns == round(m["build_seconds"] * 1000) * 10**6  # exact, no float drift
        assert n1 % 10**6 == 0  # the record keeps milliseconds: nothing invented


def test_the_worker_name_is_the_projects_choice(tmp_path, make_cache, signature_pb2):
    server = make_cache()
    root, _ = build_signed(tmp_path, server.url, extra='worker = "ci-runner-7"\n')
    (view,) = decoded(signature_pb2, server.ac_path(manifest(root, "export")["key"]))
    assert view["worker"] == "ci-runner-7"
