"""A file's stat signature: size, mtime, ctime and inode, packed. What the no-op's fast path
compares to tell that a file is as it was when a decision read it (engine/fastpath.py);
loading takes one of each model file before reading it (declare/project.py)."""

from __future__ import annotations

import os
import struct

_SIG = struct.Struct("<qqqQ")
ABSENT = b"-"  # no file: as much a fact about it as a stat


def stat_signature(path: str) -> bytes:
    try:
        st = os.stat(path)
    except OSError:
        return ABSENT
    return _SIG.pack(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
