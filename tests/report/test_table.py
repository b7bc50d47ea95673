"""What the terminal says of each task and of a group run (hefbuild.report.table), and the
command-line helpers around it: pure, no doit run."""

from __future__ import annotations

import json
from pathlib import Path

from hefbuild.cli.selection import unknown_task
from hefbuild.cli.session import verbosity
from hefbuild.report.table import (
    blocked_line,
    members,
    progress,
    reason,
    rows,
    table_lines,
    task_line,
)

KNOWN = ["fetch:a", "verify:a", "verify:b", "verify:c", "hef:h", "compile:h"]


def test_each_outcome_has_its_own_line() -> None:
    assert task_line("export:m", {"outcome": "built", "seconds": 12.3, "peak_rss_mb": 812}) \
        == "   built      export:m  12 s, peak 812 MiB"
    assert task_line("export:m", {"outcome": "restored", "seconds": 0.31}) == \
        "   restored   export:m  0.31 s"
    assert task_line("export:m", {"outcome": "remote", "bytes": 1_900_000,
                                  "remote_seconds": 0.4}) == \
        "   remote     export:m  1.9 MB in 0.40 s, verified"
    assert task_line("export:m", {"outcome": "uptodate", "seconds": 0.01}) == \
        "   up to date export:m"
    assert task_line("c:m", {"outcome": "built", "seconds": 4 * 3600 + 5 * 60}).endswith(
        "4 h 05 min")


def test_a_line_says_why_it_ran_and_how_far_the_run_is() -> None:
    built = {"outcome": "built", "seconds": 0.2, "why": "params.samples 32 → 16"}
    assert task_line("quantize:m", built) == \
        "   built      quantize:m  0.20 s — params.samples 32 → 16"
    assert task_line("compile:m", {"outcome": "uptodate", "why": "same bytes upstream"}) == \
        "   up to date compile:m — same bytes upstream"
    assert task_line("quantize:m", built, progress(3, 12)) == \
        "[ 3/12] built      quantize:m  0.20 s — params.samples 32 → 16"
    assert progress(12, 12) == "[12/12] " and progress(1, 1) == ""  # one stage: no count


def test_a_table_covers_named_groups_and_several_named_checks() -> None:
    assert members(["verify"], KNOWN) == ["verify:a", "verify:b", "verify:c"]
    assert members(["verify:a"], KNOWN) == []  # one check: its verdict line says it all
    assert members(["verify:a", "verify:b"], KNOWN) == ["verify:a", "verify:b"]
    assert members(["hef"], KNOWN) == ["hef:h"]
    assert members(["fetch:a"], KNOWN) == []


def test_rows_say_passed_failed_and_not_runnable_with_the_fix(tmp_path: Path) -> None:
    report = {"passed": True, "gate": "teacher_forced", "mean_teacher_forced_agreement": 1.0,
              "min_teacher_forced": 0.9, "mean_logit_cosine": 0.9999, "min_logit_cosine": 0.99,
              "mean_agreement": 1.0, "prompts": [{}, {}]}
    (tmp_path / "build/a/verify").mkdir(parents=True)
    (tmp_path / "build/a/verify/report.json").write_text(json.dumps(report))
    (tmp_path / "build/b/verify.failed").mkdir(parents=True)
    (tmp_path / "build/b/verify.failed/report.json").write_text(json.dumps(
        {**report, "passed": False}))
    failed = {"verify:b": "verify:b: rules/cpu_ort/verify.py failed (exit 1): verify gate "
                          "failed: prompt 'x': cosine 0.5 < 0.99; log: build/b/verify.failed.log",
              "fetch:c": "models/c.toml: source.revision: … run `doit lock:c` to pin it"}
    table = rows(tmp_path, ["verify:a", "verify:b", "verify:c"], {"verify:a"}, failed,
                 {"verify:c"}, {"d": "models/d.toml: model.colour: unknown key"}, ["verify"])
    by_task = {r.task: r for r in table}
    assert by_task["verify:a"].status == "passed"
    assert "teacher-forced agreement 1.000" in by_task["verify:a"].why
    assert (by_task["verify:b"].status, by_task["verify:b"].why) == \
        ("failed", "verify gate failed: prompt 'x': cosine 0.5 < 0.99")
    assert by_task["verify:c"].status == "not runnable"
    assert by_task["verify:c"].why.startswith("fetch:c failed: ") and \
        "doit lock:c" in by_task["verify:c"].why
    assert (by_task["verify:d"].status, by_task["verify:d"].why) == \
        ("not runnable", "models/d.toml: model.colour: unknown key")
    lines = table_lines(table)
    assert lines[0] == "checks:" and lines[-1] == "   1 passed, 1 failed, 2 not runnable"


def test_a_verify_that_failed_without_a_report_could_not_run(tmp_path: Path) -> None:
    failed = {"verify:h": "verify:h: rules/hailo/verify.py failed (exit 1): ssh pi.local "
                          "port 22: connection refused; log: build/h/verify.failed.log"}
    (row,) = rows(tmp_path, ["verify:h"], set(), failed, set(), {}, [])
    assert (row.status, row.why) == ("not runnable", "ssh pi.local port 22: connection refused")


def test_blocked_tasks_are_one_line() -> None:
    assert blocked_line([]) == ""
    line = blocked_line([f"t{i}:m" for i in range(8)])
    assert line == ("   not run    8 tasks after a failure upstream: t0:m, t1:m, t2:m, t3:m, "
                    "t4:m, t5:m, … (2 more)")
    assert reason("x: rules/a.py failed (exit 2): boom; log: build/m/a.failed.log") == "boom"


def test_a_misspelt_task_gets_the_closest_names() -> None:
    known = {"verify:tiny-llama", "verify:tiny-qwen2", "export:tiny-llama", "verify"}
    assert unknown_task(["verfy:tiny-llama"], known).startswith(
        "no task 'verfy:tiny-llama'; did you mean verify:tiny-llama or ")
    assert unknown_task(["-n", "2", "verify:tiny-llama", "verify"], known) is None
    assert unknown_task(["list", "--all"], known) is None  # another command
    assert unknown_task(["run", "zzz"], known) == "no task 'zzz'; `doit list` shows them"


def test_verbosity_is_read_as_doit_reads_it() -> None:
    assert verbosity(["-v", "2", "verify"]) == 2
    assert verbosity(["-v2"]) == 2
    assert verbosity(["--verbosity=1"]) == 1
    assert verbosity(["verify"]) == 0


def test_a_pass_on_the_device_test_double_says_so_in_the_table(tmp_path: Path) -> None:
    (tmp_path / "build/h/verify").mkdir(parents=True)
    (tmp_path / "build/h/verify/report.json").write_text(json.dumps(
        {"passed": True, "mean_agreement": 1.0, "min_token_agreement": 0.5,
         "prompts": [{}], "device": {"fake": True}}))
    (row,) = rows(tmp_path, ["verify:h"], {"verify:h"}, {}, set(), {}, [])
    assert row.status == "passed"
    assert row.why.startswith("on the HailoRT TEST DOUBLE (not a device): mean token agreement")
