"""PieceFile: any write lands whole and in order, in system calls of at most PIECE bytes, and
PIECE stays below the size of the blocks a VM's balloon gives back to its host."""

from __future__ import annotations

import errno
import io
import os

import pytest

from hefbuild.store.piecefile import PIECE, PieceFile, piece_size, reporting_order


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


@pytest.mark.parametrize(("order", "piece"), [
    (5, 64 << 10),  # blocks of 128 KiB reported: pieces of half that
    (9, 1 << 20),  # blocks of 2 MiB: half is 1 MiB
    (11, 1 << 20),  # never more than 1 MiB
    (1, 4096),  # half of two pages
    (None, 1 << 20),  # nothing reported (no balloon, no sysfs)
    (0, 1 << 20),
])
def test_pieces_stay_below_the_blocks_the_host_takes_back(order, piece):
    assert piece_size(order) == piece


def test_the_machines_own_piece_is_half_its_reported_block_or_a_mebibyte():
    assert piece_size(reporting_order(), os.sysconf("SC_PAGE_SIZE")) == PIECE
