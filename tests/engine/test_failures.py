"""Failures leave no trace in the store and leave build/ as it was; corruption heals."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from fakes.fake_executor import FakeExecutor

from hefbuild.errors import MissingOutput, RuleFailed, SpecError, StageError, ToolchainMismatch
from hefbuild.report.explain import explain_task

from .helpers import MODEL, TASKS, edit, model_toml, run_all

VERIFY = f"verify:{MODEL}"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def corrupt(path: Path) -> None:
    os.chmod(path, 0o644)
    path.write_bytes(b"bit rot " + path.read_bytes()[8:])


def object_of(engine, root: Path, stage: str, rel: str) -> Path:
    manifest = json.loads((root / "build" / MODEL / stage / "manifest.json").read_text())
    return engine.store.object_path(manifest["outputs"][rel]["digest"])


def stale_verify(make_engine, root: Path):
    """An engine where verify must build (a changed parameter)."""
    edit(model_toml(root), "max_new_tokens = 16", "max_new_tokens = 24")
    engine = make_engine()
    return engine, engine.decide(engine.actions[VERIFY]).key


def test_corrupt_object_is_rebuilt_not_restored(built, make_engine, root, fake, oracle):
    bad = object_of(built, root, "compile", "model.opt.onnx")
    shutil.rmtree(root / "build")
    corrupt(bad)
    assert run_all(make_engine()) == ["restored"] * 3 + ["built", "restored"]
    assert fake.stages_ran() == ["compile"]
    oracle()


def test_corrupt_object_linked_into_build_is_rebuilt(built, make_engine, root, fake, oracle):
    corrupt(object_of(built, root, "compile", "model.opt.onnx"))  # same inode as build/
    assert run_all(make_engine()) == ["uptodate"] * 3 + ["built", "uptodate"]
    oracle()


def test_failing_rule_raises_one_line_naming_task_and_log(built, make_engine, root, fake):
    engine, _ = stale_verify(make_engine, root)
    fake.fail.add("verify")
    with pytest.raises(RuleFailed) as err:
        engine.run(VERIFY)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{VERIFY}: rules/cpu_ort/verify.py failed (exit 1)")
    assert "gate failed: 0.1 < 0.5" in message
    assert message.endswith(f"log: build/{MODEL}/verify.failed.log")


def test_failing_rule_records_nothing_and_keeps_its_report(built, make_engine, root, fake):
    before = snapshot(root / "build" / MODEL / "verify")
    old_key = json.loads(before["manifest.json"])["key"]
    engine, key = stale_verify(make_engine, root)
    fake.fail.add("verify")
    with pytest.raises(RuleFailed):
        engine.run(VERIFY)
    assert not engine.store.has_record(key.hex)
    # The passing report was made for other parameters: it leaves build/ (the store keeps it).
    assert not (root / "build" / MODEL / "verify").exists()
    assert engine.store.has_record(old_key)
    failed = root / "build" / MODEL / "verify.failed"
    assert json.loads((failed / "report.json").read_text()) == {"passed": False}
    failed_log = root / "build" / MODEL / "verify.failed.log"
    assert failed_log.read_text().endswith("gate failed: 0.1 < 0.5\n")
    lines = explain_task(make_engine(), VERIFY)
    assert f"  its last run failed: build/{MODEL}/verify.failed.log; what it wrote: " \
        f"build/{MODEL}/verify.failed/report.json" in lines
    event = json.loads((root / "build" / "events.jsonl").read_text().splitlines()[-1])
    assert (event["task"], event["outcome"], event["key"]) == (VERIFY, "failed", key.hex)


def test_success_after_failure_removes_failed_log(built, make_engine, root, fake, oracle):
    engine, _ = stale_verify(make_engine, root)
    fake.fail.add("verify")
    with pytest.raises(RuleFailed):
        engine.run(VERIFY)
    fake.fail.clear()
    assert engine.run(VERIFY)["outcome"] == "built"
    assert not (root / "build" / MODEL / "verify.failed.log").exists()
    assert not (root / "build" / MODEL / "verify.failed").exists()
    oracle()


def test_going_back_after_a_failure_restores_the_old_result(built, make_engine, root, fake):
    before = snapshot(root / "build" / MODEL / "verify")
    engine, _ = stale_verify(make_engine, root)
    fake.fail.add("verify")
    with pytest.raises(RuleFailed):
        engine.run(VERIFY)
    edit(model_toml(root), "max_new_tokens = 24", "max_new_tokens = 16")
    assert make_engine().run(VERIFY)["outcome"] == "restored"
    after = snapshot(root / "build" / MODEL / "verify")
    assert {k: v for k, v in after.items() if k != "manifest.json"} == \
        {k: v for k, v in before.items() if k != "manifest.json"}
    assert fake.stages_ran() == ["verify"]  # the failed run; the way back ran no rule


def test_missing_declared_file_output(make_engine, fake, store):
    fake.omit["export"] = "export_report.json"
    engine = make_engine()
    engine.run(f"fetch:{MODEL}")
    key = engine.decide(engine.actions[f"export:{MODEL}"]).key
    with pytest.raises(MissingOutput, match="did not write declared output export_report.json"):
        engine.run(f"export:{MODEL}")
    assert not engine.store.has_record(key.hex)


def test_empty_declared_output_folder(make_engine, fake):
    fake.omit["fetch"] = "checkpoint/"
    with pytest.raises(MissingOutput, match="no files in declared output folder checkpoint/"):
        make_engine().run(f"fetch:{MODEL}")


def test_symlink_as_file_output_is_missing(make_engine, root):
    class LinkingExecutor(FakeExecutor):
        def _write_outputs(self, action):
            super()._write_outputs(action)
            out = Path(action["out"])
            if action["stage"] == "compile":
                (out / "model.opt.onnx").unlink()
                os.symlink(root / "data" / "corpus" / "tiny-stories.txt", out / "model.opt.onnx")

    engine = make_engine(LinkingExecutor())
    with pytest.raises(MissingOutput, match="model.opt.onnx"):
        run_all(engine)


def test_interrupted_rule_leaves_no_record_and_no_stage_dir(make_engine, root, fake, store):
    fake.interrupt.add("verify")
    engine = make_engine()
    for task in TASKS[:-1]:
        engine.run(task)
    key = engine.decide(engine.actions[VERIFY]).key
    with pytest.raises(KeyboardInterrupt):
        engine.run(VERIFY)
    assert not engine.store.has_record(key.hex)
    stage_dirs = {p.name for p in (root / "build" / MODEL).iterdir()}
    assert stage_dirs == {"fetch", "export", "quantize", "compile"}
    assert list((store / "v1" / "tmp").iterdir()) == []


def test_interrupted_rebuild_keeps_the_old_stage_dir(built, make_engine, root, fake, oracle):
    before = snapshot(root / "build" / MODEL / "verify")
    engine, key = stale_verify(make_engine, root)
    fake.interrupt.add("verify")
    with pytest.raises(KeyboardInterrupt):
        engine.run(VERIFY)
    assert snapshot(root / "build" / MODEL / "verify") == before
    assert not engine.store.has_record(key.hex)
    fake.interrupt.clear()
    assert engine.run(VERIFY)["outcome"] == "built"
    oracle()


# -- engine bugs, found by these tests --------------------------------------------------


def test_missing_upstream_output_is_a_stage_error(built, root, make_engine):
    (root / "build" / MODEL / "compile" / "model.opt.onnx").unlink()
    engine = make_engine()  # the next invocation
    assert engine.is_uptodate(VERIFY) is False
    with pytest.raises(StageError, match="compile"):
        engine.run(VERIFY)


def test_relative_symlink_in_output_folder_is_refused(make_engine):
    engine = make_engine(SymlinkingFetch("weights.bin"))
    with pytest.raises(MissingOutput, match="checkpoint/"):
        engine.run(f"fetch:{MODEL}")


def test_absolute_symlink_in_output_folder_is_refused(make_engine, tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not the build's")
    engine = make_engine(SymlinkingFetch(str(outside)))
    try:
        with pytest.raises(MissingOutput, match="checkpoint/"):
            engine.run(f"fetch:{MODEL}")
    finally:
        assert oct(outside.stat().st_mode & 0o777) == "0o644"


class SymlinkingFetch(FakeExecutor):
    """Fetch leaves `checkpoint/z-link.bin`, a symlink to `target`."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target

    def _write_outputs(self, action):
        super()._write_outputs(action)
        if action["stage"] == "fetch":
            os.symlink(self.target, Path(action["out"]) / "checkpoint" / "z-link.bin")


