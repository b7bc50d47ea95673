"""What a change rebuilds, what it restores from the store, and what it leaves alone."""

from __future__ import annotations

import shutil

from hefbuild.store.events import Outcome

from .helpers import MODEL, STAGES, TASKS, edit, model_toml, run_all


def outcomes(engine) -> dict[str, Outcome]:
    return {t.split(":")[0]: engine.decide(engine.actions[t]).outcome for t in TASKS}


def test_verify_param_change_dirties_only_verify(built, make_engine, root, fake, oracle):
    edit(model_toml(root), "max_new_tokens = 16", "max_new_tokens = 24")
    engine = make_engine()
    stale = {s for s, o in outcomes(engine).items() if o is not Outcome.UPTODATE}
    assert stale == {"verify"}
    assert run_all(engine) == ["uptodate"] * 4 + ["built"]
    assert fake.stages_ran() == ["verify"]
    oracle()


def test_quantize_param_change_rebuilds_quantize_and_downstream(built, make_engine, root,
                                                                fake, oracle):
    edit(model_toml(root), "samples = 32", "samples = 16")
    assert run_all(make_engine()) == ["uptodate"] * 2 + ["built"] * 3
    assert fake.stages_ran() == ["quantize", "compile", "verify"]
    oracle()


def test_revert_restores_from_store_without_running(built, make_engine, root, fake, oracle):
    edit(model_toml(root), "samples = 32", "samples = 16")
    run_all(make_engine())
    fake.ran.clear()
    edit(model_toml(root), "samples = 16", "samples = 32")
    assert run_all(make_engine()) == ["uptodate"] * 2 + ["restored"] * 3
    assert fake.ran == []
    oracle()


def test_removed_build_dir_is_restored_without_running(built, make_engine, root, fake, oracle):
    shutil.rmtree(root / "build")
    assert run_all(make_engine()) == ["restored"] * 5
    assert fake.ran == []
    oracle()


def test_removed_output_file_is_restored(built, root, fake, oracle):
    (root / "build" / MODEL / "export" / "model.onnx").unlink()
    assert built.decide(built.actions[f"export:{MODEL}"]).outcome is Outcome.RESTORED
    assert built.run(f"export:{MODEL}")["outcome"] == "restored"
    assert fake.ran == []
    oracle()


def test_identical_upstream_bytes_cut_off_downstream(built, make_engine, root, fake, oracle):
    (root / "rules" / "cpu_ort" / "compile.py").write_text("# compile, version 2\n")
    engine = make_engine()
    assert run_all(engine) == ["uptodate"] * 3 + ["built", "uptodate"]
    assert fake.stages_ran() == ["compile"]
    oracle()


def test_common_helper_change_rebuilds_rules_that_import_it(built, make_engine, root, fake):
    (root / "rules" / "common").mkdir()
    (root / "rules" / "common" / "gate.py").write_text("LIMIT = 1\n")
    (root / "rules" / "cpu_ort" / "verify.py").write_text("from common.gate import LIMIT\n")
    run_all(make_engine())
    fake.ran.clear()
    (root / "rules" / "common" / "gate.py").write_text("LIMIT = 2\n")
    stale = {s for s, o in outcomes(make_engine()).items() if o is not Outcome.UPTODATE}
    assert stale == {"verify"}


def test_calibration_content_change_rebuilds_quantize(built, make_engine, root, fake, oracle):
    with open(root / "data" / "calibration" / "tiny-stories.txt", "a") as f:
        f.write("One more story.\n")
    assert run_all(make_engine()) == ["uptodate"] * 2 + ["built"] * 3
    oracle()


def test_toolchain_env_change_rebuilds_everything(built, make_engine, root, fake):
    edit(root / "toolchain" / "host.toml", 'PYTHONHASHSEED = "0"', 'PYTHONHASHSEED = "1"')
    assert run_all(make_engine()) == ["built"] * 5


def test_second_model_with_same_declaration_shares_results(built, make_engine, root, fake,
                                                          oracle):
    shutil.copy(model_toml(root), root / "models" / "twin.toml")
    engine = make_engine()
    assert [engine.run(f"{s}:twin")["outcome"] for s in STAGES] == ["restored"] * 5
    assert fake.ran == []
    oracle()


def test_force_rebuilds_the_task_even_when_stored(built, fake):
    from .helpers import TASKS as ALL

    verify = ALL[-1]
    assert built.run(verify, force=True)["outcome"] == "built"
    assert fake.ran == [verify]


def test_dash_a_forces_only_the_named_tasks():
    from hefbuild.cli.tasks import forced

    assert forced("verify:m", ["-a", "verify:m"])
    assert forced("verify:m", ["verify", "--always-execute"])
    assert not forced("compile:m", ["-a", "verify:m"])  # a dependency is not forced
    assert not forced("verify:m", ["verify:m"])
