"""The content-addressed store: read-only objects, atomic records, self-healing reads."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from hefbuild.store.statcache import StatCache
from hefbuild.store.store import OutputFile, Record, Store

KEY = "1" * 64


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store", StatCache(tmp_path / "state.sqlite3"))


def put(store: Store, tmp_path: Path, data: bytes, name: str = "out.bin") -> OutputFile:
    path = tmp_path / name
    path.write_bytes(data)
    return store.put_file(path)


def record(store: Store, tmp_path: Path) -> Record:
    out = put(store, tmp_path, b"model bytes")
    log = put(store, tmp_path, b"log line\n", "log.txt")
    return Record(KEY, "compile", {"model.opt.onnx": out}, log.digest, {"kind": "host"},
                  1.5, 20.0, {"stage": "compile"})


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_put_file_moves_into_objects_read_only(store, tmp_path):
    out = put(store, tmp_path, b"hello")
    assert out == OutputFile(hashlib.sha256(b"hello").hexdigest(), 5)
    obj = store.object_path(out.digest)
    assert obj.read_bytes() == b"hello"
    assert obj.parent.name == out.digest[:2] and obj.name == out.digest[2:]
    assert mode(obj) == 0o444
    assert not (tmp_path / "out.bin").exists()


def test_put_same_content_twice_keeps_one_object(store, tmp_path):
    first, second = put(store, tmp_path, b"same"), put(store, tmp_path, b"same", "b.bin")
    assert first == second
    assert len(list((store.root / "objects").rglob("*/*"))) == 1


def test_put_bytes(store):
    out = store.put_bytes(b"abc")
    assert store.object_path(out.digest).read_bytes() == b"abc"


def test_record_round_trip(store, tmp_path):
    rec = record(store, tmp_path)
    store.put_record(rec)
    assert store.has_record(KEY)
    assert store.get_record(KEY) == rec


def test_get_record_of_unknown_key_is_none(store):
    assert store.get_record(KEY) is None


@pytest.mark.parametrize("garbage", ["{not json", "[]", '{"key": "x"}', ""])
def test_garbage_record_is_a_miss_and_is_deleted(store, tmp_path, garbage):
    store.put_record(record(store, tmp_path))
    path = store.root / "results" / KEY[:2] / f"{KEY}.json"
    path.write_text(garbage)
    assert store.get_record(KEY) is None
    assert not path.exists()


def test_drop_record(store, tmp_path):
    store.put_record(record(store, tmp_path))
    store.drop_record(KEY)
    store.drop_record(KEY)
    assert not store.has_record(KEY)


def test_verify_deletes_a_corrupted_object(store, tmp_path):
    out = put(store, tmp_path, b"good bytes")
    obj = store.object_path(out.digest)
    assert store.verify(out.digest)
    os.chmod(obj, 0o644)
    obj.write_bytes(b"evil bytes")
    assert not store.verify(out.digest)
    assert not obj.exists()


def test_an_object_is_vouched_for_only_as_the_store_hashed_it(store, tmp_path):
    out = put(store, tmp_path, b"good bytes")
    obj = store.object_path(out.digest)
    assert store.vouched(out.digest)
    assert not store.vouched("0" * 64)  # absent
    fresh = Store(store.root, StatCache(tmp_path / "other.sqlite3"))
    assert not fresh.vouched(out.digest)  # never hashed by that stat cache: not its word
    os.chmod(obj, 0o644)
    obj.write_bytes(b"evil bytes")
    assert not store.vouched(out.digest) and obj.exists()  # says so; deletes nothing


def test_intact_is_false_when_an_object_is_missing(store, tmp_path):
    rec = record(store, tmp_path)
    assert store.intact(rec)
    store.object_path(rec.log).unlink()
    assert not store.intact(rec)


def test_intact_prunes_every_bad_object(store, tmp_path):
    rec = record(store, tmp_path)
    paths = [store.object_path(rec.outputs["model.opt.onnx"].digest), store.object_path(rec.log)]
    for path in paths:
        os.chmod(path, 0o644)
        path.write_bytes(b"rot")
    assert not store.intact(rec)
    assert not any(p.exists() for p in paths)


def test_materialize_hard_links_read_only(store, tmp_path):
    out = put(store, tmp_path, b"weights")
    dest = tmp_path / "build" / "m" / "compile" / "model.bin"
    store.materialize(out.digest, dest)
    assert dest.read_bytes() == b"weights"
    assert dest.stat().st_ino == store.object_path(out.digest).stat().st_ino
    assert mode(dest) == 0o444


def test_materialize_leaves_digests_trusted(tmp_path):
    stats = StatCache(tmp_path / "state.sqlite3")
    store = Store(tmp_path / "store", stats)
    out = put(store, tmp_path, b"weights")
    store.materialize(out.digest, tmp_path / "a.bin")
    before = stats.bytes_hashed
    assert store.verify(out.digest)
    assert stats.digest(tmp_path / "a.bin").hex == out.digest
    assert stats.bytes_hashed == before


def test_scratch_is_removed_even_when_the_body_raises(store):
    with pytest.raises(RuntimeError), store.scratch() as scratch:
        (scratch / "out").mkdir()
        (scratch / "out" / "half.bin").write_bytes(b"half")
        raise RuntimeError("rule crashed")
    assert not scratch.exists()
    assert list((store.root / "tmp").iterdir()) == []


def test_scratch_is_on_the_store_filesystem(store):
    with store.scratch() as scratch:
        assert scratch.parent == store.root / "tmp"
        assert os.stat(scratch).st_dev == os.stat(store.root).st_dev


def test_record_json_is_stable(store, tmp_path):
    rec = record(store, tmp_path)
    assert Record.from_json(rec.to_json()) == rec
    assert rec.to_json() == Record.from_json(rec.to_json()).to_json()
