"""Single-file ONNX models read and written without holding their tensors twice.

`onnx.load` holds the file's bytes and the parsed message at once, and `onnx.save` holds the
message and its serialization: twice the model either way, which is what made a 135M model's
quantize and export peak at 2-3x its size. Here the big tensors stay on disk:

- `load_lazily` scans the file's protobuf wire format and returns the model with every top-level
  initializer that has raw_data turned into an external-data reference (location, offset,
  length) into that same file, read on demand (`read_array` here, or onnx_ir's `from_proto`;
  onnx's `numpy_helper.to_array` would load the data into the message).
- `save_inline` writes a model whose initializers may be such references (into any file) as one
  self-contained file, copying each tensor's bytes from its file in chunks. The bytes written are
  what protobuf would serialize for the same message, up to field order: initializers are written
  after the graph's other fields (parsers accept fields in any order). `inline_size` is that
  file's size, without writing it.
- `append_initializers` turns arrays (a traced graph's weight inputs) into initializers whose
  data goes to a file as it comes, for `save_inline` to copy into the model's own.

Only the top-level graph's initializers are handled this way; tensors inside nodes (Constant
attributes, subgraphs) stay in the message, as small ones do.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Union

if TYPE_CHECKING:
    import onnx

# Protobuf field numbers (onnx.proto) and wire types.
MODEL_GRAPH, GRAPH_INITIALIZER, TENSOR_RAW_DATA = 7, 5, 9
VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5
CHUNK = 16 << 20


@dataclass(frozen=True)
class FileSpan:
    """`length` bytes of `path` from `offset`: a tensor's data still on disk."""

    path: Path
    offset: int
    length: int


Piece = Union[bytes, FileSpan, "onnx.TensorProto"]


# -- wire format ------------------------------------------------------------------------------


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


class FileBytes:
    """Indexing and slicing over a file by pread: a memory map would put every page a scan
    touches (and the kernel's read-around) in the process's resident set."""

    BLOCK = 1 << 16

    def __init__(self, fd: int, length: int) -> None:
        self.fd, self.length = fd, length
        self.block_start, self.block = -1, b""

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key: int | slice) -> int | bytes:
        if isinstance(key, slice):
            return os.pread(self.fd, key.stop - key.start, key.start)
        start = key - key % self.BLOCK
        if start != self.block_start:
            self.block_start, self.block = start, os.pread(self.fd, self.BLOCK, start)
        return self.block[key - start]


