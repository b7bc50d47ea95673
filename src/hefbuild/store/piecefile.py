"""A file written at most `PIECE` bytes per write(2), whatever size the caller hands over.

Why: on this project's CI machines (a VM, Linux 6.18, ext4), writing 200 new files of 1 MiB
cost 0.6-1.9 s of kernel time in one write() each and 0.08-0.18 s in 64 KiB writes (five
rounds each, interleaved; 128 KiB writes were mostly slow too, 16 and 32 KiB fast). `perf`
puts the time in the copy into the page cache itself (`copy_folio_from_iter_atomic`), with no
reclaim or compaction in /proc/vmstat. The cause is below the guest: the VM's balloon
reports free memory to the host in blocks of 128 KiB and up (free page reporting,
/sys/module/page_reporting/parameters/page_reporting_order = 5), and a write that large gets
page-cache folios of that order, cut from reported blocks that the host must fault back in
as they are first touched; a 64 KiB folio comes from smaller blocks, never reported. With
that order raised to 10 for a test (then set back), 1 MiB writes cost 0.06-0.09 s a round
after the first, like 64 KiB ones.
Downloading 200 blobs of 1 MiB from nginx, in rounds interleaved with the old code and curl
(ratio: curl's time / ours), one at a time went 0.90 -> 1.18, 0.91 -> 0.99, 0.77 -> 1.10;
four at once 0.88 -> 1.12, then within the noise (0.99 -> 0.94, 1.17 -> 1.15). curl writes
16 KiB at a time and Python's shutil copies in 64 KiB; where large writes cost nothing more,
16 system calls a MiB cost about what hashing 20 KiB of it does.
Those rounds deleted the previous round's files, which on this ext4 slows every create
(docs/transfers.md). Measured again without deleting, 21 rounds interleaved: 200 x 1 MiB
down took 0.163 s a round 4 at once in 64 KiB writes against 0.211 s in one write a blob,
0.180 s against 0.241 s one at a time; 32 and 16 KiB pieces were slower than 64 (0.183 and
0.188 s 4 at once).
"""

from __future__ import annotations

import errno
import io

PIECE = 64 << 10


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
