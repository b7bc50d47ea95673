"""Which task groups are checks and which name a deployable artifact, as the targets
declare them: the line and table code (summary, groups) reads this and names no stage."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from .targets import TargetSpec, load_targets


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


def checks_of(targets: Iterable[TargetSpec]) -> Checks:
    stages: dict[str, str] = {}
    artifacts: dict[str, str] = {}
    reports: dict[str, str] = {}
    for spec in targets:
        if spec.check and not stages.get(spec.check):
            stages[spec.check] = spec.test_double
        for sdef in spec.stages:
            if sdef.name == spec.check and sdef.report and spec.check not in reports:
                reports[spec.check] = sdef.report.file
        if spec.artifact and spec.artifact.alias:
            artifacts[spec.artifact.alias] = f"{spec.artifact.stage}/{spec.artifact.file}"
    return Checks(stages, artifacts, reports)


@lru_cache(maxsize=1)
def builtin_checks() -> Checks:
    """The checks of hefbuild's own targets: for callers that hand in no project's."""
    return checks_of(load_targets(None).values())
