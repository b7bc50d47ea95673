"""A shared cache that lies, stalls or streams without end never spreads or keeps a bad blob.

The CI machine uploads honestly; then the server (a real HTTP server on 127.0.0.1, see
fakes/hostile_cache.py, or real nginx) serves one blob wrongly, and the reader must stop at
the size the entry declares, cut a trickle off at its deadline, and build locally; a writer
that rebuilt because of a bad blob puts the right bytes back.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from fakes.fake_executor import FakeExecutor
from fakes.hostile_cache import HostileCache

from .helpers import MODEL, TASKS, cache_toml, engine, make_project, run_all


@pytest.fixture
def hostile(tmp_path: Path):  # noqa: ANN201
    with HostileCache(tmp_path / "hostile") as server:
        yield server


def machine(tmp_path: Path, name: str, url: str, upload: bool = False, extra: str = ""):  # noqa: ANN201
    root = make_project(tmp_path / name / "proj", cache_toml(url, upload=upload, extra=extra))
    fake = FakeExecutor()
    return engine(root, tmp_path / name / "store", fake), fake


def output_digest(eng, stage: str, output: str) -> str:  # noqa: ANN001
    manifest = eng.paths.root / "build" / MODEL / stage / "manifest.json"
    return json.loads(manifest.read_text())["outputs"][output]["digest"]


def export_digests(eng) -> set[str]:  # noqa: ANN001
    """The digests of export's outputs and its log (one record's blobs)."""
    manifest = json.loads((eng.paths.root / "build" / MODEL / "export" / "manifest.json")
                          .read_text())
    record = eng.store.get_record(manifest["key"])
    return {o["digest"] for o in manifest["outputs"].values()} | {record.log}


def store_bytes(store: Path) -> int:
    return sum(p.stat().st_size for p in store.rglob("*") if p.is_file())


def test_a_blob_streamed_without_end_stops_at_its_declared_size(tmp_path, hostile):
    ci, _ = machine(tmp_path, "ci", hostile.url, upload=True)
    assert run_all(ci) == ["built"] * len(TASKS)
    digest = output_digest(ci, "export", "model.onnx")
    hostile.misbehave(f"cas/{digest}", "endless")
    dev, fake = machine(tmp_path, "dev", hostile.url)
    assert run_all(dev) == ["remote", "built", "remote", "remote", "remote"]
    assert fake.ran == [f"export:{MODEL}"]
    assert len(dev.warnings) == 1 and digest[:12] in dev.warnings[0]
    assert "declared as" in dev.warnings[0] and "built locally" in dev.warnings[0]
    # The reader hung up at the declared size: the server could not push more than what
    # loopback's socket buffers hold (it would go on for ever, or until the disk fills).
    assert hostile.streamed[f"/cas/{digest}"] < 32 << 20
    assert store_bytes(tmp_path / "dev" / "store") < 4 << 20


def test_an_answer_announcing_more_bytes_than_declared_is_refused_unread(tmp_path, hostile):
    ci, _ = machine(tmp_path, "ci", hostile.url, upload=True)
    run_all(ci)
    digest = output_digest(ci, "quantize", "model.int8.onnx")
    hostile.misbehave(f"cas/{digest}", "oversize")
    dev, fake = machine(tmp_path, "dev", hostile.url)
    assert run_all(dev) == ["remote", "remote", "built", "remote", "remote"]
    assert len(dev.warnings) == 1 and digest[:12] in dev.warnings[0]
    assert "more" in dev.warnings[0] and fake.ran == [f"quantize:{MODEL}"]
    assert store_bytes(tmp_path / "dev" / "store") < hostile.extra  # none of it was kept


def test_a_trickling_cache_is_cut_off_at_its_deadline_and_off_for_the_run(tmp_path, hostile):
    ci, _ = machine(tmp_path, "ci", hostile.url, upload=True)
    run_all(ci)
    digest = output_digest(ci, "export", "model.onnx")
    hostile.misbehave(f"cas/{digest}", "trickle")  # ~75 bytes at a byte every 0.3 s
    dev, fake = machine(tmp_path, "dev", hostile.url, extra='min_rate = "1KiB"\n')
    outcomes = run_all(dev)
    # Every byte arrives within the idle timeout (3 s): only the deadline (3 s + 75 B at
    # 1 KiB/s) stops it. Then the cache is off: later stages never ask it again.
    assert outcomes == ["remote", "built", "built", "built", "built"], dev.warnings
    assert len(dev.warnings) == 1 and "slower than 1 KiB/s" in dev.warnings[0]
    assert "for the rest of this run" in dev.warnings[0]
    # Blobs move together (`transfers`): what the trickled one's batch started may end; no
    # request comes after the batch, from any later stage.
    trickled = hostile.requests.index(("GET", f"/cas/{digest}"))
    export_blobs = {f"/cas/{d}" for d in export_digests(ci)}
    assert all(path in export_blobs for _, path in hostile.requests[trickled + 1:]), \
        hostile.requests[trickled + 1:]


@pytest.fixture(params=["http", "file"])
def remote(request: pytest.FixtureRequest, tmp_path: Path):  # noqa: ANN201
    """(url, data folder, restart) for real nginx or a shared folder."""
    if request.param == "file":
        (tmp_path / "shared").mkdir()
        return f"file://{tmp_path / 'shared'}", tmp_path / "shared"
    server = request.getfixturevalue("make_cache")()
    return server.url, server.data


def rewrite(blob: Path, data: bytes) -> None:
    os.chmod(blob, 0o644)
    blob.write_bytes(data)


def test_a_head_present_blob_of_the_wrong_size_is_a_miss_and_replaced(tmp_path, remote):
    url, data = remote
    ci, _ = machine(tmp_path, "ci", url, upload=True)
    run_all(ci)
    digest = output_digest(ci, "compile", "model.opt.onnx")
    good = (data / "cas" / digest).read_bytes()
    rewrite(data / "cas" / digest, good[:-3])  # truncated on the server; HEAD says "there"
    ci2, fake = machine(tmp_path, "ci2", url, upload=True)
    assert run_all(ci2) == ["remote", "remote", "remote", "built", "remote"]
    assert len(ci2.warnings) == 1 and f"declared as {len(good)} bytes" in ci2.warnings[0]
    assert (data / "cas" / digest).read_bytes() == good  # the writer put the right bytes back


def test_wrong_bytes_of_the_right_size_are_repaired_by_the_next_writer(tmp_path, remote):
    url, data = remote
    ci, _ = machine(tmp_path, "ci", url, upload=True)
    run_all(ci)
    digest = output_digest(ci, "export", "model.onnx")
    good = (data / "cas" / digest).read_bytes()
    flipped = bytearray(good)
    flipped[5] ^= 0xFF
    rewrite(data / "cas" / digest, bytes(flipped))  # same size: HEAD cannot tell
    ci2, fake = machine(tmp_path, "ci2", url, upload=True)
    assert run_all(ci2)[1] == "built" and fake.ran == [f"export:{MODEL}"]
    assert "wrong bytes" in ci2.warnings[0]
    assert hashlib.sha256((data / "cas" / digest).read_bytes()).hexdigest() == digest
    reader, fake = machine(tmp_path, "reader", url)
    assert run_all(reader) == ["remote"] * len(TASKS) and reader.warnings == []
