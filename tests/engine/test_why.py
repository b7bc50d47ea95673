"""Why each task ran, in a few words: the `why` of `Engine.run`'s values (what its line
says) and of its event, from the last build's manifest against the new key."""

from __future__ import annotations

import json

from .helpers import MODEL, TASKS, edit, model_toml

QUANTIZE, COMPILE, VERIFY = (f"{s}:{MODEL}" for s in ("quantize", "compile", "verify"))


def whys(engine, tasks=TASKS) -> dict[str, str]:
    return {t: engine.run(t).get("why", "") for t in tasks}


def test_a_first_build_is_new(make_engine):
    assert set(whys(make_engine()).values()) == {"new"}


def test_a_parameter_names_itself_with_both_values(built, make_engine, root):
    edit(model_toml(root), "block_size = 32", "block_size = 16")
    said = whys(make_engine(), (QUANTIZE, COMPILE))
    assert said[QUANTIZE] == "params.block_size 32 → 16"
    # the fake's bytes follow the parameters: compile's input changed, and it says which
    assert said[COMPILE] == "upstream quantize/model.int8.onnx changed"
    event = json.loads((root / "build/events.jsonl").read_text().splitlines()[-1])
    assert event["task"] == COMPILE and event["why"] == said[COMPILE]


def test_a_rule_edit_names_the_file(built, make_engine, root):
    rule = root / "rules/cpu_ort/verify.py"
    rule.write_text(rule.read_text() + "# changed\n")
    assert whys(make_engine(), (VERIFY,)) == {VERIFY: "rules/cpu_ort/verify.py changed"}


def test_a_toolchain_change_is_said(built, make_engine, root):
    edit(root / "toolchain/host.toml", 'PYTHONHASHSEED = "0"', 'PYTHONHASHSEED = "1"')
    assert whys(make_engine(), (TASKS[0],)) == {TASKS[0]: "env.PYTHONHASHSEED '0' → '1'"}


def test_a_restore_says_what_came_back_and_up_to_date_says_nothing(built, make_engine, root):
    edit(model_toml(root), "max_new_tokens = 16", "max_new_tokens = 24")
    make_engine().run(VERIFY)
    edit(model_toml(root), "max_new_tokens = 24", "max_new_tokens = 16")
    engine = make_engine()
    done = engine.run(VERIFY)
    assert (done["outcome"], done["why"]) == ("restored", "params.max_new_tokens 24 → 16")
    assert "why" not in engine.run(VERIFY)  # up to date: nothing ran


def test_a_changed_output_in_build_and_a_forced_run_say_so(built, make_engine, root):
    report = root / f"build/{MODEL}/verify/report.json"
    report.unlink()  # a hard link into the store: a new file, never a write through it
    report.write_text("{}")
    engine = make_engine()
    assert engine.run(VERIFY)["why"] == "report.json changed in build/"
    assert engine.run(VERIFY, force=True)["why"] == "-a: built again"
