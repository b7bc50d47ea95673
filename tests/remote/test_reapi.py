"""The hand-written REAPI ActionResult codec: round trips, unknown fields, malformed input."""

from __future__ import annotations

import contextlib
import random

import pytest

from hefbuild.remote.reapi import (
    ActionResultMessage,
    BlobRef,
    Metadata,
    OutputEntry,
    ReapiDecodeError,
    decode_action_result,
    encode_action_result,
)

A, B, C = "a" * 64, "0123456789abcdef" * 4, "f" * 64
EMPTY_SHA = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def varint(n: int) -> bytes:
    """An independent encoder for hand-crafted test bytes."""
    n &= (1 << 64) - 1
    out = b""
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([low])
        out += bytes([low | 0x80])


def field(number: int, wire: int, payload: bytes | int) -> bytes:
    if wire == 0:
        return varint(number << 3) + varint(int(payload))
    if wire == 2:
        return varint(number << 3 | 2) + varint(len(payload)) + payload
    return varint(number << 3 | wire) + payload  # fixed64 / fixed32: payload is the raw bytes


def digest(hash_: str, size: int) -> bytes:
    return field(1, 2, hash_.encode()) + (field(2, 0, size) if size else b"")


FULL = ActionResultMessage(
    output_files=(
        OutputEntry("bazel-out/model.hef", BlobRef(A, 123_456_789), is_executable=False),
        OutputEntry("bin/run.sh", BlobRef(B, 42), is_executable=True),
        OutputEntry("empty", BlobRef(EMPTY_SHA, 0)),
    ),
    exit_code=3,
    stdout=BlobRef(C, 17),
    worker="hefbuild@host-1",
    worker_start=1_700_000_000_250_000_000,
    worker_completed=1_700_000_012_123_456_789,
    execution_start=1_700_000_001_000_000_000,
    execution_completed=1_700_000_011_999_999_999,
    auxiliary=(Metadata("type.googleapis.com/hefbuild.Stats", b"\x00\xff\x80binary\n"),),
)

MESSAGES = [
    ActionResultMessage(()),
    ActionResultMessage((), exit_code=-1),
    ActionResultMessage((), exit_code=-(1 << 31)),
    ActionResultMessage((), exit_code=(1 << 31) - 1),
    ActionResultMessage(tuple(OutputEntry(f"out/{i:04d}.bin", BlobRef(B, i)) for i in range(500))),
    ActionResultMessage((), auxiliary=(Metadata("t", b""), Metadata("", bytes(range(256))))),
    ActionResultMessage((), worker_start=0, execution_completed=-1_500_000_000),
    ActionResultMessage((OutputEntry("ünïcödé/ファイル", BlobRef(A, (1 << 63) - 1), True),)),
    FULL,
]


@pytest.mark.parametrize("msg", MESSAGES, ids=range(len(MESSAGES)))
def test_round_trip(msg: ActionResultMessage) -> None:
    assert decode_action_result(encode_action_result(msg)) == msg


def test_defaults_are_omitted() -> None:
    assert encode_action_result(ActionResultMessage(())) == b""
    assert decode_action_result(b"") == ActionResultMessage(())
    assert encode_action_result(ActionResultMessage((), exit_code=1)) == b"\x20\x01"


def test_known_bytes() -> None:
    msg = ActionResultMessage((OutputEntry("a", BlobRef(A, 5), True),), exit_code=-1)
    entry = field(1, 2, b"a") + field(2, 2, digest(A, 5)) + field(4, 0, 1)
    assert encode_action_result(msg) == field(2, 2, entry) + b"\x20" + b"\xff" * 9 + b"\x01"


def test_timestamp_split() -> None:
    def stamp(ns: int) -> bytes:
        data = encode_action_result(ActionResultMessage((), worker_start=ns))
        return data[4:]  # 0x4a len 0x1a len: execution_metadata { worker_start_timestamp {...} }

    assert stamp(1_500_000_000) == field(1, 0, 1) + field(2, 0, 500_000_000)
    assert stamp(-1_500_000_000) == field(1, 0, -2) + field(2, 0, 500_000_000)
    assert stamp(0) == b""
    assert stamp(999_999_999) == field(2, 0, 999_999_999)
    assert stamp(1_000_000_000) == field(1, 0, 1)


@pytest.mark.parametrize(
    "t", [1_700_000_000_123_456_789, 1_700_000_000_999_999_999, 1, -1, -1_000_000,
          2_000_000_000_000_000_001]
)
def test_nanosecond_timestamps_round_trip_exactly(t: int) -> None:
    msg = ActionResultMessage((), worker_completed=t, execution_start=t)
    assert decode_action_result(encode_action_result(msg)) == msg


