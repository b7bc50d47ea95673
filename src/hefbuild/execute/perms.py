"""A finished rule's files made readable to whoever collects them.

A rule may leave a file mode 0000 or a folder mode 0000 (or one it cannot be entered). Root
reads them anyway; anyone else could neither hash, store nor remove them. The rule has ended
(bwrap's PID namespace or the reaper saw to it), so nothing changes the tree while we walk.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

DIR_BITS = stat.S_IRWXU  # list, enter, and move files out (the store renames them)
FILE_BITS = stat.S_IRUSR


def owner_readable(root: Path) -> None:
    """Give the owner read on every file and rwx on every folder under `root`. Symlinks are
    not followed and inodes of another owner are left alone: never someone else's file."""
    if not root.is_dir() or root.is_symlink():
        return
    uid = os.geteuid()
    folders = [str(root)]
    while folders:
        folder = folders.pop()
        _add(folder, os.lstat(folder), DIR_BITS, uid)  # before listing it: it may be 0000
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue  # not ours: nothing of it is ours to change
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                folders.append(entry.path)
            elif stat.S_ISREG(st.st_mode):
                _add(entry.path, st, FILE_BITS, uid)


def _add(path: str, st: os.stat_result, bits: int, uid: int) -> None:
    if st.st_uid == uid and st.st_mode & bits != bits:
        os.chmod(path, stat.S_IMODE(st.st_mode) | bits)