# -- refusals before any rule runs ---------------------------------------------------------


def test_missing_pinned_package_refuses_to_run(make_engine, root, fake):
    pinned = '[packages]\nno-such-dist-hefbuild = "1.0"\n'
    edit(root / "toolchain" / "host.toml", "[packages]\n", pinned)
    with pytest.raises(ToolchainMismatch, match="packages.no-such-dist-hefbuild: version 1.0 "
                                                "required, not installed"):
        make_engine().run(f"fetch:{MODEL}")
    assert fake.ran == []


def test_a_missing_vendor_package_says_where_to_get_it(make_engine, root, fake):
    # As toolchain/hailo-dfc-5.3.0-host.toml declares the Dataflow Compiler.
    edit(root / "toolchain" / "host.toml", "[packages]\n",
         '[packages]\nhailo_dataflow_compiler = "5.3.0"\n')
    edit(root / "toolchain" / "host.toml", 'kind = "host"\n',
         'kind = "host"\nwheels_source = "Hailo\'s Developer Zone (hailo.ai, an account is '
         'needed)"\n')
    with pytest.raises(ToolchainMismatch) as err:
        make_engine().run(f"fetch:{MODEL}")
    assert "packages.hailo_dataflow_compiler: version 5.3.0 required, not installed in " \
        in str(err.value)
    assert str(err.value).endswith("(download it from Hailo's Developer Zone (hailo.ai, an "
                                   "account is needed) and install it, or run the stage in "
                                   "another toolchain)")
    assert fake.ran == []


