"""The no-op fast path gives the full path's answer, whatever changed; restores are
constant-time; a no-op adds one event line.

The oracle here: for every task, a fresh engine's fast answer (`is_uptodate`, from the last
verdicts) equals a second fresh engine's full decision (`decide`, which computes the key).
"""

from __future__ import annotations

import json
import marshal
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from fakes.fake_executor import FakeExecutor

from hefbuild.declare.project import load_project
from hefbuild.engine.engine import Engine
from hefbuild.engine.fastpath import FastPath, Verdict
from hefbuild.plan.projectcache import load_project_cached
from hefbuild.store.events import EventLog, Outcome, rotate
from hefbuild.store.groupfile import read_groups, write_groups

from .helpers import MODEL, TASKS, edit, make_tiny_project, model_toml, run_all


def saved(engine: Engine) -> Engine:
    """What the reporter does at the end of an invocation, after every task was decided."""
    for task in TASKS:
        engine.is_uptodate(task)
    engine.fast.save()
    return engine


def assert_fast_equals_full(make_engine: Callable[..., Engine]) -> dict[str, bool]:
    fast = make_engine()
    answers = {t: fast.is_uptodate(t) for t in TASKS}
    full = make_engine()
    truth = {t: full.decide(full.actions[t]).outcome is Outcome.UPTODATE for t in TASKS}
    assert answers == truth
    return answers


def same_size_edit(path: Path) -> None:
    st = path.stat()
    mode = st.st_mode
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.chmod(path, mode)


