"""PieceFile: any write lands whole and in order, in system calls of at most PIECE bytes."""

from __future__ import annotations

import errno
import io
import os

import pytest

from hefbuild.store.piecefile import PIECE, PieceFile


class _Counted(io.FileIO):
    """The system calls PieceFile makes, by size (it calls this class's write)."""

    sizes: list[int]

    def write(self, data):  # noqa: ANN001, ANN201 - io.FileIO's own signature
        self.sizes.append(len(data))
        return super().write(data)


class Probe(PieceFile, _Counted):
    pass


@pytest.mark.parametrize("size", [0, 1, PIECE - 1, PIECE, PIECE + 1, 3 * PIECE + 5, 1 << 20])
@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_every_byte_lands_in_order_in_pieces(tmp_path, size, kind):
    data = os.urandom(size)
    path = tmp_path / "object"
    with Probe(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644), "wb") as f:
        f.sizes = []
        assert f.write(kind(data)) == size
    assert path.read_bytes() == data
    assert sum(f.sizes) == size and all(0 < n <= PIECE for n in f.sizes)
    assert len(f.sizes) == -(-size // PIECE)


def test_a_slice_of_a_larger_buffer_writes_only_that_slice(tmp_path):
    data = bytearray(os.urandom(3 * PIECE))
    path = tmp_path / "object"
    with PieceFile(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644), "wb") as f:
        f.write(memoryview(data)[PIECE // 2:2 * PIECE + 7])
    assert path.read_bytes() == bytes(data[PIECE // 2:2 * PIECE + 7])


def test_a_full_disk_raises_instead_of_returning_short():
    with PieceFile(os.open("/dev/full", os.O_WRONLY), "wb") as f, \
            pytest.raises(OSError) as raised:
        f.write(b"x" * (2 * PIECE))
    assert raised.value.errno == errno.ENOSPC
