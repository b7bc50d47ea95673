"""Recipe sweeps: `[variants.<name>.stages.<stage>]` parsed, merged onto the base model,
validated like the base's stages (one line per mistake), and made models of their own."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from samples import SYNTHETIC

from hefbuild.cli.tablemake import keeps, make_table
from hefbuild.cli.tasks import task_names
from hefbuild.declare.targets import Keep
from hefbuild.declare.variants import merge_stages, parse_variants, variant_name
from hefbuild.errors import SpecError
from hefbuild.plan.actions import plan_model

BASE = SYNTHETIC + "\n[stages.quantize]\nmethod = \"static_qdq\"\nsamples = 8\n"
SWEEP = BASE + """
[variants.w4.stages.quantize]
method = "weight_only_int4"

[variants.s16.stages.quantize]
samples = 16

[variants.cal.stages.quantize]
calibration = "data/calibration/other.txt"
"""


def spec_error(load, text: str) -> str:
    with pytest.raises(SpecError) as err:
        load(text)
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.fixture
def other_calibration(proj):
    (proj / "data/calibration/other.txt").write_text("Another line.\n")


# -- parsing and merging (pure) ---------------------------------------------------------


def test_merge_puts_a_variants_keys_on_the_base_stage_tables():
    base = {"quantize": {"method": "static_qdq", "samples": 8}, "verify": {"seed": 1}}
    merged = merge_stages(base, {"quantize": {"samples": 16}, "compile": {"x": 1}})
    assert merged == {"quantize": {"method": "static_qdq", "samples": 16},
                      "verify": {"seed": 1}, "compile": {"x": 1}}
    assert base["quantize"]["samples"] == 8  # the base's tables are left alone


def test_parse_reads_names_and_stage_tables_in_file_order():
    parsed = parse_variants({"b": {"stages": {"quantize": {"samples": 2}}}, "a": {}}, "f.toml")
    assert [(v.name, v.stages) for v in parsed] == [("b", {"quantize": {"samples": 2}}),
                                                   ("a", {})]
    assert variant_name("smollm2", "w4") == "smollm2@w4"


# -- loading: each variant is a model of its own --------------------------------------


def test_each_variant_is_a_model_named_model_at_variant(load, other_calibration):
    project = load(SWEEP)
    assert set(project.models) == {"m", "m@w4", "m@s16", "m@cal"}
    base = project.models["m"]
    assert base.variant_of == "" and [v.name for v in base.variants] == ["m@w4", "m@s16",
                                                                          "m@cal"]
    w4, s16, cal = (project.models[f"m@{v}"] for v in ("w4", "s16", "cal"))
    assert {w4.variant_of, s16.variant_of, cal.variant_of} == {"m"}
    assert w4.file == "models/m.toml"  # its errors name the file it is declared in
    assert w4.stages["quantize"]["method"] == "weight_only_int4"
    # weight-only int4 reads no calibration: the base's samples leave w4's key
    assert "samples" not in w4.stages["quantize"] and w4.stages["quantize"]["block_size"] == 32
    assert base.unread == ()  # the base's static_qdq reads samples: nothing to warn of
    assert s16.stages["quantize"] == {**base.stages["quantize"], "samples": 16}
    assert cal.stages["quantize"]["calibration"] == "data/calibration/other.txt"
    for variant in (w4, s16, cal):
        assert variant.source == base.source
        for stage in ("fetch", "export", "compile", "verify"):
            assert variant.stages[stage] == base.stages[stage]


def test_a_variant_plans_the_same_actions_but_its_overrides(load, other_calibration):
    project = load(SWEEP)
    base, cal = plan_model(project.models["m"]), plan_model(project.models["m@cal"])
    assert [a.task for a in cal][:2] == ["fetch:m@cal", "export:m@cal"]
    assert cal[0].out_dir == "build/m@cal/fetch"
    for b, v in zip(base, cal, strict=True):
        same = (b.params, b.file_params, b.source, b.toolchain, b.rule, b.upstream)
        other = (v.params, v.file_params, v.source, v.toolchain, v.rule, v.upstream)
        assert (same == other) is (b.stage != "quantize"), b.stage
    quantize = next(a for a in cal if a.stage == "quantize")
    assert quantize.file_params["calibration"] == "data/calibration/other.txt"


def _table(project):
    return make_table(project, project.models)


def test_a_variant_gets_every_task_of_its_target_but_the_lock(load, other_calibration):
    names = task_names(_table(load(SWEEP)))
    assert {"fetch:m@w4", "export:m@w4", "quantize:m@w4", "compile:m@w4",
            "verify:m@w4"} <= names
    hub = ('[model]\ntarget = "cpu-ort"\n\n[source]\nhub = "org/name"\nrevision = "main"\n'
           '\n[variants.w4.stages.quantize]\nmethod = "weight_only_int4"\n')
    names = task_names(_table(load(hub)))
    assert "lock:m" in names and "lock:m@w4" not in names  # one lock: the base's
    assert "fetch:m@w4" in names


def test_a_variant_uses_its_base_models_lock(load, proj):
    import json

    sha, commit = "a" * 64, "c" * 40
    (proj / "models" / "m.lock.json").write_text(json.dumps(
        {"hub": "org/name", "requested_revision": "main", "revision": commit,
         "files": {"model.safetensors": sha}}))
    hub = ('[model]\ntarget = "cpu-ort"\n\n[source]\nhub = "org/name"\nrevision = "main"\n'
           '\n[variants.w4.stages.quantize]\nmethod = "weight_only_int4"\n')
    project = load(hub)
    for name in ("m", "m@w4"):
        src = project.models[name].source
        assert src.pinned and (src.revision, src.files) == (commit, {"model.safetensors": sha})
    assert project.models["m"].variants == (project.models["m@w4"],)


def test_a_variant_is_selected_by_its_task_names():
    from hefbuild.cli.selection import models_named

    known = {"m", "m@w4"}
    assert models_named(["hef:m@w4", "verify:m@w4"], known, set()) == {"m@w4"}
    assert models_named(["verify:m@zz"], known, set()) is None  # doit says it is unknown


def test_a_keep_task_of_a_variant_writes_its_own_file_or_none(load):
    project = load(BASE + '\n[variants.w4.stages.quantize]\nmethod = "weight_only_int4"\n')
    own = Keep("keep", "compile", "model.onnx", "kept/{model}.onnx")
    fixed = Keep("pin", "compile", "model.onnx", "kept/fixed.onnx")
    base, w4 = (replace(m, pipeline=replace(m.pipeline, keep=(own, fixed)))
                for m in (project.models["m"], project.models["m@w4"]))
    assert [k.name for k in keeps(base)] == ["keep", "pin"]
    # kept/fixed.onnx is the base's: never overwritten
    assert [k.name for k in keeps(w4)] == ["keep"]


def test_a_base_model_without_variants_is_as_before(model):
    m = model(BASE)
    assert m.variants == () and m.variant_of == ""


# -- each kind of mistake: one line naming the file and the full key ------------------


@pytest.mark.parametrize(("tables", "expected"), [
    ("[variants.w4.stages.bogus]\nx = 1\n",
     "variants.w4.stages.bogus: unknown key (expected one of: compile, export, fetch, "
     "quantize, verify)"),
    ("[variants.w4.stages.quantize]\nsample = 16\n",
     "variants.w4.stages.quantize.sample: unknown key"),
    ('[variants.w4.stages.quantize]\nsamples = "16"\n',
     "variants.w4.stages.quantize.samples: expected"),
    ("[variants.w4.stages.quantize]\nsamples = 0\n",
     "variants.w4.stages.quantize.samples: expected"),
    ('[variants.w4.stages.quantize]\ncalibration = "data/calibration/none.txt"\n',
     "variants.w4.stages.quantize.calibration: file 'data/calibration/none.txt' does not "
     "exist"),
    ('[variants.w4.stages.quantize]\nmethod = "int3"\n',
     "variants.w4.stages.quantize.method: expected"),
    ('[variants.w4.stages]\nquantize = 3\n',
     "variants.w4.stages.quantize: a table, got int"),
    ('[variants.w4.stages.quantize]\ntoolchain = "nowhere"\n',
     "variants.w4.stages.quantize.toolchain: a toolchain declared in toolchain/"),
    ("[variants.W4.stages.quantize]\nsamples = 16\n",
     "variants.W4: a variant name matching [a-z0-9][a-z0-9_-]* of at most 64 characters, "
     "got 'W4'"),
    ("[variants.\"w@4\".stages.quantize]\nsamples = 16\n",
     "variants.w@4: a variant name matching"),
    ("[variants.w4.source.synthetic]\nseed = 2\n",
     "variants.w4.source: not overridable: a variant changes stage parameters only"),
    ('[variants.w4.model]\ntarget = "hailo10h"\n',
     "variants.w4.model: not overridable"),
    ("[variants.w4.quantize]\nsamples = 16\n",
     "variants.w4.quantize: unknown key (expected one of: stages)"),
    ("[variants]\nw4 = 1\n", "variants.w4: a table ([variants.w4.stages.<stage>]), got int"),
    ("[variants.w4]\nstages = 1\n", "variants.w4.stages: a table of stages, got int"),
])
def test_each_mistake_in_a_variant_is_one_line(load, tables, expected):
    message = spec_error(load, BASE + "\n" + tables)
    assert message.startswith(f"models/m.toml: {expected}"), message


def test_variants_must_be_a_table(load):
    message = spec_error(load, "variants = 1\n" + BASE)
    assert message == "models/m.toml: variants: a table of variants, got int"


def test_a_model_file_name_may_not_hold_the_separator(proj, load):
    (proj / "models" / "a@b.toml").write_text(SYNTHETIC)
    message = spec_error(load, SYNTHETIC)
    assert message == ("models/a@b.toml: a model file name without '@' (it separates a model "
                       "from its variant in task names)")


# -- names: matched whole, bounded so every path made from them fits the file system --


@pytest.mark.parametrize(("name", "key", "got"), [
    ('"ok\\n"', 'variants."ok\\n"', "got 'ok\\n'"),  # `$` in a pattern lets a newline by
    ("v" * 300, f'variants."{"v" * 40}…"', f"got '{'v' * 40}'… (300 characters)"),
    ("v" * 65, f'variants."{"v" * 40}…"', "(65 characters)"),
], ids=["newline", "300-characters", "65-characters"])
def test_a_variant_name_is_matched_whole_and_bounded(load, name, key, got):
    message = spec_error(load, BASE + f"\n[variants.{name}.stages.quantize]\nsamples = 16\n")
    assert message.startswith(f"models/m.toml: {key}: a variant name matching "
                              "[a-z0-9][a-z0-9_-]* of at most 64 characters, "), message
    assert got in message


def test_a_variant_name_of_the_longest_length_is_a_model(load):
    name = "v" * 64
    project = load(BASE + f"\n[variants.{name}.stages.quantize]\nsamples = 16\n")
    assert project.models[f"m@{name}"].stages["quantize"]["samples"] == 16


@pytest.mark.parametrize(("stem", "got"), [
    ("m" * 129, "(129 characters)"),
    ("tiny llama", "got 'tiny llama'"),
    ("-m", "got '-m'"),
    ("m\n", "got 'm\\n'"),
], ids=["129-characters", "space", "leading-dash", "newline"])
def test_a_model_file_name_is_matched_whole_and_bounded(proj, load, stem, got):
    (proj / "models" / f"{stem}.toml").write_text(SYNTHETIC)
    message = spec_error(load, None)  # one line, a newline in the name too
    file = f"models/{stem}.toml" if stem.isprintable() else repr(f"models/{stem}.toml")
    assert message.startswith(f"{file}: a model file name matching "
                              "[A-Za-z0-9][A-Za-z0-9._+-]* of at most 128 characters, "), message
    assert got in message


def test_a_model_file_name_of_the_longest_length_is_a_model(proj, load):
    (proj / "models" / f"{'m' * 128}.toml").write_text(SYNTHETIC)
    assert set(load(None).models) == {"m" * 128}


def test_a_path_too_long_for_the_file_system_is_one_line(load):
    path = "data/" + "x" * 300 + ".txt"
    message = spec_error(load, BASE + f'\n[variants.w4.stages.quantize]\ncalibration = "{path}"\n')
    assert message.startswith("models/m.toml: variants.w4.stages.quantize.calibration: a path "
                              "whose every part fits the file system's limit, got 'data/"), message


def test_a_keep_destination_too_long_with_a_variants_name_is_one_line(proj, load):
    target = (Path(__file__).resolve().parents[2] / "targets" / "cpu-ort.toml").read_text()
    keep = ('[[keep]]\nname = "keepit"\nstage = "compile"\noutput = "model.opt.onnx"\n'
            f'dest = "kept/{{model}}.{"x" * 190}.onnx"\n\n[[stages]]\n')
    (proj / "targets").mkdir()
    for rule in re.findall(r'^rule = "(.*)"', target, re.M):  # a project's target: its rules
        (proj / "rules" / rule).parent.mkdir(parents=True, exist_ok=True)
        (proj / "rules" / rule).write_text("# never run\n")
    (proj / "targets" / "cpu-ort.toml").write_text(target.replace("[[stages]]\n", keep, 1))
    assert "m" in load(BASE).models  # kept/m.xxx….onnx fits
    variant = "v" * 64
    message = spec_error(load, BASE + f"\n[variants.{variant}.stages.quantize]\nsamples = 4\n")
    key = f'variants."{"v" * 40}…"'
    assert message.startswith(f"models/m.toml: {key}: a shorter name: target cpu-ort keeps "
                              "model.opt.onnx as 'kept/"), message
    assert message.endswith("a file name over 255 bytes")


def test_a_broken_variant_sets_aside_its_whole_model_file(proj, tmp_path):
    from hefbuild.declare.project import load_project

    (proj / "models" / "m.toml").write_text(BASE + "\n[variants.w4.stages.quantize]\nx = 1\n")
    (proj / "models" / "ok.toml").write_text(SWEEP.replace("calibration = \"data/calibration/"
                                                           "other.txt\"", "samples = 4"))
    project = load_project(proj, store=tmp_path / "store", strict=False)
    assert set(project.broken) == {"m"} and "variants.w4.stages.quantize.x" in project.broken["m"]
    assert {"ok", "ok@w4", "ok@s16", "ok@cal"} == set(project.models)


# -- the report's comparison (pure) ----------------------------------------------------


def _model_report(name: str, keys: dict[str, str], agreement: float):
    from hefbuild.report.checks import Answerer, CheckKind, PromptFigures
    from hefbuild.report.model import Check, ModelReport, Stage, StageState

    stages = tuple(Stage(s, StageState.BUILT if name == "m" or s == "verify" else
                         StageState.RESTORED, seconds=0.1, build_seconds=2.0, key=k)
                   for s, k in keys.items())
    prompt = PromptFigures("Once", agreement, None, None, None, "", "", True, "")
    check = Check(stage="verify", kind=CheckKind.COMPARISON, title="", answerer=Answerer(),
                  path=f"build/{name}/verify/r.json",
                  failed_run=False, fake_device=False, passed=True, figures=(),
                  prompts=(prompt,), threshold=None, note="", key=keys["verify"], built=None,
                  mean_agreement=agreement, mean_teacher_forced=None)
    return ModelReport(name, "cpu-ort", stages, (check,), (), ())


def test_the_comparison_has_a_column_per_variant_and_marks_shared_stages():
    from hefbuild.report.model import AGREEMENT, MEAN
    from hefbuild.report.variants import compare_variants

    reports = [_model_report("m", {"fetch": "a" * 64, "verify": "b" * 64}, 0.5),
               _model_report("m@w4", {"fetch": "a" * 64, "verify": "c" * 64}, 0.75),
               _model_report("other", {"fetch": "a" * 64, "verify": "b" * 64}, 0.5)]
    files = {"build/m@w4/fetch/manifest.json": {"key": "a" * 64,
                                                "outputs": {"x": {"size": 10},
                                                            "y": {"size": 5}}}}
    (sweep,) = compare_variants(reports, files)
    assert sweep.model == "m" and sweep.columns == ("m", "m@w4")
    fetch, verify = sweep.stages
    assert fetch.shared and not verify.shared and verify.keys == 2
    assert [c.state for c in fetch.cells] == ["built", "restored"]
    assert [c.size for c in fetch.cells] == [None, 15]  # m's manifest is not in `files`
    assert [c.seconds for c in fetch.cells] == [2.0, 2.0]  # the rule's time, once
    rows = {(r.prompt, r.figure): r.values for r in sweep.figures}
    assert rows[("Once", AGREEMENT)] == (0.5, 0.75)
    assert rows[(MEAN, AGREEMENT)] == (0.5, 0.75)
    assert sweep.passed == (("verify", (True, True)),)


def test_a_model_without_variants_makes_no_comparison():
    from hefbuild.report.variants import compare_variants

    assert compare_variants([_model_report("m", {"fetch": "a" * 64, "verify": "b" * 64},
                                           0.5)], {}) == ()


def test_the_comparison_page_escapes_and_names_every_column():
    from hefbuild.report.variants import compare_variants
    from hefbuild.report.variants_html import sweeps_html

    reports = [_model_report("m", {"fetch": "a" * 64, "verify": "b" * 64}, 0.5),
               _model_report("m@w4", {"fetch": "a" * 64, "verify": "c" * 64}, 0.75)]
    page = sweeps_html(compare_variants(reports, {}))
    assert 'data-sweep="m"' in page
    assert '<th data-column="m">m</th>' in page and '<th data-column="m@w4">m@w4</th>' in page
    assert '<tr data-stage="fetch" class="shared">' in page
    assert '<tr data-stage="verify">' in page
    assert '<td class="num best">0.750</td>' in page