CHANGES: dict[str, Callable[[Path], None]] = {
    "nothing": lambda root: None,
    "parameter": lambda root: edit(model_toml(root), "max_new_tokens = 16",
                                   "max_new_tokens = 20"),
    "rule code": lambda root: (root / "rules/cpu_ort/quantize.py").write_text("# v2\n"),
    "toolchain env": lambda root: edit(root / "toolchain/host.toml", 'PYTHONHASHSEED = "0"',
                                       'PYTHONHASHSEED = "1"'),
    "file parameter bytes": lambda root: (root / "data/corpus/tiny-stories.txt").write_text(
        "another corpus\n"),
    "upstream output bytes": lambda root: same_size_edit(
        root / "build" / MODEL / "export" / "model.onnx"),
    "own output removed": lambda root: (root / "build" / MODEL / "verify/report.json").unlink(),
    "manifest rewritten, same meaning": lambda root: edit(
        root / "build" / MODEL / "compile/manifest.json", '"key"', '"key" '),
    "declaration deleted": lambda root: model_toml(root).rename(root / "elsewhere.toml"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_the_fast_answer_is_the_full_answer(built, make_engine, root, change):
    saved(built)
    assert all(make_engine().is_uptodate(t) for t in TASKS)
    CHANGES[change](root)
    if change == "declaration deleted":
        assert make_engine().actions == {}
        model_toml(root).parent.joinpath("elsewhere.toml")
        (root / "elsewhere.toml").rename(model_toml(root))  # and re-created, unchanged
    answers = assert_fast_equals_full(make_engine)
    if change in ("nothing", "declaration deleted", "manifest rewritten, same meaning"):
        assert all(answers.values())
    else:
        assert not all(answers.values()), f"{change} went unnoticed"


# -- each verdict covers its own model's declaration files ------------------------------


OTHER = "tiny-other"
OTHER_TASKS = tuple(t.replace(MODEL, OTHER) for t in TASKS)


def two_models(root: Path, make_engine: Callable[..., Engine]) -> None:
    """A second model, a copy of the first under another file name; both built, saved."""
    shutil.copy(model_toml(root), root / "models" / f"{OTHER}.toml")
    engine = make_engine()
    for task in TASKS + OTHER_TASKS:
        engine.run(task)
    engine.fast.save()


def decided_in_full(engine: Engine) -> list[str]:
    decided: list[str] = []
    full = engine.decide
    engine.decide = lambda action: decided.append(action.task) or full(action)
    return decided


@pytest.mark.parametrize("change", ["parameter", "lock made", "file touched"])
def test_a_model_file_change_sends_only_that_models_tasks_down_the_full_path(
        make_engine, root, change):
    two_models(root, make_engine)
    if change == "parameter":
        edit(model_toml(root), "max_new_tokens = 16", "max_new_tokens = 20")
    elif change == "lock made":  # `doit lock` writes one beside the model file
        model_toml(root).with_suffix(".lock.json").write_text("{}")
    else:
        os.utime(model_toml(root))
    engine = make_engine()
    decided = decided_in_full(engine)
    others = {t: engine.is_uptodate(t) for t in OTHER_TASKS}
    assert all(others.values()) and decided == []  # the other model: its verdicts hold
    answers = {t: engine.is_uptodate(t) for t in TASKS}
    assert decided == list(TASKS)  # the edited one: every task decided in full
    full = make_engine()
    assert answers == {t: full.decide(full.actions[t]).outcome is Outcome.UPTODATE
                       for t in TASKS}
    assert answers[f"verify:{MODEL}"] is (change != "parameter")


def test_an_edit_while_the_declarations_load_is_seen_next_time(built, make_engine, root,
                                                               store):
    """The model file changes after it was read and before the verdicts are kept: they
    are kept with the signature it had when read, so the next run does not take the old
    file's verdicts for the new one's."""
    saved(built)
    loaded = load_project(root, store=store)  # reads max_new_tokens = 16
    edit(model_toml(root), "max_new_tokens = 16", "max_new_tokens = 20")
    saved(Engine(loaded, executor=FakeExecutor()))  # decides on what it read, keeps verdicts
    answers = assert_fast_equals_full(make_engine)
    assert answers[f"verify:{MODEL}"] is False


def test_a_changed_toolchain_identity_takes_the_full_path(built, make_engine, monkeypatch):
    saved(built)
    from hefbuild.execute.toolchain import ToolchainResolver

    monkeypatch.setattr(ToolchainResolver, "stamp", lambda self, spec: "reinstalled")
    engine = make_engine()
    decided = []
    full = engine.decide
    engine.decide = lambda action: decided.append(action.task) or full(action)
    assert all(engine.is_uptodate(t) for t in TASKS)  # same packages: still up to date
    assert decided == list(TASKS)  # but each was decided in full


def test_a_damaged_fast_path_file_is_ignored(built, make_engine, root):
    saved(built)
    (root / ".hefbuild" / "fastpath.bin").write_bytes(b"\x00garbage")
    assert all(make_engine().is_uptodate(t) for t in TASKS)


def test_an_answer_is_given_again_only_while_its_verdict_and_files_stand(tmp_path):
    """The preflight and doit's check both ask every task; the second asking is answered
    from the first, so anything that can change the answer must forget it."""
    out = tmp_path / "build" / "m" / "a" / "out.txt"
    out.parent.mkdir(parents=True)
    out.write_text("1")
    fast = FastPath(tmp_path / "fastpath.bin", tmp_path)
    paths = fast.indexes(["build/m/a/out.txt"])
    fast.record("b:m", Verdict(fast.fingerprint("s", paths), "k1", paths))
    assert fast.still_uptodate("b:m", "s") == "k1"
    assert fast.still_uptodate("b:m", "other stamp") is None
    out.unlink()
    out.write_text("2")  # replaced, as the engine replaces a stage dir it rebuilds
    fast.forget("build/m/a")  # which the engine says
    assert fast.still_uptodate("b:m", "s") is None
    fast.record("b:m", Verdict(fast.fingerprint("s", paths), "k2", paths))
    assert fast.still_uptodate("b:m", "s") == "k2"
    fast.drop("b:m")
    assert fast.still_uptodate("b:m", "s") is None


def test_a_damaged_entry_loses_its_own_verdict_only(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("1")
    fast = FastPath(tmp_path / "fastpath.bin", tmp_path)
    paths = fast.indexes(["out.txt"])
    for task in ("a:m", "b:m"):
        fast.record(task, Verdict(fast.fingerprint("s", paths), "k", paths))
    fast.save()
    meta, groups = read_groups(tmp_path / "fastpath.bin")
    paths, tasks = marshal.loads(groups["m"])
    tasks["a:m"] = 7
    write_groups(tmp_path / "fastpath.bin", meta, {"m": marshal.dumps((paths, tasks))})
    again = FastPath(tmp_path / "fastpath.bin", tmp_path)
    assert again.still_uptodate("a:m", "s") is None
    assert again.still_uptodate("b:m", "s") == "k"


def test_a_damaged_file_is_no_verdict_and_no_error(tmp_path):
    (tmp_path / "out.txt").write_text("1")
    fast = FastPath(tmp_path / "fastpath.bin", tmp_path)
    paths = fast.indexes(["out.txt"])
    for model in ("m1", "m2"):
        fast.record(f"a:{model}", Verdict(fast.fingerprint("s", paths), "k", paths))
    fast.save()
    whole = (tmp_path / "fastpath.bin").read_bytes()
    for damaged in (whole[:-3], whole[:9], b"", b"HGF1\xff\xff\xff\x7f", b"junk" * 9):
        (tmp_path / "fastpath.bin").write_bytes(damaged)
        again = FastPath(tmp_path / "fastpath.bin", tmp_path)
        assert again.still_uptodate("a:m2", "s") is None
        mine = again.indexes(["out.txt"])  # indexes are an invocation's own
        again.record("a:m2", Verdict(again.fingerprint("s", mine), "k2", mine))
        again.save()  # what was readable stays, the rest is made again
        assert FastPath(tmp_path / "fastpath.bin", tmp_path).still_uptodate("a:m2", "s") == "k2"
    assert FastPath(tmp_path / "fastpath.bin", tmp_path).still_uptodate("a:m1", "s") is None


def test_a_model_no_task_asked_about_keeps_its_verdicts_through_a_save(tmp_path):
    """Each model's verdicts are decoded when one of its tasks is asked about; a save
    writes the others back as they were read, and they still see a change of their files."""
    for model in ("m1", "m2"):
        (tmp_path / model).mkdir()
        (tmp_path / model / "out.txt").write_text("1")
    first = FastPath(tmp_path / "fastpath.bin", tmp_path)
    for model in ("m1", "m2"):
        paths = first.indexes([f"{model}/out.txt", "shared.txt"])
        first.record(f"a:{model}", Verdict(first.fingerprint("s", paths), f"k-{model}", paths))
    first.save()
    second = FastPath(tmp_path / "fastpath.bin", tmp_path)
    paths = second.indexes(["m1/out.txt"])
    second.record("a:m1", Verdict(second.fingerprint("s", paths), "k-m1-new", paths))
    second.save()  # m2's verdicts never decoded here
    third = FastPath(tmp_path / "fastpath.bin", tmp_path)
    assert third.still_uptodate("a:m1", "s") == "k-m1-new"
    assert third.still_uptodate("a:m2", "s") == "k-m2"
    (tmp_path / "m2" / "out.txt").write_text("22")
    assert FastPath(tmp_path / "fastpath.bin", tmp_path).still_uptodate("a:m2", "s") is None


def test_a_save_encodes_again_only_the_models_whose_verdicts_changed(tmp_path):
    """A no-op after an edit of one model of 1000 asks about every task (so decodes every
    group) and changes one model's verdicts: the others are written back byte for byte as
    read, and still answer; a dropped verdict is gone after the save."""
    (tmp_path / "out.txt").write_text("1")
    first = FastPath(tmp_path / "fastpath.bin", tmp_path)
    paths = first.indexes(["out.txt"])
    for model in ("m1", "m2", "m3"):
        for stage in ("a", "b"):
            first.record(f"{stage}:{model}",
                         Verdict(first.fingerprint("s", paths), f"k-{model}", paths))
    first.save()
    _, before = read_groups(tmp_path / "fastpath.bin")
    second = FastPath(tmp_path / "fastpath.bin", tmp_path)
    assert [second.still_uptodate(f"a:{m}", "s") for m in ("m1", "m2", "m3")] == \
        ["k-m1", "k-m2", "k-m3"]  # every group decoded
    mine = second.indexes(["out.txt"])
    second.record("a:m2", Verdict(second.fingerprint("s", mine), "k-m2-new", mine))
    second.drop("b:m3")
    encoded = []
    real = second._encoded
    second._encoded = lambda verdicts: encoded.append(verdicts[0][0]) or real(verdicts)
    second.save()
    assert sorted(encoded) == ["a:m2", "a:m3"]  # m1's group is not encoded again
    _, after = read_groups(tmp_path / "fastpath.bin")
    assert after["m1"] == before["m1"]
    assert after["m2"] != before["m2"] and after["m3"] != before["m3"]
    third = FastPath(tmp_path / "fastpath.bin", tmp_path)
    assert [third.still_uptodate(t, "s") for t in ("a:m1", "b:m1", "a:m2", "b:m2", "a:m3",
                                                   "b:m3")] == \
        ["k-m1", "k-m1", "k-m2-new", "k-m2", "k-m3", None]


def test_a_built_task_leaves_a_verdict_the_next_invocation_uses(make_engine):
    engine = make_engine()
    assert run_all(engine) == ["built"] * len(TASKS)
    engine.fast.save()
    nxt = make_engine()
    nxt.key_of = lambda action: pytest.fail(f"{action.task}: key computed")
    assert all(nxt.is_uptodate(t) for t in TASKS)


# -- constant-time restore -----------------------------------------------------------


class BigFetch(FakeExecutor):
    """fetch writes a large checkpoint (weights.bin of `mib` MiB)."""

    def __init__(self, mib: int) -> None:
        super().__init__()
        self.mib = mib

    def _write_outputs(self, action):  # noqa: ANN001, ANN202
        super()._write_outputs(action)
        if action["stage"] == "fetch":
            chunk = os.urandom(1 << 20)
            with open(Path(action["out"]) / "checkpoint" / "weights.bin", "wb") as f:
                for _ in range(self.mib):
                    f.write(chunk)


FETCH = f"fetch:{MODEL}"


def test_restoring_a_big_output_rehashes_nothing(root, store, tmp_path):
    fake = BigFetch(64)
    first = Engine(load_project(root, store=store), executor=fake)
    assert first.run(FETCH)["outcome"] == "built"
    shutil.rmtree(root / "build")
    again = Engine(load_project(root, store=store), executor=fake)
    assert again.run(FETCH)["outcome"] == "restored"
    assert again.stats.bytes_hashed == 0
    assert Engine(load_project(root, store=store), executor=fake).is_uptodate(FETCH)

    # Another project sharing the store restores the same object (a new link) ...
    other = make_tiny_project(tmp_path / "other")
    beside = Engine(load_project(other, store=store), executor=fake)
    assert beside.run(FETCH)["outcome"] == "restored"
    assert beside.stats.bytes_hashed < 1 << 20  # its own rule and corpus files, not 64 MiB
    # ... and neither project re-hashes after the other's restore.
    noop = Engine(load_project(root, store=store), executor=fake)
    assert noop.is_uptodate(FETCH) and noop.stats.bytes_hashed == 0
    shutil.rmtree(root / "build")
    restore = Engine(load_project(root, store=store), executor=fake)
    assert restore.run(FETCH)["outcome"] == "restored"
    assert restore.stats.bytes_hashed == 0
    assert fake.ran == [FETCH]


def test_a_same_size_edit_through_a_link_is_caught_and_never_restored(root, store):
    fake = BigFetch(1)
    Engine(load_project(root, store=store), executor=fake).run(FETCH)
    weights = root / "build" / MODEL / "fetch" / "checkpoint" / "weights.bin"
    shutil.rmtree(root / "build")  # a link removed: the object's ctime moves
    engine = Engine(load_project(root, store=store), executor=fake)
    assert engine.run(FETCH)["outcome"] == "restored"
    same_size_edit(weights)  # chmod, write, mtime and mode put back: into the store object
    again = Engine(load_project(root, store=store), executor=fake)
    assert not again.is_uptodate(FETCH)
    assert again.run(FETCH)["outcome"] == "built"  # the object failed its check: rebuilt
    assert fake.ran == [FETCH, FETCH]


# -- declarations parsed once per change ------------------------------------------------


def test_declarations_are_parsed_once_per_change(root, store, monkeypatch):
    import hefbuild.declare.project as project_module

    first = load_project_cached(root, store)
    parsed = []
    real = project_module.load_model
    monkeypatch.setattr(project_module, "load_model",
                        lambda *a, **k: parsed.append(a[0].name) or real(*a, **k))
    again = load_project_cached(root, store)
    assert parsed == [] and again.models == first.models
    edit(model_toml(root), "block_size = 32", "block_size = 16")
    changed = load_project_cached(root, store)
    assert parsed == [f"{MODEL}.toml"]
    assert changed.models[MODEL].stages["quantize"]["block_size"] == 16


def test_a_model_edited_while_it_loads_is_loaded_again_next_time(root, store, monkeypatch):
    import hefbuild.declare.project as project_module

    real = project_module.load_model

    def read_then_edited(path, *args, **kwargs):  # noqa: ANN001, ANN202
        model = real(path, *args, **kwargs)
        monkeypatch.setattr(project_module, "load_model", real)  # once
        edit(path, "block_size = 32", "block_size = 16")
        return model

    monkeypatch.setattr(project_module, "load_model", read_then_edited)
    assert load_project_cached(root, store).models[MODEL].stages["quantize"]["block_size"] == 32
    again = load_project_cached(root, store)  # the cache was made from the old text
    assert again.models[MODEL].stages["quantize"]["block_size"] == 16


def test_a_deleted_file_parameter_is_reported_even_with_a_cached_project(root, store):
    assert MODEL in load_project_cached(root, store).models
    (root / "data/corpus/tiny-stories.txt").unlink()
    project = load_project_cached(root, store)  # the cache must not hide the missing file
    assert MODEL not in project.models
    assert "source.synthetic.corpus" in project.broken[MODEL]


# -- events --------------------------------------------------------------------------


def test_a_no_op_adds_one_summary_line_naming_the_uptodate_tasks(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    log.summary({"uptodate": 3}, ["b", "a", "c"])
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["uptodate"] == ["a", "b", "c"]


def test_the_event_log_rotates(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("x" * 100)
    rotate(path, max_bytes=50)
    assert not path.exists() and (tmp_path / "events.1.jsonl").read_text() == "x" * 100
    path.write_text("y" * 100)
    rotate(path, max_bytes=50)
    assert (tmp_path / "events.2.jsonl").read_text() == "x" * 100
    assert (tmp_path / "events.1.jsonl").read_text() == "y" * 100
    path.write_text("z" * 10)
    rotate(path, max_bytes=50)
    assert path.read_text() == "z" * 10


def test_a_verdict_moves_to_another_process_by_path_names(tmp_path):
    """A `doit -n N` worker's verdict reaches the main process, whose path indexes differ."""
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(name)
    worker = FastPath(tmp_path / "fastpath.bin", tmp_path)
    paths = worker.indexes(["b.txt", "a.txt"])
    worker.record("t:m", Verdict(worker.fingerprint("s", paths), "k", paths, "note"))
    main = FastPath(tmp_path / "fastpath.bin", tmp_path)
    main.indexes(["a.txt"])  # its own table, in another order
    main.adopt("t:m", worker.portable("t:m"))
    assert main.still_uptodate("t:m", "s") == "k" and main.note("t:m") == "note"
    for bad in (None, 7, ("f", "k"), ("f", "k", [3], ""), ("f", None, ["a.txt"], "")):
        main.adopt("u:m", bad)
        assert main.verdict("u:m") is None
    (tmp_path / "a.txt").write_text("changed")
    main.forget_all()
    assert main.still_uptodate("t:m", "s") is None
