"""Protobuf classes compiled at test time from `tests/remote/reapi_subset.proto`, an excerpt
of the public remote_execution.proto: a parser of ActionResult independent of hefbuild's."""

from __future__ import annotations

import importlib.resources
import importlib.util
from pathlib import Path
from types import ModuleType

PROTO_DIR = Path(__file__).resolve().parents[1] / "remote"
PACKAGE = "package build.bazel.remote.execution.v2;"
OWN_PACKAGE = "package hefbuild_tests.reapi_subset;"


def compile_reapi_subset(out: Path) -> ModuleType:
    from grpc_tools import protoc

    include = importlib.resources.files("grpc_tools") / "_proto"
    out.mkdir(parents=True, exist_ok=True)
    # Compiled under a package of its own: the official classes (BuildGrid's, which the gRPC
    # transport loads) may already hold build.bazel.remote.execution.v2.* in this process's
    # descriptor pool, and a second Digest there is refused. The package is not on the wire.
    source = (PROTO_DIR / "reapi_subset.proto").read_text()
    assert PACKAGE in source
    (out / "proto").mkdir(exist_ok=True)
    (out / "proto" / "reapi_subset.proto").write_text(source.replace(PACKAGE, OWN_PACKAGE))
    args = ["protoc", f"-I{out / 'proto'}", f"-I{include}", f"--python_out={out}",
            "reapi_subset.proto"]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed on reapi_subset.proto")
    spec = importlib.util.spec_from_file_location("reapi_subset_pb2", out / "reapi_subset_pb2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
