"""A file written at most `PIECE` bytes per write(2), whatever size the caller hands over;
`PIECE` is as large as this machine's memory lets a write be without paying for it.

Why: on a VM whose balloon reports free memory to the host (free page reporting), the
page cache's folios for a write are cut from free blocks, and touching a block the host took
back faults into the host. The kernel reports only blocks of `page_reporting_order` and up
(/sys/module/page_reporting/parameters/page_reporting_order); a write below that size gets
folios that never came from a reported block. Above it, every write pays. Below it, fewer
and larger writes are cheaper (fewer system calls and folios). So `PIECE` is half a reported
block, at most 1 MiB (a larger write saves nothing more), and 1 MiB where nothing is reported.

Measured, on two VMs of this project's CI (2 cores, Linux 6.18, ext4):
- order 5 (blocks of 128 KiB): writing 200 new files of 1 MiB cost 0.6-1.9 s of kernel time
  in one write() each and 0.08-0.18 s in 64 KiB writes (five rounds each, interleaved; 128
  KiB writes were mostly slow too, 16 and 32 KiB fast). `perf` put the time in the copy into
  the page cache itself (`copy_folio_from_iter_atomic`), with no reclaim or compaction in
  /proc/vmstat; with the order raised to 10 for a test (then set back), 1 MiB writes cost
  0.06-0.09 s a round after the first, like 64 KiB ones. Downloads of 200 x 1 MiB from nginx,
  4 at once, without deleting files between rounds (docs/transfers.md): 0.163 s a round in
  64 KiB writes against 0.211 s in one write a blob, 0.180 s against 0.241 s one at a time;
  32 and 16 KiB pieces were slower than 64 (0.183 and 0.188 s 4 at once).
- order 9 (blocks of 2 MiB): the other way round. The same download, 80 rounds in shuffled
  order, raced against curl (ratio: curl's time / ours): a store landing in 64 KiB writes
  0.958 (quartiles 0.894-1.023), in one write a blob 1.017 (0.945-1.088); a bare client
  without the store, 0.981 in 64 KiB writes and 1.050 in one. On the same VM with the order
  set to 5 for a test (then set back), 40 rounds: 0.961 in 64 KiB writes, 0.794 in one
  write a blob. `benchmarks/transfers_revs.py`, 60 rounds, the code before and after this
  rule (the VM at order 9): 0.89 (0.81-0.93) -> 0.93 (0.84-1.02), CPU 0.291 -> 0.265 s.
"""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

REPORTING = Path("/sys/module/page_reporting/parameters/page_reporting_order")
LARGEST = 1 << 20


def piece_size(reporting_order: int | None, page: int = 4096) -> int:
    """Half a block of `reporting_order` pages (None or below 1: nothing is reported), at
    most LARGEST."""
    if reporting_order is None or reporting_order < 1:
        return LARGEST
    return min(LARGEST, page << (reporting_order - 1))


def reporting_order() -> int | None:
    """This machine's `page_reporting_order`; None where nothing is reported."""
    try:
        return int(REPORTING.read_text())
    except (OSError, ValueError):  # no balloon that reports, or no sysfs: nothing reported
        return None


PIECE = piece_size(reporting_order(), os.sysconf("SC_PAGE_SIZE"))


class PieceFile(io.FileIO):
    """`io.FileIO` whose `write` takes any size and issues it in pieces of `PIECE` bytes,
    returning only once all of it is written (a full disk raises, as usual)."""

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            n = super().write(view[done:done + PIECE])
            if not n:  # a regular file takes bytes or raises; never spin on one that does not
                raise OSError(errno.EIO, "write took no bytes", self.name)
            done += n
        return done
