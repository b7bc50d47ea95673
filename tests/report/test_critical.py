"""The end line's wall time and, for a parallel run, its critical path (pure functions of
the run's events and its tasks' dependencies)."""

from __future__ import annotations

from hefbuild.report.critical import critical_path, path_text
from hefbuild.report.summary import summary_line


def event(task: str, start: float, end: float, outcome: str = "built") -> dict:
    return {"task": task, "outcome": outcome, "unix": end, "seconds": end - start}


# Two models side by side; b's make is slow, so b's chain sets the end.
DEPS = {"check:a": ["make:a"], "check:b": ["make:b"], "check": ["check:a", "check:b"],
        "make:a": [], "make:b": []}
EVENTS = [event("make:a", 0, 1), event("make:b", 0, 5), event("check:a", 1, 2),
          event("check:b", 5, 6)]


def test_the_chain_that_ended_last_is_the_critical_path():
    assert critical_path(EVENTS, DEPS) == [("make:b", 5.0), ("check:b", 1.0)]
    assert path_text(critical_path(EVENTS, DEPS)) == \
        "critical path: make:b 5.00 s → check:b 1.00 s"


def test_the_chain_steps_to_the_upstream_it_waited_for_through_tasks_that_took_no_time():
    deps = {"verify:m": ["compile:m", "reference:m"], "compile:m": ["quantize:m"],
            "quantize:m": ["export:m"], "reference:m": []}
    # quantize:m was up to date (no event): compile waited on export through it
    events = [event("export:m", 0, 3), event("reference:m", 0, 1),
              event("compile:m", 3, 7), event("verify:m", 7, 8)]
    assert [t for t, _ in critical_path(events, deps)] == ["export:m", "compile:m", "verify:m"]


def test_no_events_no_path():
    assert critical_path([], DEPS) == []
    assert path_text([]) == ""


def test_the_end_line_has_the_wall_time_and_then_the_path():
    counts = {"built": 4}
    assert summary_line(counts).endswith("0 failed")  # as before, for callers without it
    assert summary_line(counts, 12.34).endswith("0 failed in 12 s")
    line = summary_line(counts, 6.2, path_text(critical_path(EVENTS, DEPS)))
    assert line == ("hefbuild: 4 built, 0 restored, 0 from remote, 0 up to date, 0 failed "
                    "in 6.20 s; critical path: make:b 5.00 s → check:b 1.00 s")