def test_unknown_fields_of_every_wire_type_are_skipped() -> None:
    unknown = field(99, 0, 7) + field(98, 1, b"\x01" * 8) + field(97, 2, b"junk")
    unknown += field(96, 5, b"\x02" * 4)
    big_unknown = field(536_870_911, 0, -1)  # the largest field number, with a 10-byte varint
    entry = unknown + field(1, 2, b"p") + field(2, 2, unknown + digest(A, 9)) + field(5, 2, b"inl")
    meta = (
        field(1, 2, b"w")
        + field(2, 2, field(1, 0, 5))  # queued_timestamp: ignored
        + field(3, 2, unknown + field(1, 0, 10) + field(2, 0, 500_000_000))
        + field(11, 2, unknown + field(1, 2, b"url") + field(2, 2, b"\x00"))
        + unknown
    )
    data = b"".join(
        [
            unknown,
            field(2, 2, entry),
            field(3, 2, field(1, 2, b"dir") + field(3, 2, digest(B, 1))),  # output_directories
            field(4, 0, 2),
            field(5, 2, b"stdout inline"),
            field(6, 2, digest(C, 3)),
            field(7, 2, b"stderr inline"),
            field(8, 2, digest(B, 4)),
            field(9, 2, meta),
            field(12, 2, field(1, 2, b"link") + field(2, 2, b"target")),  # output_symlinks
            big_unknown,
        ]
    )
    assert decode_action_result(data) == ActionResultMessage(
        output_files=(OutputEntry("p", BlobRef(A, 9)),),
        exit_code=2,
        stdout=BlobRef(C, 3),
        worker="w",
        worker_start=10_500_000_000,
        auxiliary=(Metadata("url", b"\x00"),),
    )


def test_repeated_scalars_last_wins_and_sub_messages_merge() -> None:
    data = field(4, 0, 1) + field(6, 2, digest(A, 1)) + field(4, 0, 7) + field(6, 2, field(2, 0, 9))
    assert decode_action_result(data) == ActionResultMessage((), exit_code=7, stdout=BlobRef(A, 9))


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x20", id="truncated-varint-value"),
        pytest.param(b"\x20\x80", id="truncated-varint-continuation"),
        pytest.param(b"\xa0", id="truncated-key"),
        pytest.param(b"\x20" + b"\xff" * 10 + b"\x01", id="varint-11-bytes"),
        pytest.param(b"\x12\x05ab", id="length-past-end"),
        pytest.param(b"\x12" + b"\xff" * 9 + b"\x01", id="huge-length"),
        pytest.param(field(90, 1, b"\x00" * 7), id="truncated-fixed64"),
        pytest.param(field(90, 5, b"\x00" * 3), id="truncated-fixed32"),
        pytest.param(b"\x00\x00", id="field-zero"),
        pytest.param(b"\x0b", id="start-group"),
        pytest.param(b"\x0c", id="end-group"),
        pytest.param(b"\x0e", id="wire-type-6"),
        pytest.param(field(4, 2, b""), id="exit-code-as-bytes"),
        pytest.param(field(2, 0, 1), id="output-file-as-varint"),
        pytest.param(field(9, 5, b"\x00" * 4), id="metadata-as-fixed32"),
        pytest.param(field(6, 2, field(1, 0, 1)), id="digest-hash-as-varint"),
        pytest.param(field(6, 2, digest(A.upper(), 1)), id="uppercase-hex"),
        pytest.param(field(6, 2, digest(A[:63], 1)), id="short-hex"),
        pytest.param(field(6, 2, digest("g" * 64, 1)), id="non-hex"),
        pytest.param(field(6, 2, b""), id="empty-digest"),
        pytest.param(field(6, 2, digest(A, -1)), id="negative-size"),
        pytest.param(field(2, 2, field(1, 2, b"p")), id="output-file-without-digest"),
        pytest.param(field(2, 2, field(1, 2, b"\xff") + field(2, 2, digest(A, 1))), id="bad-utf8"),
        pytest.param(field(9, 2, field(3, 2, field(2, 0, 10**9))), id="nanos-too-big"),
        pytest.param(field(9, 2, field(3, 2, field(2, 0, -1))), id="nanos-negative"),
        pytest.param(field(9, 2, field(11, 2, b"\x0a\x05ab")), id="truncated-any"),
    ],
)
def test_malformed_input_raises(data: bytes) -> None:
    with pytest.raises(ReapiDecodeError):
        decode_action_result(data)


def test_every_truncation_decodes_or_raises_decode_error() -> None:
    data = encode_action_result(FULL)
    for n in range(len(data)):
        with contextlib.suppress(ReapiDecodeError):
            decode_action_result(data[:n])


def test_random_corruption_decodes_or_raises_decode_error() -> None:
    data = bytearray(encode_action_result(FULL))
    rng = random.Random(20240611)
    for _ in range(3000):
        bad = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        with contextlib.suppress(ReapiDecodeError):
            decode_action_result(bytes(bad))


def test_decode_error_is_a_value_error() -> None:
    assert issubclass(ReapiDecodeError, ValueError)


def test_invalid_messages_cannot_be_built() -> None:
    with pytest.raises(ValueError):
        BlobRef(A.upper(), 1)
    with pytest.raises(ValueError):
        BlobRef(A, -1)
    with pytest.raises(ValueError):
        ActionResultMessage((), exit_code=1 << 31)
