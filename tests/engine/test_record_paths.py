"""A stored result is checked before any of it reaches build/, from the local store as from a
remote one: its output paths are relative, stay inside the stage folder and are the ones the
stage declares. A record that fails is dropped and the stage built again; nothing is written
outside build/<model>/<stage>/, and a remote entry that fails never enters the local store."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
from fakes.fake_executor import FakeExecutor

from hefbuild.declare.project import load_project
from hefbuild.engine.engine import Engine
from hefbuild.remote.reapi import decode_action_result, encode_action_result

from .helpers import MODEL, TASKS, make_tiny_project, run_all

EXPORT = f"export:{MODEL}"


def built(tmp_path: Path) -> tuple[Path, Path, dict]:
    root, store = make_tiny_project(tmp_path / "proj"), tmp_path / "store"
    assert run_all(Engine(load_project(root, store=store), executor=FakeExecutor())) == \
        ["built"] * len(TASKS)
    manifest = json.loads((root / "build" / MODEL / "export" / "manifest.json").read_text())
    return root, store, manifest


def record_path(store: Path, key: str) -> Path:
    return store / "v1" / "results" / key[:2] / f"{key}.json"


def tamper(store: Path, key: str, rename: dict[str, str]) -> None:
    """Rewrite a stored record's output paths (as a hostile writer of the store could)."""
    path = record_path(store, key)
    record = json.loads(path.read_text())
    record["outputs"] = {rename.get(rel, rel): out for rel, out in record["outputs"].items()}
    path.write_text(json.dumps(record))


@pytest.mark.parametrize("bad", ["../../escaped.onnx", "../escaped.onnx", "{tmp}/escaped.onnx",
                                 "sub/../../../escaped.onnx", "model.onnx/../x", "extra.onnx"])
def test_a_local_record_with_a_bad_output_path_is_dropped_and_rebuilt(tmp_path, bad):
    bad = bad.format(tmp=tmp_path)  # an absolute path: inside the test's own folder
    root, store, manifest = built(tmp_path)
    tamper(store, manifest["key"], {"model.onnx": bad})
    before = {p for p in tmp_path.rglob("*") if "store" not in p.parts}
    engine = Engine(load_project(root, store=store), executor=(fake := FakeExecutor()))
    (root / "build" / MODEL / "export" / "manifest.json").unlink()  # so it must restore
    assert engine.run(EXPORT)["outcome"] == "built" and fake.ran == [EXPORT]
    after = {p for p in tmp_path.rglob("*") if "store" not in p.parts}
    assert {p.name for p in after - before} <= {"manifest.json", "log.txt", "events.jsonl",
                                                 "digests.sqlite3", "export.running.log"}
    assert not any(p.name.startswith("escaped") for p in tmp_path.rglob("*"))
    fresh = json.loads(record_path(store, manifest["key"]).read_text())
    assert set(fresh["outputs"]) == set(manifest["outputs"])  # the rebuilt, honest record


def test_a_remote_entry_with_a_bad_output_path_never_enters_the_local_store(tmp_path):
    root, store, manifest = built(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    settings = f'[cache]\nremote = "file://{shared}"\nupload = true\n'
    (root / "hefbuild.toml").write_text(settings)
    engine = Engine(load_project(root, store=store), executor=FakeExecutor())
    for stage in ("fetch", "export"):
        key = json.loads((root / "build" / MODEL / stage / "manifest.json").read_text())["key"]
        engine.remote.upload(engine.store.get_record(key), engine.store)

    # A writer of the shared folder renames an output to climb out of build/.
    entry_path = shared / "ac" / manifest["key"]
    entry = decode_action_result(entry_path.read_bytes())
    record_ref = next(o for o in entry.output_files if o.path == ".hefbuild/record.json").blob
    record = json.loads((shared / "cas" / record_ref.hash).read_bytes())
    record["outputs"]["../../escaped.onnx"] = record["outputs"].pop("model.onnx")
    blob = json.dumps(record).encode()
    digest = hashlib.sha256(blob).hexdigest()
    (shared / "cas" / digest).write_bytes(blob)
    files = tuple(replace(o, path="../../escaped.onnx") if o.path == "model.onnx" else
                  replace(o, blob=replace(o.blob, hash=digest, size=len(blob)))
                  if o.path == ".hefbuild/record.json" else o for o in entry.output_files)
    entry_path.write_bytes(encode_action_result(replace(entry, output_files=files)))

    reader_root = make_tiny_project(tmp_path / "reader")
    (reader_root / "hefbuild.toml").write_text(settings.replace("true", "false"))
    reader_store = tmp_path / "reader-store"
    reader = Engine(load_project(reader_root, store=reader_store), executor=FakeExecutor())
    published: list[set[str]] = []  # every record the reader's store was given, even briefly
    put_record = reader.store.put_record
    reader.store.put_record = lambda r: (published.append(set(r.outputs)), put_record(r))[1]
    outcomes = [reader.run(t)["outcome"] for t in TASKS[:2]]
    assert not any("../../escaped.onnx" in outputs for outputs in published)
    assert outcomes == ["remote", "built"]
    assert len(reader.warnings) == 1 and "does not declare" in reader.warnings[0]
    assert not any(p.name.startswith("escaped") for p in tmp_path.rglob("*"))
    honest = json.loads(record_path(reader_store, manifest["key"]).read_text())
    assert "../../escaped.onnx" not in honest["outputs"]  # only the local build's record
