"""The benchmarks read hefbuild's end line to label a run that was not a no-op; since the
line ends with the wall time (`… 0 failed in 0.19 s`), that time must not count as a task."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _scale():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("bench_scale", BENCHMARKS / "scale.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_end_line_counts_tasks_and_not_the_wall_time():
    counts = _scale().summary_counts
    assert counts("x\nhefbuild: 0 built, 0 restored, 0 from remote, 50 up to date, 0 failed "
                  "in 0.19 s\n") == {"built": 0, "restored": 0, "from remote": 0,
                                      "up to date": 50, "failed": 0}
    assert counts("hefbuild: 1 built, 2 restored, 0 from remote, 2 up to date, 0 failed in "
                  "3 min 5 s") == {"built": 1, "restored": 2, "from remote": 0,
                                   "up to date": 2, "failed": 0}
    assert counts("no end line") == {}
