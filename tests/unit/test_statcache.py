"""StatCache: hash a file once, then trust its stat until it changes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from hefbuild.statcache import StatCache

DATA = b"calibration text\n" * 100


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state" / "digests.sqlite3"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data.txt"
    path.write_bytes(DATA)
    return path


def test_digest_is_sha256_of_content(db, data):
    assert StatCache(db).digest(data).hex == hashlib.sha256(DATA).hexdigest()


def test_unchanged_file_is_hashed_once(db, data):
    stats = StatCache(db)
    stats.digest(data)
    stats.digest(data)
    assert stats.bytes_hashed == len(DATA)


def test_digests_persist_across_instances(db, data):
    first = StatCache(db)
    digest = first.digest(data)
    first.close()
    second = StatCache(db)
    assert second.digest(data) == digest
    assert second.bytes_hashed == 0


def test_touch_rehashes_once_then_trusts_again(db, data):
    StatCache(db).digest(data)
    st = data.stat()
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    stats = StatCache(db)
    stats.digest(data)
    stats.digest(data)
    assert stats.bytes_hashed == len(DATA)
    stats.close()
    again = StatCache(db)
    again.digest(data)
    assert again.bytes_hashed == 0


def test_same_size_edit_with_restored_mtime_is_detected(db, data):
    before = StatCache(db).digest(data)
    st = data.stat()
    edited = DATA.replace(b"calibration", b"CALIBRATION", 1)
    assert len(edited) == len(DATA)
    data.write_bytes(edited)
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert data.stat().st_mtime_ns == st.st_mtime_ns and data.stat().st_size == st.st_size
    after = StatCache(db).digest(data)
    assert after != before
    assert after.hex == hashlib.sha256(edited).hexdigest()


def test_replaced_file_is_detected_by_inode(db, data, tmp_path):
    stats = StatCache(db)
    stats.digest(data)
    other = tmp_path / "other.txt"
    other.write_bytes(b"x" * len(DATA))
    os.replace(other, data)
    assert stats.digest(data).hex == hashlib.sha256(b"x" * len(DATA)).hexdigest()


def test_remember_skips_hashing(db, data):
    stats = StatCache(db)
    known = StatCache(db.with_name("other.sqlite3")).digest(data)
    stats.remember(data, known)
    assert stats.digest(data) == known
    assert stats.bytes_hashed == 0


def test_missing_file_raises(db, tmp_path):
    with pytest.raises(FileNotFoundError):
        StatCache(db).digest(tmp_path / "absent")
