"""Which task groups are checks and which name a deployable artifact, as the targets
declare them: the line and table code (summary, groups) reads this and names no stage."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .targets import TargetSpec


@dataclass(frozen=True)
class Checks:
    # check stage -> how its report's test double is named ("" when the target names none)
    stages: dict[str, str] = field(default_factory=dict)
    # artifact alias -> "<stage>/<file>" under build/<model>/
    artifacts: dict[str, str] = field(default_factory=dict)
    # check stage -> the output that is its report (`report = ...` on the stage)
    reports: dict[str, str] = field(default_factory=dict)

    @property
    def groups(self) -> tuple[str, ...]:
        """The groups whose run ends with a table, one row per model."""
        return (*sorted(self.stages), *sorted(self.artifacts))

    def stage_of(self, task: str) -> str | None:
        """The check stage a task runs, or None when it is no check."""
        stage = task.split(":", 1)[0]
        return stage if ":" in task and stage in self.stages else None

    def double(self, stage: str) -> str:
        return self.stages.get(stage) or "a TEST DOUBLE"

    def report_of(self, stage: str) -> str:
        return self.reports.get(stage, "report.json")


# What a target says of its check and artifact, as plain values (the no-op's task table
# keeps them): (check stage, its test double, its report file, artifact alias, artifact
# "<stage>/<file>"), "" where the target says nothing.
CheckFacts = tuple[str, str, str, str, str]


def check_facts(spec: TargetSpec) -> CheckFacts:
    report = next((s.report.file for s in spec.stages if s.name == spec.check and s.report), "")
    art = spec.artifact
    alias = art.alias if art and art.alias else ""
    return (spec.check or "", spec.test_double or "", report, alias,
            f"{art.stage}/{art.file}" if alias else "")


def checks_of(targets: Iterable[TargetSpec]) -> Checks:
    return checks_from(check_facts(t) for t in targets)


def checks_from(facts: Iterable[CheckFacts | list]) -> Checks:
    stages: dict[str, str] = {}
    artifacts: dict[str, str] = {}
    reports: dict[str, str] = {}
    for check, double, report, alias, artifact in facts:
        if check and not stages.get(check):
            stages[check] = double
        if check and report and check not in reports:
            reports[check] = report
        if alias:
            artifacts[alias] = artifact
    return Checks(stages, artifacts, reports)


@lru_cache(maxsize=1)
def builtin_checks() -> Checks:
    """The checks of hefbuild's own targets: for callers that hand in no project's."""
    from .targets import load_targets

    return checks_of(load_targets(None).values())
