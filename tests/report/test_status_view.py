"""`doit status`'s grid and detail lines from verdicts (hefbuild.report.status), and the log
follower behind `doit -v 2` (hefbuild.execute.stagelog.LogFollower)."""

from __future__ import annotations

import time
from pathlib import Path

from hefbuild.execute.stagelog import LogFollower
from hefbuild.report.explain import AFTER, BUILD, FAILED, NEVER, RESTORE, UPTODATE, TaskStatus
from hefbuild.report.status import details, grid, task_rows, totals


def chain(model: str, kinds: list[str]) -> list[TaskStatus]:
    stages = ["fetch", "export", "quantize", "compile", "verify"]
    out = []
    for stage, kind in zip(stages, kinds, strict=True):
        task = f"{stage}:{model}"
        if kind == AFTER:
            out.append(TaskStatus(task, kind, "params changed", upstream=f"quantize:{model}"))
        else:
            out.append(TaskStatus(task, kind, "params.samples: 32 -> 16" if kind == BUILD
                                  else "no result in build/" if kind != UPTODATE else ""))
    return out


def test_grid_shows_every_model_and_stage() -> None:
    a = chain("tiny-llama", [UPTODATE, UPTODATE, BUILD, AFTER, AFTER])
    b = chain("tiny-qwen2", [UPTODATE, RESTORE, UPTODATE, UPTODATE, NEVER])
    lines = grid({"tiny-llama": ("cpu-ort", a), "tiny-qwen2": ("cpu-ort", b)},
                 {"quantize:tiny-llama": "build/tiny-llama/quantize.running.log"})
    assert lines[0].split() == ["cpu-ort", "fetch", "export", "quantize", "compile", "verify"]
    assert lines[1].split() == ["tiny-llama", "ok", "ok", "running", "after", "after"]
    assert lines[2].split() == ["tiny-qwen2", "ok", "restore", "ok", "ok", "new"]
    text = details(a + b, {"quantize:tiny-llama": "build/tiny-llama/quantize.running.log"})
    assert "   quantize:tiny-llama: running; follow it: tail -f " \
           "build/tiny-llama/quantize.running.log" in text
    assert "   quantize:tiny-llama: would build: params.samples: 32 -> 16" in text
    assert "   export:tiny-qwen2: would restore from the store (no result in build/)" in text
    assert "   then, after quantize:tiny-llama: compile, verify (each rebuilt only if its " \
           "inputs come out different)" in text
    assert not any("fetch:" in line for line in text)  # up to date: nothing to say
    assert totals(a + b) == "5 up to date, 1 would restore, 1 would build, 1 never built, " \
                            "2 after upstream"


def test_a_failed_task_says_failed_with_its_error_and_log() -> None:
    error = "rules/cpu_ort/verify.py failed (exit 1): gate; log: build/m/verify.failed.log"
    statuses = [*chain("m", [UPTODATE] * 4 + [NEVER])[:4], TaskStatus("verify:m", FAILED, error)]
    assert grid({"m": ("cpu-ort", statuses)}, {})[1].split() == ["m", "ok", "ok", "ok", "ok",
                                                                 "FAILED"]
    assert details(statuses, {}) == [f"   verify:m: failed: {error}"]
    assert totals(statuses) == "4 up to date, 1 failed"
    assert totals([]) == "no tasks"


def test_named_tasks_get_a_line_each() -> None:
    statuses = chain("m", [UPTODATE, UPTODATE, BUILD, AFTER, AFTER])
    lines = task_rows([statuses[0], statuses[2], statuses[4]],
                      {"quantize:m": "build/m/quantize.running.log"})
    assert lines == ["fetch:m     ok",
                     "quantize:m  running  params.samples: 32 -> 16",
                     "verify:m    after    after quantize:m: params changed"]


def test_the_follower_prints_lines_as_they_come_and_skips_heartbeats(tmp_path: Path) -> None:
    log = tmp_path / "x.running.log"
    log.write_text("")
    seen: list[str] = []
    follower = LogFollower(log, seen.append, "[hefbuild] heartbeat: ", poll_s=0.02)
    with follower, open(log, "a") as f:
        f.write("step 1\n[hefbuild] heartbeat: 1 min elapsed\nstep 2 of")
        f.flush()
        deadline = time.monotonic() + 5
        while len(seen) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert seen == ["   | step 1"]  # the unfinished line waits for its end
        f.write(" 3\n")
    assert seen == ["   | step 1", "   | step 2 of 3"]
