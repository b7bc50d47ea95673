"""StatCache: hash a file once, then trust its stat until it changes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from hefbuild.digest import Digest
from hefbuild.store.statcache import StatCache

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


# -- one row per inode: links, renames, other projects --------------------------------


def read_only(path: Path) -> Path:
    os.chmod(path, 0o444)
    return path


def test_a_digest_is_remembered_where_the_file_ends_up(db, tmp_path):
    staging = tmp_path / "build" / ".export.new-123"
    staging.mkdir(parents=True)
    (staging / "model.onnx").write_bytes(DATA)
    stats = StatCache(db)
    stats.digest(staging / "model.onnx")
    final = tmp_path / "build" / "export"
    os.replace(staging, final)  # a restore is staged, then its folder renamed into place
    again = StatCache(db)
    assert again.digest(final / "model.onnx").hex == hashlib.sha256(DATA).hexdigest()
    assert again.bytes_hashed == 0
    assert again.rows() == 1  # no dead row for the staging path


def test_adding_and_removing_links_of_a_read_only_file_rehashes_nothing(db, data, tmp_path):
    read_only(data)
    StatCache(db).digest(data)
    link = tmp_path / "build-a" / "model.bin"
    link.parent.mkdir()
    os.link(data, link)  # another project restores the same object: ctime and nlink move
    StatCache(db).remember(link, StatCache(db).digest(data))  # as its restore does
    os.unlink(link)  # ... and `rm -rf build` there
    stats = StatCache(db)
    assert stats.digest(data).hex == hashlib.sha256(DATA).hexdigest()
    assert stats.bytes_hashed == 0


def test_a_link_seen_through_any_path_shares_the_row(db, data, tmp_path):
    read_only(data)
    first = StatCache(db)
    first.digest(data)
    link = tmp_path / "link.bin"
    os.link(data, link)
    first.remember(link, first.digest(data))
    other_project = StatCache(db)  # the table lives in the store: shared
    assert other_project.digest(link).hex == hashlib.sha256(DATA).hexdigest()
    assert other_project.digest(data).hex == hashlib.sha256(DATA).hexdigest()
    assert other_project.bytes_hashed == 0
    assert other_project.rows() == 1


def test_chmod_then_write_through_a_hard_link_is_caught(db, data, tmp_path):
    read_only(data)
    StatCache(db).digest(data)
    link = tmp_path / "link.bin"
    os.link(data, link)
    stats = StatCache(db)
    stats.remember(link, stats.digest(data))
    st = link.stat()
    os.chmod(link, 0o644)
    edited = DATA.replace(b"calibration", b"CALIBRATION", 1)
    link.write_bytes(edited)
    os.utime(link, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime
    os.chmod(link, 0o444)  # and the mode put back: only ctime tells
    assert StatCache(db).digest(data).hex == hashlib.sha256(edited).hexdigest()


def test_a_link_change_does_not_excuse_a_writable_file(db, data, tmp_path):
    StatCache(db).digest(data)  # data is writable (0644): project files are
    st = data.stat()
    edited = DATA.replace(b"calibration", b"CALIBRATION", 1)
    data.write_bytes(edited)
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.link(data, tmp_path / "extra-link")
    assert StatCache(db).digest(data).hex == hashlib.sha256(edited).hexdigest()


def test_prune_drops_rows_of_files_that_are_gone_and_bounds_the_table(db, tmp_path):
    stats = StatCache(db)
    files = []
    for i in range(5):
        path = tmp_path / f"f{i}"
        path.write_bytes(bytes([i]) * 10)
        stats.digest(path)
        files.append(path)
    files[0].unlink()
    files[1].unlink()
    files[2].write_bytes(b"new inode?")  # same inode, rewritten: the row stays (re-hashed later)
    assert stats.prune(now=1e9) == 2
    assert stats.rows() == 3
    assert stats.prune(now=1e9 + 60) == 0  # at most once a day
    assert stats.prune(now=1e9 + 2 * 86400, max_rows=2) == 0
    assert stats.rows() == 2


def test_an_unwritable_table_still_answers(db, data):
    stats = StatCache(db)
    stats.digest(data)
    stats.close()
    os.chmod(db, 0o444)
    os.chmod(db.parent, 0o555)
    try:
        again = StatCache(db)
        assert again.digest(data).hex == hashlib.sha256(DATA).hexdigest()
    finally:
        os.chmod(db.parent, 0o755)
        os.chmod(db, 0o644)


def test_rows_of_a_deferred_batch_reach_the_table_in_one_go_at_its_end(db, tmp_path):
    files = []
    for i in range(5):
        path = tmp_path / f"f{i}"
        path.write_bytes(DATA + bytes([i]))
        files.append((path, Digest(hashlib.sha256(DATA + bytes([i])).hexdigest())))
    stats, reader = StatCache(db), StatCache(db)
    stats.remember(*files[0])  # creates the table
    with stats.deferred():
        for path, digest in files:
            stats.remember(path, digest)
        assert reader.rows() == 1  # not in the table yet...
        assert all(stats.digest(path) == digest for path, digest in files)  # ...but known
    assert reader.rows() == len(files)
    assert stats.bytes_hashed == 0


def test_recorded_answers_from_the_stat_alone_and_only_for_an_unchanged_file(db, data):
    stats = StatCache(db)
    assert stats.recorded(data) is None  # never hashed here: nothing to vouch for
    digest = stats.digest(data)
    assert stats.recorded(data) == digest
    again = StatCache(db)
    assert again.recorded(data) == digest and again.bytes_hashed == 0
    data.write_bytes(DATA.upper())  # same size, new bytes
    assert again.recorded(data) is None and again.bytes_hashed == 0
