"""The usual length of a stage, from earlier builds (hefbuild.store.history): pure, on literals."""

from __future__ import annotations

import json
from pathlib import Path

from hefbuild.store.history import (
    MAX_BYTES,
    Usual,
    read_durations,
    record_duration,
    rule_fingerprint,
    similar_size,
    usual,
)

RULE = rule_fingerprint({"hailo/compile.py": "ab" * 32})
MB = 1 << 20


def built(task: str, seconds: float, size: int = 100 * MB, rule: str = RULE,
          outcome: str = "built") -> dict:
    return {"task": task, "key": "k", "outcome": outcome, "seconds": seconds,
            "peak_rss_mb": 1.0, "rule": rule, "input_bytes": size}


def test_the_median_of_the_comparable_builds():
    events = [built("compile:a", 3 * 3600), built("compile:b", 4 * 3600),
              built("compile:c", 3.5 * 3600)]
    assert usual(events, "compile", RULE, 100 * MB) == Usual(3.5 * 3600, 3)
    assert usual(events[:2], "compile", RULE, 100 * MB) == Usual(3.5 * 3600, 2)


def test_another_stage_is_not_comparable():
    events = [built("optimize:a", 60.0), built("compile:a", 600.0)]
    assert usual(events, "compile", RULE, 100 * MB) == Usual(600.0, 1)
    assert usual(events, "verify", RULE, 100 * MB) is None


def test_inputs_within_a_factor_of_two_are_comparable():
    events = [built("compile:small", 540.0, size=40 * MB),
              built("compile:same", 4000.0, size=100 * MB),
              built("compile:double", 5000.0, size=200 * MB),
              built("compile:huge", 16000.0, size=900 * MB)]
    assert usual(events, "compile", RULE, 100 * MB) == Usual(4500.0, 2)
    assert usual(events, "compile", RULE, 30 * MB) == Usual(540.0, 1)
    assert usual(events, "compile", RULE, 1 * MB) is None


def test_the_size_factor_at_its_edges():
    assert similar_size(100, 200) and similar_size(200, 100)
    assert not similar_size(100, 201)
    assert similar_size(0, 0) and not similar_size(0, 10)


def test_a_rule_change_starts_a_new_history():
    other = rule_fingerprint({"hailo/compile.py": "cd" * 32})
    assert other != RULE and len(other) == 16
    events = [built("compile:a", 3600.0), built("compile:a", 7200.0, rule=other)]
    assert usual(events, "compile", other, 100 * MB) == Usual(7200.0, 1)


def test_restores_and_failures_are_not_builds():
    events = [built("compile:a", 0.2, outcome="restored"), built("compile:a", 1.0,
              outcome="remote"), built("compile:a", 30.0, outcome="failed"),
              built("compile:a", 1200.0)]
    assert usual(events, "compile", RULE, 100 * MB) == Usual(1200.0, 1)


def test_only_the_recent_builds_count():
    events = [built("compile:a", 100.0)] * 20 + [built("compile:a", 900.0)] * 9
    assert usual(events, "compile", RULE, 100 * MB) == Usual(900.0, 9)


def test_lines_without_the_fields_are_skipped():
    events = [{"task": "compile:a", "outcome": "built", "seconds": 5.0},  # an old event line
              {**built("compile:a", 7.0), "input_bytes": "big"}, {"summary": {}}]
    assert usual(events, "compile", RULE, 100 * MB) is None


def test_the_store_file_is_appended_and_stays_bounded(tmp_path: Path):
    record_duration(tmp_path, "compile:a", "k1", 61.23456, 512.0, RULE, 100 * MB)
    [line] = read_durations(tmp_path)
    assert (line["task"], line["outcome"], line["seconds"]) == ("compile:a", "built", 61.2346)
    assert (line["rule"], line["input_bytes"]) == (RULE, 100 * MB)
    (tmp_path / "durations.jsonl").write_text(
        (json.dumps(built("compile:old", 1.0)) + "\n") * (MAX_BYTES // 100 + 10))
    record_duration(tmp_path, "compile:b", "k2", 2.0, 1.0, RULE, 100 * MB)
    assert (tmp_path / "durations.1.jsonl").exists()
    assert (tmp_path / "durations.jsonl").stat().st_size < 1000
    assert read_durations(tmp_path)[-1]["task"] == "compile:b"  # newest last, older kept


def test_a_broken_line_costs_only_itself(tmp_path: Path):
    record_duration(tmp_path, "compile:a", "k1", 10.0, 1.0, RULE, 5)
    with open(tmp_path / "durations.jsonl", "a") as f:
        f.write('{"task": "compile:a", "outc')  # a write cut by a kill
    record_duration(tmp_path, "compile:a", "k2", 20.0, 1.0, RULE, 5)
    assert usual(read_durations(tmp_path), "compile", RULE, 5) == Usual(15.0, 2)
