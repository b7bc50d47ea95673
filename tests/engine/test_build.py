"""A first build, and a second one that finds everything up to date."""

from __future__ import annotations

import json
import stat

from hefbuild.digest import sha256_file
from hefbuild.store.events import Outcome

from .helpers import MODEL, TASKS, run_all


def test_first_build_runs_every_rule_once_in_order(make_engine, fake, oracle):
    assert run_all(make_engine()) == ["built"] * 5
    assert fake.ran == list(TASKS)
    oracle()


def test_rule_gets_its_rule_file_and_action_json(make_engine, fake, root):
    run_all(make_engine())
    i = TASKS.index(f"quantize:{MODEL}")
    request, action = fake.requests[i], fake.actions[i]
    assert request.rules_dir / request.rule == root / "rules" / "cpu_ort" / "quantize.py"
    assert action["inputs"] == {up: str(root / "build" / MODEL / up) for up in ("fetch", "export")}
    assert action["files"] == {}  # weight-only int8 reads no calibration text
    assert fake.actions[0]["files"] == {"corpus": str(root / "data/corpus/tiny-stories.txt")}
    assert request.env == {"PYTHONHASHSEED": "0"}  # the toolchain's declared env, no more


def test_outputs_are_materialized_read_only_with_manifest_and_log(built, root):
    stage_dir = root / "build" / MODEL / "quantize"
    out = stage_dir / "model.int8.onnx"
    assert stat.S_IMODE(out.stat().st_mode) == 0o444
    manifest = json.loads((stage_dir / "manifest.json").read_text())
    assert manifest["outputs"]["model.int8.onnx"]["digest"] == sha256_file(out).hex
    assert manifest["key"] == built.decide(built.actions[f"quantize:{MODEL}"]).key.hex
    params = manifest["description"]["params"]
    assert params["block_size"] == 32 and "samples" not in params  # only what the rule reads
    assert (stage_dir / "log.txt").read_text() == "quantize: ok\n"


def test_folder_output_materializes_every_file(built, root):
    manifest = json.loads((root / "build" / MODEL / "fetch" / "manifest.json").read_text())
    assert sorted(manifest["outputs"]) == ["checkpoint/config.json", "checkpoint/weights.bin"]


def test_events_log_has_one_line_per_task(built, root):
    lines = (root / "build" / "events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["task"] for e in events] == list(TASKS)
    assert {e["outcome"] for e in events} == {"built"}
    for event in events:
        assert len(event["key"]) == 64
        assert event["seconds"] >= 0 and event["peak_rss_mb"] == 10.0


def test_second_decide_is_uptodate_and_runs_nothing(built, fake):
    decisions = [built.decide(built.actions[t]) for t in TASKS]
    assert [d.outcome for d in decisions] == [Outcome.UPTODATE] * 5
    assert run_all(built) == ["uptodate"] * 5
    assert fake.ran == []


def test_uptodate_check_on_a_fresh_engine(built, make_engine, fake):
    engine = make_engine()
    assert all(engine.is_uptodate(t) for t in TASKS)
    assert fake.ran == []
    assert engine.stats.bytes_hashed == 0


def test_the_next_invocation_answers_from_the_last_verdicts_without_keys(built, make_engine):
    built.fast.save()  # what the reporter does at the end of an invocation

    def no_keys(action):  # noqa: ANN001, ANN202
        raise AssertionError(f"{action.task}: key computed on the fast path")

    engine = make_engine()
    engine.key_of = no_keys
    assert all(engine.is_uptodate(t) for t in TASKS)


def test_each_stage_dir_holds_only_outputs_manifest_and_log(built, root):
    for task, action in built.actions.items():
        names = {p.name for p in (root / action.out_dir).iterdir()}
        declared = {out.rstrip("/") for out in action.outputs}
        assert names == declared | {"manifest.json", "log.txt"}, task
    leftovers = [p.name for p in (root / "build" / MODEL).iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_store_on_another_filesystem_materializes_read_only_copies(root, fake, tmp_path):
    import os

    import pytest

    from hefbuild.declare.project import load_project
    from hefbuild.engine.engine import Engine

    other = tmp_path / "store"
    other.mkdir()
    if os.stat(other).st_dev == os.stat(root).st_dev:
        pytest.skip("no second filesystem here (the project is not on tmpfs)")
    engine = Engine(load_project(root, store=other), executor=fake)
    assert run_all(engine) == ["built"] * 5
    out = root / "build" / MODEL / "compile" / "model.opt.onnx"
    assert out.stat().st_nlink == 1  # a copy, not a link across devices
    assert stat.S_IMODE(out.stat().st_mode) == 0o444
    manifest = json.loads((out.parent / "manifest.json").read_text())
    assert manifest["outputs"]["model.opt.onnx"]["digest"] == sha256_file(out).hex
    import shutil

    shutil.rmtree(root / "build")
    again = Engine(load_project(root, store=other), executor=fake)
    assert run_all(again) == ["restored"] * 5
