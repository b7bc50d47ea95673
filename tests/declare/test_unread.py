"""A parameter no rule reads (its `applies` condition does not hold) leaves the key and is
reported; a file with several mistakes names all of them in one run."""

from __future__ import annotations

import pytest
from samples import SYNTHETIC

from hefbuild.declare.param_schema import parse_params
from hefbuild.declare.params import ParamDef, ParamType, unread
from hefbuild.declare.project import load_project
from hefbuild.errors import SpecError, SpecErrors

QUANTIZE = SYNTHETIC + "\n[stages.quantize]\n"
WARNING = ('models/m.toml: stages.quantize.samples is not read: only method = "static_qdq" '
           'reads it (here method = "weight_only_int8"), so it is left out of the key and '
           'changing it rebuilds nothing')


def test_a_parameter_of_another_method_is_left_out_and_said(model):
    m = model(QUANTIZE + "samples = 16\n")
    assert "samples" not in m.stages["quantize"] and "calibration" not in m.stages["quantize"]
    assert m.unread == (WARNING,)


def test_under_the_method_that_reads_it_it_is_kept_and_nothing_is_said(model):
    m = model(QUANTIZE + 'method = "static_qdq"\nsamples = 16\n')
    assert m.stages["quantize"]["samples"] == 16
    assert "block_size" not in m.stages["quantize"]  # and weight-only's are out
    assert m.unread == ()


def test_defaults_that_do_not_apply_are_dropped_silently(model):
    assert model(SYNTHETIC).unread == ()


def test_a_sweep_base_may_set_what_only_some_variants_read(model):
    text = QUANTIZE + ("samples = 8\n\n[variants.qdq.stages.quantize]\nmethod = \"static_qdq\"\n"
                       "\n[variants.w4.stages.quantize]\nmethod = \"weight_only_int4\"\n"
                       "symmetric = false\n\n[variants.q2.stages.quantize]\nseed = 3\n")
    base = model(text)
    # samples is read by @qdq; @q2 sets seed under weight-only int8, which reads no seed
    assert base.unread == ('models/m.toml: variants.q2.stages.quantize.seed is not read: only '
                           'method = "static_qdq" reads it (here method = "weight_only_int8"), '
                           'so it is left out of the key and changing it rebuilds nothing',)


def test_unread_follows_a_chain_of_conditions():
    schema = {"on": ParamDef(ParamType.BOOL, False),
              "mode": ParamDef(ParamType.STR, "a", when="on"),
              "knob": ParamDef(ParamType.INT, 1, applies=(("mode", ("a",)),))}
    assert unread(schema, {"on": False, "mode": "a", "knob": 1}) == ["mode", "knob"]
    assert unread(schema, {"on": True, "mode": "a", "knob": 1}) == []
    assert unread(schema, {"on": True, "mode": "b", "knob": 1}) == ["knob"]


@pytest.mark.parametrize(("applies", "expected"), [
    ({"mode": "a"}, "targets/t.toml: stages.params.knob.applies.mode: a non-empty list"),
    ({"mood": ["a"]}, "targets/t.toml: stages.params.knob.applies.mood: a parameter of the "
                      "same stage (knob, mode), got 'mood'"),
    ({"mode": ["c"]}, "targets/t.toml: stages.params.knob.applies.mode: values mode can take: "
                      "one of 'a', 'b', got 'c'"),
    ([], "targets/t.toml: stages.params.knob.applies: a table naming parameters"),
])
def test_a_bad_applies_is_one_line(applies, expected):
    declared = {"mode": {"type": "str", "default": "a", "choices": ["a", "b"]},
                "knob": {"type": "int", "default": 1, "applies": applies}}
    with pytest.raises(SpecError) as err:
        parse_params(declared, "stages.params", "targets/t.toml", set())
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_every_mistake_of_a_file_is_named_at_once(load):
    text = (SYNTHETIC.replace('target = "cpu-ort"', 'target = "cpu-ort"\ncolour = "red"')
            + '\n[stages.quantize]\nmethd = "static_qdq"\nblock_size = 33\n'
            + '\n[stages.verify]\nmax_new_tokens = "many"\n\n[stages.compil]\n')
    with pytest.raises(SpecErrors) as err:
        load(text)
    lines = str(err.value).splitlines()
    assert lines[0] == "models/m.toml: 5 mistakes"
    assert [line.split(": ")[1] for line in lines[1:]] == [
        "model.colour", "stages.compil", "stages.quantize.methd", "stages.quantize.block_size",
        "stages.verify.max_new_tokens"]
    assert all(line.startswith("  models/m.toml: ") for line in lines[1:])
    assert "expected an integer, got str 'many'" in lines[5]


def test_one_mistake_is_still_one_line(load):
    with pytest.raises(SpecError) as err:
        load(QUANTIZE + "block_size = 33\n")
    assert not isinstance(err.value, SpecErrors) and "\n" not in str(err.value)
    assert str(err.value).startswith("models/m.toml: stages.quantize.block_size: expected one of")


def test_a_broken_model_is_set_aside_with_all_its_mistakes(proj, tmp_path):
    (proj / "models" / "m.toml").write_text(QUANTIZE + "block_size = 33\nsamples = 0\n")
    project = load_project(proj, store=tmp_path / "store", strict=False)
    lines = project.broken["m"].splitlines()
    assert lines[0] == "models/m.toml: 2 mistakes"
    assert lines[2] == "  models/m.toml: stages.quantize.samples: expected an integer >= 1"


def test_an_unknown_section_is_named_with_the_other_mistakes(load):
    with pytest.raises(SpecErrors) as err:
        load(QUANTIZE + "block_size = 33\n\n[stagse.verify]\n")
    assert [line.split(": ")[1] for line in str(err.value).splitlines()[1:]] == [
        "stagse", "stages.quantize.block_size"]
