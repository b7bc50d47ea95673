"""Cross-checks hefbuild.remote.reapi against protobuf's own codec for remote_execution.proto.

`reapi_subset.proto` is compiled with grpc_tools.protoc at test time; the generated classes are an
independent encoder and parser, so agreeing with them byte for byte proves the wire format.
"""

from __future__ import annotations

import random
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fakes.reapi_proto import compile_reapi_subset

from hefbuild.remote.reapi import (
    ActionResultMessage,
    BlobRef,
    Metadata,
    OutputEntry,
    decode_action_result,
    encode_action_result,
)

pytest.importorskip("grpc_tools.protoc")

HERE = Path(__file__).parent
A, B, C = "a" * 64, "0123456789abcdef" * 4, "f" * 64
TIMES = {
    "worker_start": "worker_start_timestamp",
    "worker_completed": "worker_completed_timestamp",
    "execution_start": "execution_start_timestamp",
    "execution_completed": "execution_completed_timestamp",
}


@pytest.fixture(scope="module")
def pb(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return compile_reapi_subset(tmp_path_factory.mktemp("reapi_pb2"))


def split(ns: int) -> tuple[int, int]:
    """A Timestamp's seconds and nanos (0 <= nanos < 1e9, also before the epoch)."""
    return divmod(ns, 1_000_000_000)


def to_pb(pb: ModuleType, msg: ActionResultMessage) -> Any:
    """The same content, built with the generated classes."""
    out = pb.ActionResult(exit_code=msg.exit_code)
    for f in msg.output_files:
        digest = pb.Digest(hash=f.blob.hash, size_bytes=f.blob.size)
        out.output_files.add(path=f.path, digest=digest, is_executable=f.is_executable)
    if msg.stdout is not None:
        out.stdout_digest.CopyFrom(pb.Digest(hash=msg.stdout.hash, size_bytes=msg.stdout.size))
    meta = out.execution_metadata
    if msg.worker:
        meta.worker = msg.worker
    for ours, theirs in TIMES.items():
        t = getattr(msg, ours)
        if t is not None:
            stamp = getattr(meta, theirs)
            stamp.SetInParent()
            stamp.seconds, stamp.nanos = split(t)
    for a in msg.auxiliary:
        meta.auxiliary_metadata.add(type_url=a.type_url, value=a.value)
    return out


FULL = ActionResultMessage(
    output_files=(
        OutputEntry("bazel-out/model.hef", BlobRef(A, 123_456_789)),
        OutputEntry("bin/run.sh", BlobRef(B, 42), is_executable=True),
        OutputEntry("empty", BlobRef(C, 0)),
    ),
    exit_code=3,
    stdout=BlobRef(C, 17),
    worker="hefbuild@host-1",
    worker_start=1_700_000_000_250_000_000,
    worker_completed=1_700_000_012_500_000_001,
    execution_start=1_700_000_001_000_000_000,
    execution_completed=1_700_000_011_750_000_000,
    auxiliary=(Metadata("type.googleapis.com/hefbuild.Stats", b"\x00\xff\x80binary\n"),),
)

MESSAGES = [
    ActionResultMessage(()),
    ActionResultMessage((), exit_code=-1),
    ActionResultMessage((), exit_code=-(1 << 31)),
    ActionResultMessage((), exit_code=(1 << 31) - 1),
    ActionResultMessage(tuple(OutputEntry(f"out/{i:04d}.bin", BlobRef(B, i)) for i in range(300))),
    ActionResultMessage((), auxiliary=(Metadata("t", b""), Metadata("", bytes(range(256))))),
    ActionResultMessage((), worker_start=0),
    ActionResultMessage((), execution_completed=-1_500_000_000, worker="w"),
    ActionResultMessage((OutputEntry("ünïcödé/ファイル", BlobRef(A, (1 << 63) - 1), True),)),
    ActionResultMessage((OutputEntry("", BlobRef(A, 0)),), stdout=BlobRef(B, 0)),
    FULL,
]


def test_our_encoding_parses_with_protobuf(pb: ModuleType) -> None:
    data = encode_action_result(FULL)
    parsed = pb.ActionResult.FromString(data)
    assert [
        (f.path, f.digest.hash, f.digest.size_bytes, f.is_executable) for f in parsed.output_files
    ] == [(f.path, f.blob.hash, f.blob.size, f.is_executable) for f in FULL.output_files]
    assert parsed.exit_code == 3
    assert (parsed.stdout_digest.hash, parsed.stdout_digest.size_bytes) == (C, 17)
    assert not parsed.HasField("stderr_digest") and not parsed.output_directories
    meta = parsed.execution_metadata
    assert meta.worker == "hefbuild@host-1"
    for ours, theirs in TIMES.items():
        stamp = getattr(meta, theirs)
        assert (stamp.seconds, stamp.nanos) == split(getattr(FULL, ours))
    assert not meta.HasField("queued_timestamp")
    assert [(a.type_url, a.value) for a in meta.auxiliary_metadata] == [
        ("type.googleapis.com/hefbuild.Stats", b"\x00\xff\x80binary\n")
    ]
    assert parsed.SerializeToString(deterministic=True) == data  # nothing unknown or left over


def test_timestamps_keep_every_nanosecond(pb: ModuleType) -> None:
    ns = 1_700_000_000_123_456_789  # a float of seconds near 1.7e9 holds only ~0.24 us
    parsed = pb.ActionResult.FromString(
        encode_action_result(ActionResultMessage((), worker_start=ns))
    )
    stamp = parsed.execution_metadata.worker_start_timestamp
    assert (stamp.seconds, stamp.nanos) == (1_700_000_000, 123_456_789)
    negative = encode_action_result(ActionResultMessage((), worker_start=-250_000_000))
    stamp = pb.ActionResult.FromString(negative).execution_metadata.worker_start_timestamp
    assert (stamp.seconds, stamp.nanos) == (-1, 750_000_000)


@pytest.mark.parametrize("msg", MESSAGES, ids=range(len(MESSAGES)))
def test_encoding_equals_deterministic_serialization(
    pb: ModuleType, msg: ActionResultMessage
) -> None:
    expected = to_pb(pb, msg).SerializeToString(deterministic=True)
    assert encode_action_result(msg) == expected
    assert decode_action_result(expected) == msg


def test_messages_from_protobuf_decode_ignoring_unsupported_fields(pb: ModuleType) -> None:
    msg = to_pb(pb, FULL)
    msg.output_files[0].contents = b"inlined"
    msg.output_directories.add(path="dir", tree_digest=pb.Digest(hash=B, size_bytes=9))
    msg.output_directories[0].is_topologically_sorted = True
    msg.output_symlinks.add(path="link", target="dir/file")
    msg.output_file_symlinks.add(path="old", target="style")
    msg.output_directory_symlinks.add(path="older", target="style")
    msg.stdout_raw = b"hello\n"
    msg.stderr_raw = b"oops\n"
    msg.stderr_digest.CopyFrom(pb.Digest(hash=A, size_bytes=5))
    meta = msg.execution_metadata
    for name in (
        "queued_timestamp",
        "input_fetch_start_timestamp",
        "output_upload_start_timestamp",
    ):
        getattr(meta, name).seconds = 1_699_999_999
    meta.output_upload_completed_timestamp.nanos = 7
    meta.input_fetch_completed_timestamp.SetInParent()
    assert decode_action_result(msg.SerializeToString()) == FULL


def test_messages_from_protobuf_decode(pb: ModuleType) -> None:
    msg = pb.ActionResult(exit_code=-7)
    msg.output_files.add(path="a", digest=pb.Digest(hash=A), is_executable=True)
    msg.execution_metadata.worker_completed_timestamp.SetInParent()
    msg.execution_metadata.execution_start_timestamp.nanos = 500_000_000
    msg.execution_metadata.auxiliary_metadata.add(value=b"\x01")
    assert decode_action_result(msg.SerializeToString()) == ActionResultMessage(
        output_files=(OutputEntry("a", BlobRef(A, 0), is_executable=True),),
        exit_code=-7,
        worker_completed=0,
        execution_start=500_000_000,
        auxiliary=(Metadata("", b"\x01"),),
    )


def test_concatenated_messages_merge_like_protobuf(pb: ModuleType) -> None:
    first = to_pb(pb, FULL).SerializeToString()
    second = ActionResultMessage(
        (OutputEntry("more", BlobRef(B, 1)),),
        exit_code=9,
        stdout=BlobRef(A, 0),  # size 0 is not written: size 17 survives the merge
        worker_completed=1_800_000_000_500_000_000,
    )
    data = first + encode_action_result(second)
    ours = to_pb(pb, decode_action_result(data)).SerializeToString(deterministic=True)
    assert ours == pb.ActionResult.FromString(data).SerializeToString(deterministic=True)


def random_message(rng: random.Random) -> ActionResultMessage:
    def blob() -> BlobRef:
        return BlobRef("".join(rng.choices("0123456789abcdef", k=64)), rng.choice([0, 1, 2**40]))

    def stamp() -> int | None:
        seconds, nanos = rng.randint(-(2**31), 2**33), rng.randint(0, 10**9 - 1)
        return rng.choice([None, 0, seconds * 10**9 + nanos])

    return ActionResultMessage(
        output_files=tuple(
            OutputEntry(f"p/{rng.random()}", blob(), rng.random() < 0.5)
            for _ in range(rng.randint(0, 5))
        ),
        exit_code=rng.choice([0, 1, -1, rng.randint(-(2**31), 2**31 - 1)]),
        stdout=rng.choice([None, blob()]),
        worker=rng.choice(["", "worker-ü"]),
        worker_start=stamp(),
        worker_completed=stamp(),
        execution_start=stamp(),
        execution_completed=stamp(),
        auxiliary=tuple(
            Metadata(rng.choice(["", "type/x"]), rng.randbytes(rng.randint(0, 8)))
            for _ in range(rng.randint(0, 2))
        ),
    )


def test_random_messages_agree_with_protobuf(pb: ModuleType) -> None:
    rng = random.Random(7)
    for _ in range(300):
        msg = random_message(rng)
        expected = to_pb(pb, msg).SerializeToString(deterministic=True)
        assert encode_action_result(msg) == expected
        assert decode_action_result(expected) == msg
