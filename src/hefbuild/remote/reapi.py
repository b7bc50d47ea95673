"""A hand-written protobuf codec for REAPI v2 `ActionResult` (remote_execution.proto).

hefbuild PUTs an encoded `build.bazel.remote.execution.v2.ActionResult` at `{cache}/ac/{key}` of
a Bazel HTTP remote cache and reads it back. The codec is written by hand, on the stdlib only,
so the engine does not depend on the `protobuf` package for one small message. Encoding follows
proto3 (defaults omitted, fields in number order), so it equals protobuf's deterministic
serialization. Decoding skips unknown fields and raises `ReapiDecodeError` on anything
malformed. Fields outside the dataclasses below (stderr, output directories, ...) are ignored.

Timestamps are integer nanoseconds since the epoch (a float loses ~240 ns at today's dates).
hefbuild's own message in `auxiliary_metadata` is `hefbuild.v1.Signature` (signature.proto
next to this file), packed in a `google.protobuf.Any` as protobuf packs it, so protobuf
tooling and JSON views of the cache can decode every entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_U64 = (1 << 64) - 1
_HEX = frozenset("0123456789abcdef")
_NANOS = 1_000_000_000


class ReapiDecodeError(ValueError):
    """Bytes that are not a valid ActionResult (truncated, malformed or out of range)."""


@dataclass(frozen=True)
class BlobRef:
    """A REAPI Digest: the sha256 of a blob in the CAS and its size."""

    hash: str
    size: int

    def __post_init__(self) -> None:
        if len(self.hash) != 64 or not set(self.hash) <= _HEX:
            raise ValueError(f"not a sha256 hex digest: {self.hash!r}")
        if not 0 <= self.size < 1 << 63:
            raise ValueError(f"blob size out of range: {self.size}")


@dataclass(frozen=True)
class OutputEntry:
    path: str
    blob: BlobRef
    is_executable: bool = False


@dataclass(frozen=True)
class Metadata:
    """A google.protobuf.Any of ExecutedActionMetadata.auxiliary_metadata."""

    type_url: str
    value: bytes


@dataclass(frozen=True)
class ActionResultMessage:
    output_files: tuple[OutputEntry, ...]
    exit_code: int = 0
    stdout: BlobRef | None = None
    worker: str = ""
    worker_start: int | None = None  # nanoseconds since the epoch
    worker_completed: int | None = None
    execution_start: int | None = None
    execution_completed: int | None = None
    auxiliary: tuple[Metadata, ...] = ()

    def __post_init__(self) -> None:
        if not -(1 << 31) <= self.exit_code < 1 << 31:
            raise ValueError(f"exit code is not an int32: {self.exit_code}")


def _varint(n: int) -> bytes:
    n &= _U64  # negative int32/int64 become 10-byte two's complement, as protobuf does
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _int(field: int, n: int) -> bytes:
    return _varint(field << 3 | _VARINT) + _varint(n) if n else b""


def _len(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | _LEN) + _varint(len(data)) + data


def _bytes(field: int, data: bytes) -> bytes:  # proto3: an empty string or bytes is not written
    return _len(field, data) if data else b""


def _digest(ref: BlobRef) -> bytes:
    return _bytes(1, ref.hash.encode()) + _int(2, ref.size)


def _timestamp(field: int, ns: int | None) -> bytes:
    if ns is None:
        return b""
    seconds, nanos = divmod(int(ns), _NANOS)  # floor: 0 <= nanos < 1e9, as Timestamp requires
    return _len(field, _int(1, seconds) + _int(2, nanos))


def _metadata(msg: ActionResultMessage) -> bytes:
    times = (msg.worker_start, msg.worker_completed, msg.execution_start, msg.execution_completed)
    anys = (_bytes(1, a.type_url.encode()) + _bytes(2, a.value) for a in msg.auxiliary)
    return b"".join(
        [_bytes(1, msg.worker.encode())]
        + [_timestamp(field, t) for field, t in zip((3, 4, 7, 8), times, strict=True)]
        + [_len(11, a) for a in anys]
    )


def encode_action_result(msg: ActionResultMessage) -> bytes:
    """The proto3 wire format of `msg`, byte-identical to protobuf's deterministic output."""
    files = (
        _bytes(1, f.path.encode()) + _len(2, _digest(f.blob)) + _int(4, f.is_executable)
        for f in msg.output_files
    )
    meta = _metadata(msg)  # a set timestamp is never empty bytes, so b"" means all defaults
    stdout = _len(6, _digest(msg.stdout)) if msg.stdout is not None else b""
    return b"".join([*(_len(2, f) for f in files), _int(4, msg.exit_code), stdout, _bytes(9, meta)])


_Fields = dict[int, list[Any]]  # field number -> values: int for varints, bytes otherwise


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    n = 0
    for i in range(10):
        if pos + i >= len(data):
            raise ReapiDecodeError("truncated varint")
        byte = data[pos + i]
        n |= (byte & 0x7F) << 7 * i
        if byte < 0x80:
            return n & _U64, pos + i + 1
    raise ReapiDecodeError("varint longer than 10 bytes")


