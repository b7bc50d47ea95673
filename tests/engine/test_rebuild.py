"""What a change rebuilds, what it restores from the store, and what it leaves alone."""

from __future__ import annotations

import json
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
    edit(model_toml(root), "block_size = 32", "block_size = 16")
    assert run_all(make_engine()) == ["uptodate"] * 2 + ["built"] * 3
    assert fake.stages_ran() == ["quantize", "compile", "verify"]
    oracle()


def test_revert_restores_from_store_without_running(built, make_engine, root, fake, oracle):
    edit(model_toml(root), "block_size = 32", "block_size = 16")
    run_all(make_engine())
    fake.ran.clear()
    edit(model_toml(root), "block_size = 16", "block_size = 32")
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
    set_quantize(root, 'method = "static_qdq"\n')  # the method that reads calibration text
    run_all(make_engine())
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


# Each parameter of quantize that only static_qdq reads, with a second valid value.
STATIC_QDQ_ONLY = {"samples": 8, "seq_len": 16, "seed": 3, "per_channel": True,
                   "exclude": ["lm_head"], "op_types": ["MatMul"],
                   "activation_type": "QInt8", "weight_type": "QUInt8",
                   "calibration": "data/calibration/other.txt"}


def set_quantize(root, body: str) -> None:
    """Make `body` the whole [stages.quantize] table of the model file."""
    path = model_toml(root)
    text = path.read_text()
    start = text.index("[stages.quantize]\n") + len("[stages.quantize]\n")
    end = text.index("\n[", start)
    path.write_text(text[:start] + body + text[end:])


def toml(value) -> str:
    return "true" if value is True else json.dumps(value)


def test_a_parameter_the_method_does_not_read_rebuilds_nothing(built, make_engine, root, fake):
    (root / "data/calibration/other.txt").write_text("Another line.\n")
    for name, value in STATIC_QDQ_ONLY.items():
        set_quantize(root, f"{name} = {toml(value)}\n")
        assert run_all(make_engine()) == ["uptodate"] * 5, name
        assert fake.ran == [], name


def test_under_the_method_that_reads_it_the_stage_runs(built, make_engine, root, fake):
    (root / "data/calibration/other.txt").write_text("Another line.\n")
    set_quantize(root, 'method = "static_qdq"\n')
    run_all(make_engine())
    for name, value in STATIC_QDQ_ONLY.items():
        fake.ran.clear()
        set_quantize(root, f'method = "static_qdq"\n{name} = {toml(value)}\n')
        assert run_all(make_engine())[2] == "built", name
        assert fake.stages_ran()[0] == "quantize", name


def test_block_size_is_read_by_weight_only_and_ignored_by_static_qdq(built, make_engine, root,
                                                                     fake):
    set_quantize(root, "block_size = 64\n")
    assert run_all(make_engine())[2] == "built" and fake.stages_ran()[0] == "quantize"
    set_quantize(root, 'method = "static_qdq"\nblock_size = 64\n')
    run_all(make_engine())
    fake.ran.clear()
    set_quantize(root, 'method = "static_qdq"\nblock_size = 128\n')
    assert run_all(make_engine()) == ["uptodate"] * 5 and fake.ran == []