def test_unbuilt_upstream_is_a_stage_error(make_engine, fake):
    with pytest.raises(StageError, match=f"upstream fetch:{MODEL} has no result in build/"):
        make_engine().run(f"export:{MODEL}")
    assert fake.ran == []


def test_missing_rule_program_is_a_stage_error(make_engine, root, fake):
    (root / "rules" / "fetch.py").unlink()
    with pytest.raises(StageError, match="rule program rules/fetch.py does not exist"):
        make_engine().run(f"fetch:{MODEL}")


def test_unpinned_hub_fetch_is_a_spec_error_and_logs_nothing(make_engine, root, fake):
    (root / "models" / "hubby.toml").write_text(
        '[model]\ntarget = "cpu-ort"\n[source]\nhub = "org/name"\nrevision = "main"\n')
    with pytest.raises(SpecError, match=r"^models/hubby\.toml: source\.revision: .*doit lock"):
        make_engine().run("fetch:hubby")
    assert fake.ran == []
    assert not (root / "build" / "events.jsonl").exists()


class LinkingExport(FakeExecutor):
    """A rule that hard-links a project file as its output."""

    def __init__(self, victim: Path) -> None:
        super().__init__()
        self.victim = victim

    def _write_outputs(self, action):  # noqa: ANN001, ANN202
        super()._write_outputs(action)
        if action["stage"] == "export":
            out = Path(action["out"]) / "model.onnx"
            out.unlink()
            os.link(self.victim, out)


def test_an_output_hard_linked_to_a_project_file_leaves_that_file_alone(make_engine, root):
    victim = root / "data" / "calibration" / "tiny-stories.txt"
    before = victim.stat()
    engine = make_engine(LinkingExport(victim))
    engine.run(f"fetch:{MODEL}")
    engine.run(f"export:{MODEL}")
    after = victim.stat()
    assert stat.S_IMODE(after.st_mode) == stat.S_IMODE(before.st_mode)  # not made 0444
    out = root / "build" / MODEL / "export" / "model.onnx"
    assert out.stat().st_ino != victim.stat().st_ino  # the store holds its own copy
    assert out.read_bytes() == victim.read_bytes()


def test_a_read_only_store_is_one_line(make_engine, store, monkeypatch):
    import errno

    from hefbuild.errors import StoreError
    from hefbuild.store.store import Store

    def read_only(self, path):  # noqa: ANN001, ANN202
        raise OSError(errno.EROFS, "Read-only file system", str(self.object_path("ab" * 32)))

    monkeypatch.setattr(Store, "put_file", read_only)
    with pytest.raises(StoreError) as err:
        make_engine().run(f"fetch:{MODEL}")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"fetch:{MODEL}: Read-only file system")
    assert "writing the store" in message and "read-only" in message


def test_a_full_project_disk_is_one_line(make_engine, monkeypatch):
    import errno

    from hefbuild.store.store import Store

    def disk_full(self, digest, dest):  # noqa: ANN001, ANN202
        raise OSError(errno.ENOSPC, "No space left on device", str(dest))

    monkeypatch.setattr(Store, "materialize", disk_full)
    with pytest.raises(StageError) as err:
        make_engine().run(f"fetch:{MODEL}")
    message = str(err.value)
    assert "\n" not in message
    assert "No space left on device writing the project" in message
    assert "free some space" in message


def test_dropping_a_corrupt_record_in_a_read_only_store_is_a_miss(built, store, monkeypatch):
    from hefbuild.store.store import Store

    record = next((store / "v1" / "results").rglob("*.json"))
    record.write_text("{not json")
    monkeypatch.setattr(Path, "unlink", lambda self, missing_ok=False: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied", str(self))))
    assert Store(store, built.stats).get_record(record.stem) is None
    built.store.drop_record(record.stem)  # no exception