def _records(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        field, wire = key >> 3, key & 7
        if field == 0 or wire not in (_VARINT, _I64, _LEN, _I32):
            raise ReapiDecodeError(f"bad field key {key}")
        if wire == _VARINT:
            value, pos = _read_varint(data, pos)
        else:
            size, pos = _read_varint(data, pos) if wire == _LEN else ({_I64: 8, _I32: 4}[wire], pos)
            if pos + size > len(data):
                raise ReapiDecodeError(f"field {field} runs past the end")
            value, pos = data[pos : pos + size], pos + size
        yield field, wire, value


def _parse(data: bytes, wires: dict[int, int]) -> _Fields:
    """Group the known fields of one message by number; unknown fields are skipped."""
    out: _Fields = {}
    for field, wire, value in _records(data):
        if field in wires:
            if wire != wires[field]:
                raise ReapiDecodeError(f"field {field} has wire type {wire}")
            out.setdefault(field, []).append(value)
    return out


def _num(f: _Fields, field: int, bits: int = 64) -> int:
    """The last value of a varint field, as a signed int32/int64 (protobuf truncates)."""
    n = f[field][-1] & (1 << bits) - 1 if field in f else 0
    return n - (1 << bits) if n >> (bits - 1) else n


def _raw(f: _Fields, field: int) -> bytes:
    return f[field][-1] if field in f else b""


def _message(f: _Fields, field: int) -> bytes | None:
    """A singular sub-message: repeated occurrences merge, which is parsing them concatenated."""
    return b"".join(f[field]) if field in f else None


def _blob(data: bytes) -> BlobRef:
    f = _parse(data, {1: _LEN, 2: _VARINT})
    return BlobRef(_raw(f, 1).decode(), _num(f, 2))


def _time(data: bytes | None) -> int | None:
    if data is None:
        return None
    f = _parse(data, {1: _VARINT, 2: _VARINT})
    nanos = _num(f, 2, 32)
    if not 0 <= nanos < _NANOS:
        raise ReapiDecodeError(f"timestamp nanos out of range: {nanos}")
    return _num(f, 1) * _NANOS + nanos


def _entry(data: bytes) -> OutputEntry:
    f = _parse(data, {1: _LEN, 2: _LEN, 4: _VARINT})
    return OutputEntry(_raw(f, 1).decode(), _blob(_message(f, 2) or b""), _num(f, 4) != 0)


def _decode(data: bytes) -> ActionResultMessage:
    f = _parse(data, {2: _LEN, 4: _VARINT, 6: _LEN, 9: _LEN})
    stdout = _message(f, 6)
    m = _parse(_message(f, 9) or b"", {1: _LEN, 3: _LEN, 4: _LEN, 7: _LEN, 8: _LEN, 11: _LEN})
    anys = [_parse(a, {1: _LEN, 2: _LEN}) for a in m.get(11, [])]
    return ActionResultMessage(
        output_files=tuple(_entry(e) for e in f.get(2, [])),
        exit_code=_num(f, 4, 32),
        stdout=_blob(stdout) if stdout is not None else None,
        worker=_raw(m, 1).decode(),
        worker_start=_time(_message(m, 3)),
        worker_completed=_time(_message(m, 4)),
        execution_start=_time(_message(m, 7)),
        execution_completed=_time(_message(m, 8)),
        auxiliary=tuple(Metadata(_raw(a, 1).decode(), _raw(a, 2)) for a in anys),
    )


def decode_action_result(data: bytes) -> ActionResultMessage:
    """Parse an ActionResult; unknown fields are skipped, anything malformed raises."""
    try:
        return _decode(bytes(data))
    except ReapiDecodeError:
        raise
    except ValueError as exc:  # bad UTF-8, bad hex digest, negative size
        raise ReapiDecodeError(str(exc)) from exc


# -- hefbuild.v1.Signature (signature.proto) --------------------------------------------

SIGNATURE_TYPE = "type.googleapis.com/hefbuild.v1.Signature"


@dataclass(frozen=True)
class SignatureMessage:
    key_name: str  # the signing key's name, as in trusted_keys ("ci-2026")
    signature: bytes  # the raw 64-byte Ed25519 signature


def encode_signature(sig: SignatureMessage) -> bytes:
    return _bytes(1, sig.key_name.encode()) + _bytes(2, sig.signature)


def decode_signature(data: bytes) -> SignatureMessage:
    try:
        f = _parse(bytes(data), {1: _LEN, 2: _LEN})
        return SignatureMessage(_raw(f, 1).decode(), _raw(f, 2))
    except ReapiDecodeError:
        raise
    except ValueError as exc:  # bad UTF-8
        raise ReapiDecodeError(str(exc)) from exc


def signatures_of(entry: ActionResultMessage) -> list[SignatureMessage]:
    """The entry's well-formed signatures (a malformed one vouches for nothing)."""
    found = []
    for meta in entry.auxiliary:
        if meta.type_url == SIGNATURE_TYPE:
            try:
                found.append(decode_signature(meta.value))
            except ReapiDecodeError:
                continue
    return found