def read_varint(buf: FileBytes | bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def fields(buf: FileBytes | bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, start of its tag, start of its value, end) of each field in buf[start:end];
    the value of a length-delimited field is its payload, without the length prefix."""
    pos = start
    while pos < end:
        tag, value_pos = read_varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == VARINT:
            _, value_end = read_varint(buf, value_pos)
        elif wire == LEN:
            length, value_pos = read_varint(buf, value_pos)
            value_end = value_pos + length
        elif wire in (FIXED64, FIXED32):
            value_end = value_pos + (8 if wire == FIXED64 else 4)
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} at byte {pos}")
        yield number, pos, value_pos, value_end
        pos = value_end


def length_prefix(number: int, length: int) -> bytes:
    return varint(number << 3 | LEN) + varint(length)


# -- reading ----------------------------------------------------------------------------------


def external_ref(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Point `tensor` at `length` bytes of `location` (relative to the model's folder)."""
    import onnx

    tensor.ClearField("raw_data")
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = onnx.TensorProto.EXTERNAL


def lazy_tensor(buf: FileBytes, start: int, end: int, location: str) -> onnx.TensorProto:
    import onnx

    header, data = bytearray(), None
    for number, tag_pos, value_pos, value_end in fields(buf, start, end):
        if number == TENSOR_RAW_DATA:
            data = (value_pos, value_end - value_pos)
        else:
            header += buf[tag_pos:value_end]
    tensor = onnx.TensorProto.FromString(bytes(header))
    if data is not None:
        external_ref(tensor, location, *data)
    return tensor


def load_lazily(path: Path, base_dir: Path) -> onnx.ModelProto:
    """The model in `path` (self-contained), its initializers' data left in the file: each is a
    reference to `path` relative to `base_dir`, the folder later readers resolve it against."""
    import onnx

    location = os.path.relpath(path, base_dir)
    model_head, graph_head, tensors = bytearray(), bytearray(), []
    with open(path, "rb") as f:
        buf = FileBytes(f.fileno(), os.fstat(f.fileno()).st_size)
        for number, tag_pos, value_pos, value_end in fields(buf, 0, len(buf)):
            if number != MODEL_GRAPH:
                model_head += buf[tag_pos:value_end]
                continue
            for inner, inner_tag, inner_pos, inner_end in fields(buf, value_pos, value_end):
                if inner == GRAPH_INITIALIZER:
                    tensors.append(lazy_tensor(buf, inner_pos, inner_end, location))
                else:
                    graph_head += buf[inner_tag:inner_end]
    model = onnx.ModelProto.FromString(bytes(model_head))
    model.graph.MergeFromString(bytes(graph_head))
    model.graph.initializer.extend(tensors)
    return model


# -- writing ----------------------------------------------------------------------------------


def write_c_order(out: BinaryIO, array: Any) -> None:
    """The array's bytes in C order; a strided view (a transposed weight) is made contiguous
    a block of rows at a time, so no whole copy of it is ever held."""
    import numpy as np

    if array.flags.c_contiguous or array.ndim == 0:
        out.write(np.ascontiguousarray(array).data)
        return
    rows = max(1, CHUNK // max(1, array[0].nbytes))
    for start in range(0, len(array), rows):
        out.write(np.ascontiguousarray(array[start : start + rows]).data)


def append_initializers(model: onnx.ModelProto, arrays: Iterable[tuple[str, Any]],
                        folder: Path, file_name: str) -> None:
    """Each (name, numpy array) becomes an initializer of `model` whose data is written to
    `folder/file_name`, one after another, and referred to there (relative to `folder`). An
    iterator can make each array as it is written; a strided view is never copied whole."""
    import onnx

    offset = 0
    with open(folder / file_name, "wb") as data:
        for name, array in arrays:
            write_c_order(data, array)
            tensor = onnx.TensorProto(
                name=name, data_type=onnx.helper.np_dtype_to_tensor_dtype(array.dtype))
            tensor.dims.extend(array.shape)
            external_ref(tensor, file_name, offset, array.nbytes)
            model.graph.initializer.append(tensor)
            offset += array.nbytes


def is_repeated(desc: object) -> bool:
    # protobuf >= 6 has `is_repeated` and no `label`; older ones only `label`.
    if hasattr(desc, "is_repeated"):
        return bool(desc.is_repeated)
    return desc.label == desc.LABEL_REPEATED


def without(message: object, name: str) -> bytes:
    """`message` serialized without its field `name`, copying only the other fields."""
    head = type(message)()
    for desc, value in message.ListFields():
        if desc.name == name:
            continue
        target = getattr(head, desc.name)
        if is_repeated(desc):
            target.extend(value)
        elif desc.type == desc.TYPE_MESSAGE:
            target.CopyFrom(value)
        else:
            setattr(head, desc.name, value)
    return head.SerializeToString()


def data_span(tensor: onnx.TensorProto, base_dir: Path) -> FileSpan | None:
    import onnx

    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    info = {entry.key: entry.value for entry in tensor.external_data}
    path = base_dir / info["location"]
    offset = int(info.get("offset", 0))
    length = int(info["length"]) if "length" in info else path.stat().st_size - offset
    return FileSpan(path, offset, length)


def read_array(tensor: onnx.TensorProto, base_dir: Path) -> Any:
    """The tensor's values as a numpy array, read from its file if it refers to one (the
    message is left as it is, unlike numpy_helper.to_array, which loads the data into it)."""
    import numpy as np
    import onnx

    span = data_span(tensor, base_dir)
    if span is None:
        return onnx.numpy_helper.to_array(tensor)
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    values = np.fromfile(span.path, dtype=dtype, count=span.length // dtype.itemsize,
                         offset=span.offset)
    return values.reshape(tuple(tensor.dims))


def tensor_pieces(tensor: onnx.TensorProto, base_dir: Path) -> list[Piece]:
    """The tensor as a length-prefixed initializer field of GraphProto, data inline."""
    span = data_span(tensor, base_dir)
    if span is None:
        return [length_prefix(GRAPH_INITIALIZER, tensor.ByteSize()), tensor]
    header = type(tensor)()
    header.CopyFrom(tensor)
    header.ClearField("external_data")
    header.ClearField("data_location")
    head = header.SerializeToString() + length_prefix(TENSOR_RAW_DATA, span.length)
    return [length_prefix(GRAPH_INITIALIZER, len(head) + span.length), head, span]


def size(piece: Piece) -> int:
    if isinstance(piece, bytes):
        return len(piece)
    if isinstance(piece, FileSpan):
        return piece.length
    return piece.ByteSize()


def model_pieces(model: onnx.ModelProto, base_dir: Path) -> list[Piece]:
    graph: list[Piece] = [without(model.graph, "initializer")]
    for tensor in model.graph.initializer:
        graph += tensor_pieces(tensor, base_dir)
    graph_length = sum(size(p) for p in graph)
    return [without(model, "graph"), length_prefix(MODEL_GRAPH, graph_length), *graph]


def write_piece(out: BinaryIO, piece: Piece) -> None:
    if isinstance(piece, bytes):
        out.write(piece)
    elif isinstance(piece, FileSpan):
        with open(piece.path, "rb") as src:
            src.seek(piece.offset)
            left = piece.length
            while left:
                chunk = src.read(min(CHUNK, left))
                if not chunk:
                    raise OSError(f"{piece.path} ends before byte {piece.offset + piece.length}")
                out.write(chunk)
                left -= len(chunk)
    else:
        out.write(piece.SerializeToString())


def inline_size(model: onnx.ModelProto, base_dir: Path) -> int:
    """Bytes `save_inline` would write for this model."""
    return sum(size(p) for p in model_pieces(model, base_dir))


def save_inline(model: onnx.ModelProto, path: Path, base_dir: Path) -> int:
    """Write `model` to `path` as one self-contained file; external data is resolved against
    `base_dir` and copied in. Returns the number of bytes written."""
    pieces = model_pieces(model, base_dir)
    with open(path, "wb") as out:
        for piece in pieces:
            write_piece(out, piece)
    return sum(size(p) for p in pieces)
