"""The cpu-ort quantize/verify parameters as a model declares them: defaults, one-line errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hefbuild.declare.specs import load_model
from hefbuild.errors import SpecError

REPO = Path(__file__).resolve().parents[2]
BASE = '[model]\ntarget = "cpu-ort"\n\n[source.synthetic]\narchitecture = "llama"\nseed = 1\n'


@pytest.fixture
def load(tmp_path: Path):
    for rel in ("data/calibration/tiny-stories.txt", "data/corpus/tiny-stories.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, tmp_path / rel)
    (tmp_path / "models").mkdir()

    def run(extra: str):
        path = tmp_path / "models" / "m.toml"
        path.write_text(BASE + extra)
        return load_model(path, tmp_path, {"host"})

    return run


def test_defaults(load) -> None:
    m = load("")
    q, v = m.stages["quantize"], m.stages["verify"]
    assert q == {"method": "weight_only_int8", "block_size": 32, "symmetric": True}
    qdq = load('\n[stages.quantize]\nmethod = "static_qdq"\n').stages["quantize"]
    assert qdq["samples"] == 32 and qdq["activation_type"] == "QUInt8" and qdq["exclude"] == []
    assert "block_size" not in qdq  # weight-only's, not read by static_qdq
    assert (v["gate"], v["min_teacher_forced"], v["min_logit_cosine"], v["near_tie"]) == \
        ("teacher_forced", 0.9, 0.99, 0.5)
    assert v["min_token_agreement"] == 0.5


def test_declared_values(load) -> None:
    m = load('\n[stages.quantize]\nmethod = "static_qdq"\nexclude = ["lm_head"]\n'
             '\n[stages.verify]\ngate = "free_running"\nmin_teacher_forced = 0.95\n')
    assert m.stages["quantize"]["method"] == "static_qdq"
    assert m.stages["quantize"]["exclude"] == ["lm_head"]
    assert m.stages["verify"]["gate"] == "free_running"
    # Read only with the teacher-forced gate (targets/groups/teacher-forced.toml): left out
    # of the key of a free-running check, so changing it rebuilds nothing.
    assert "min_teacher_forced" not in m.stages["verify"]
    tf = load('\n[stages.verify]\nmin_teacher_forced = 0.95\n')
    assert tf.stages["verify"]["min_teacher_forced"] == 0.95


def test_the_hailo_verify_takes_no_new_keys(load) -> None:
    from hefbuild.declare.targets import stage_defs

    hailo_verify = stage_defs(REPO, "hailo10h")["verify"]
    # The device gives text, not logits along the continuation: no teacher-forced gate
    # (near_tie only labels where the device's text first differs).
    assert not {"gate", "min_teacher_forced", "min_logit_cosine"} & set(hailo_verify.params)


@pytest.mark.parametrize(("extra", "expected"), [
    ('\n[stages.quantize]\nmethod = "int3"\n',
     "models/m.toml: stages.quantize.method: expected one of 'weight_only_int8', "
     "'weight_only_int4', 'dynamic_int8', 'static_qdq', got 'int3'"),
    ("\n[stages.quantize]\nblock_size = 24\n",
     "models/m.toml: stages.quantize.block_size: expected one of 16, 32, 64, 128, 256, 512, "
     "1024, got 24"),
    ("\n[stages.quantize]\nblock_size = 8\n", "models/m.toml: stages.quantize.block_size: "),
    ('\n[stages.quantize]\nsymmetric = "yes"\n',
     "models/m.toml: stages.quantize.symmetric: expected true or false"),
    ('\n[stages.quantize]\nexclude = "lm_head"\n',
     "models/m.toml: stages.quantize.exclude: expected a list of strings"),
    ('\n[stages.verify]\ngate = "vibes"\n', "models/m.toml: stages.verify.gate: expected one of"),
    ("\n[stages.verify]\nmin_teacher_forced = 1.5\n",
     "models/m.toml: stages.verify.min_teacher_forced: expected a number <= 1.0"),
    ("\n[stages.verify]\nmin_logit_cosine = 2\n",
     "models/m.toml: stages.verify.min_logit_cosine: expected a number <= 1.0"),
    ("\n[stages.verify]\nnear_tie = -1\n",
     "models/m.toml: stages.verify.near_tie: expected a number >= 0.0"),
])
def test_bad_value_is_one_line_spec_error(load, extra: str, expected: str) -> None:
    with pytest.raises(SpecError) as err:
        load(extra)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(expected), message


def test_an_opset_the_exporter_cannot_use_is_refused_when_loading(load) -> None:
    from hefbuild.errors import SpecError

    with pytest.raises(SpecError, match=r"stages.export.opset: expected an integer >= 10"):
        load("\n[stages.export]\nopset = 9\n")
    assert load("\n[stages.export]\nopset = 10\n").stages["export"]["opset"] == 10
