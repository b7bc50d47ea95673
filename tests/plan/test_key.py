"""Action keys: one canonical JSON, one digest, and a readable diff between two of them."""

from __future__ import annotations

import copy

import pytest

from hefbuild.digest import Digest, canonical_json
from hefbuild.plan.key import ActionKey, describe, diff_descriptions, short_reason

A, B = "a" * 64, "b" * 64


def base() -> dict:
    return describe(
        stage="quantize", outputs=("model.int8.onnx",), rule={"cpu_ort/quantize.py": A},
        inputs={"export/model.onnx": A},
        files={"calibration": {"path": "data/c.txt", "digest": A}},
        params={"samples": 32, "per_channel": False}, source=None,
        toolchain={"kind": "host", "python": "3.11.7", "packages": {"onnx": "1.23.2"}},
        env={"PYTHONHASHSEED": "0"},
    )


def test_canonical_json_sorts_keys_and_drops_whitespace():
    assert canonical_json({"b": [1, {"d": 1, "c": 2}], "a": "x"}) == \
        '{"a":"x","b":[1,{"c":2,"d":1}]}'


def test_canonical_json_floats_are_stable():
    assert canonical_json([0.1, 1.0, 1e-7, 0.1 + 0.2]) == "[0.1,1.0,1e-07,0.30000000000000004]"
    assert canonical_json(1.0) != canonical_json(1)


def test_canonical_json_refuses_nan():
    with pytest.raises(ValueError):
        canonical_json(float("nan"))


def test_equal_descriptions_give_equal_keys():
    assert ActionKey.of(base()) == ActionKey.of(base())
    reordered = dict(reversed(list(base().items())))
    assert ActionKey.of(reordered).hex == ActionKey.of(base()).hex


def test_key_is_a_digest_of_the_canonical_json():
    key = ActionKey.of(base())
    assert isinstance(key.digest, Digest) and len(key.hex) == 64


CHANGES = {
    "param": lambda d: d["params"].update(samples=16),
    "input digest": lambda d: d["inputs"].update({"export/model.onnx": B}),
    "file digest": lambda d: d["files"]["calibration"].update(digest=B),
    "package version": lambda d: d["toolchain"]["packages"].update(onnx="1.23.3"),
    "python version": lambda d: d["toolchain"].update(python="3.12.0"),
    "env": lambda d: d["env"].update(PYTHONHASHSEED="1"),
    "rule digest": lambda d: d["rule"].update({"cpu_ort/quantize.py": B}),
    "new rule helper": lambda d: d["rule"].update({"common/action.py": A}),
    "declared outputs": lambda d: d.update(declared_outputs=["model.onnx"]),
}


@pytest.mark.parametrize("change", CHANGES)
def test_any_change_gives_a_different_key(change):
    changed = copy.deepcopy(base())
    CHANGES[change](changed)
    assert ActionKey.of(changed).hex != ActionKey.of(base()).hex


def test_int_and_float_params_differ_in_the_key():
    as_float = copy.deepcopy(base())
    as_float["params"]["samples"] = 32.0
    assert ActionKey.of(as_float) != ActionKey.of(base())


def test_source_is_only_in_fetch_descriptions():
    assert "source" not in base()
    fetch = describe(stage="fetch", outputs=("checkpoint/",), rule={}, inputs={}, files={},
                     params={}, source={"synthetic": {"seed": 1}}, toolchain={}, env={})
    assert fetch["source"] == {"synthetic": {"seed": 1}}


def test_diff_names_nested_paths():
    new = copy.deepcopy(base())
    new["params"]["samples"] = 16
    assert diff_descriptions(base(), new) == ["params.samples: 32 -> 16"]


def test_diff_shortens_digests():
    new = copy.deepcopy(base())
    new["inputs"]["export/model.onnx"] = B
    assert diff_descriptions(base(), new) == [
        f"inputs.export/model.onnx: sha256:{A[:12]}… -> sha256:{B[:12]}…"]


def test_diff_shows_added_and_removed_fields():
    new = copy.deepcopy(base())
    new["rule"]["common/action.py"] = A
    del new["params"]["per_channel"]
    assert diff_descriptions(base(), new) == [
        "params.per_channel: False -> (absent)",
        f"rule.common/action.py: (absent) -> sha256:{A[:12]}…",
    ]


def test_diff_of_equal_descriptions_is_empty():
    assert diff_descriptions(base(), base()) == []


def test_diff_shortens_long_values():
    new = copy.deepcopy(base())
    new["params"]["prompts"] = ["word"] * 40
    (line,) = diff_descriptions(base(), new)
    assert line.startswith("params.prompts: (absent) -> ['word'") and line.endswith("…")
    assert len(line) < 120


# -- the short reason on a task's line ----------------------------------------------------

SHORT = [
    ("param", lambda d: d["params"].update(samples=16), "params.samples 32 → 16"),
    ("rule file", lambda d: d["rule"].update({"cpu_ort/quantize.py": B}),
     "rules/cpu_ort/quantize.py changed"),
    ("rule helper", lambda d: d["rule"].update({"common/action.py": A}),
     "rules/common/action.py added"),
    ("upstream output", lambda d: d["inputs"].update({"export/model.onnx": B}),
     "upstream export/model.onnx changed"),
    ("file parameter bytes", lambda d: d["files"]["calibration"].update(digest=B),
     "data/c.txt changed"),
    ("file parameter path", lambda d: d["files"]["calibration"].update(path="data/d.txt"),
     "params.calibration 'data/c.txt' → 'data/d.txt'"),
    ("toolchain", lambda d: d["toolchain"].update(python="3.12.0"),
     "toolchain.python '3.11.7' → '3.12.0'"),
    ("env", lambda d: d["env"].update(PYTHONHASHSEED="1"), "env.PYTHONHASHSEED '0' → '1'"),
    ("gpu", lambda d: d.update(gpu=True), "gpu False → True"),
]


@pytest.mark.parametrize(("what", "change", "said"), SHORT, ids=[s[0] for s in SHORT])
def test_the_short_reason_names_what_changed_in_a_few_words(what, change, said):
    new = copy.deepcopy(base())
    change(new)
    assert short_reason(base(), new) == said


def test_the_short_reason_puts_parameters_first_and_counts_the_rest():
    new = copy.deepcopy(base())
    new["toolchain"]["python"] = "3.12.0"
    new["rule"]["cpu_ort/quantize.py"] = B
    new["params"].update(samples=16, per_channel=True)
    assert short_reason(base(), new) == \
        "params.per_channel False → True, params.samples 32 → 16 (+2 more)"
    assert short_reason(base(), base()) == ""


def test_the_short_reason_cuts_long_values():
    new = copy.deepcopy(base())
    new["params"]["prompts"] = ["word"] * 40
    said = short_reason(base(), new)
    assert said.startswith("params.prompts (absent) → ['word'") and said.endswith("…")
    assert len(said) < 70
