"""The build report's data: what `snapshot` read from build/ and the typed views
`build_report` makes of it (content.py), which the renderers draw (html.py, markdown.py,
variants_html.py). Data only: no reading, no rendering."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from .checks import Answerer, CheckKind, PromptFigures

if TYPE_CHECKING:
    from ..declare.targets import StageReport

REPORT_DIR = "build/report"
HISTORY = f"{REPORT_DIR}/history.jsonl"
EVENT_LOGS = ("build/events.2.jsonl", "build/events.1.jsonl", "build/events.jsonl")  # oldest first
KEY_SHOWN = 12
PLOTTED = 60  # the most recent builds (and checked results) a history plot shows


class StageState(str, Enum):
    BUILT = "built"
    RESTORED = "restored"
    REMOTE = "remote"
    FAILED = "failed"
    RUNNING = "running"
    MISSING = "not built"


@dataclass(frozen=True)
class Chain:
    target: str
    stages: tuple[str, ...]
    # What the target declares of its reports: stage -> the file a person reads, and its
    # title; the stage whose report is the model's verdict; how a device check names who
    # answered it.
    reports: Mapping[str, StageReport] = field(default_factory=dict)
    check: str | None = None
    answerer: Answerer = field(default_factory=Answerer)
    # What the model's declarations say, when the project is at hand: each stage's resolved
    # parameters (a sweep shows those that differ), and what keeps the model from being
    # built by a group or a plain `doit` (manual, not locked).
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    held_back: tuple[str, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """What the report reads, by project-relative path."""

    files: Mapping[str, dict[str, Any]]  # JSON objects that exist and parse
    present: frozenset[str]  # logs that exist
    events: tuple[dict[str, Any], ...]  # every event log line, oldest first
    history: tuple[dict[str, Any], ...]
    damaged: int = 0  # event log lines that did not parse


@dataclass(frozen=True)
class Stage:
    name: str
    state: StageState
    seconds: float | None = None  # what the task took when it last did something
    build_seconds: float | None = None  # what the rule took when the result was built
    peak_mb: float | None = None
    key: str | None = None
    last_run: str | None = None  # its outcome in the last invocation that named it
    log: str | None = None  # project-relative: the failed or running log
    error: str | None = None
    # The venv toolchain whose environment this result's build created first, and how long
    # that took (not in `seconds`: engine/envs.py).
    env: str | None = None
    env_s: float | None = None
    # Files of the result that are in the remote cache, not in build/ (download = "minimal")
    in_remote: tuple[str, ...] = ()


@dataclass(frozen=True)
class Check:
    stage: str
    kind: CheckKind
    title: str  # the target's words for what the check compares
    answerer: Answerer
    path: str  # project-relative: the report the figures come from
    failed_run: bool  # from <stage>.failed/: the last run failed
    fake_device: bool
    passed: bool | None
    figures: tuple[tuple[str, str], ...]  # (label, value) of the gated means
    prompts: tuple[PromptFigures, ...]
    threshold: float | None  # the gate on the plot's first series
    note: str
    key: str | None
    built: str | None  # when the result (or the failed run) was made
    mean_agreement: float | None
    mean_teacher_forced: float | None


@dataclass(frozen=True)
class Run:
    time: str
    seconds: float
    outcome: str
    key: str | None


@dataclass(frozen=True)
class StageHistory:
    stage: str
    runs: tuple[Run, ...]  # the last PLOTTED built and failed runs, oldest first
    builds: int  # built and failed runs in the event logs
    reused: int  # restored or fetched from remote


@dataclass(frozen=True)
class AgreementPoint:
    time: str
    check: str
    key: str
    mean_agreement: float | None
    mean_teacher_forced: float | None
    passed: bool | None
    fake: bool


@dataclass(frozen=True)
class ModelReport:
    name: str
    target: str
    stages: tuple[Stage, ...]
    checks: tuple[Check, ...]
    history: tuple[StageHistory, ...]
    agreement: tuple[AgreementPoint, ...]
    check: str | None = None  # the target's verdict stage: the model's badge
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # Chain.params

    @property
    def touched(self) -> bool:
        return any(s.state is not StageState.MISSING for s in self.stages)


@dataclass(frozen=True)
class Unbuilt:
    """A model with nothing in build/, and why (its declarations, a failure before any
    stage left a log, or no run named it yet)."""

    name: str
    why: tuple[str, ...]


@dataclass(frozen=True)
class BuildReport:
    project: str
    made: str
    last_summary: dict[str, Any] | None  # the last invocation's summary line
    models: tuple[ModelReport, ...]  # those with anything in build/
    unbuilt: tuple[Unbuilt, ...]
    damaged_events: int
    sweeps: tuple[Sweep, ...] = ()  # models with variants, side by side (report_variants)


# -- a recipe sweep side by side (variants.py compares, variants_html.py draws) -------

AGREEMENT, TEACHER_FORCED = "agreement", "teacher-forced agreement"
MEAN = ""  # the prompt of a check's row of means


@dataclass(frozen=True)
class StageCell:
    state: str  # built, restored, … (report.StageState's value)
    key: str | None
    seconds: float | None  # what the rule took when the result was built
    size: int | None  # bytes of the declared outputs


@dataclass(frozen=True)
class StageComparison:
    stage: str
    cells: tuple[StageCell, ...]  # one per column

    @property
    def keys(self) -> int:
        """Distinct results among the columns that have one."""
        return len({c.key for c in self.cells if c.key})

    @property
    def shared(self) -> bool:
        return self.keys == 1 and all(c.key for c in self.cells)


@dataclass(frozen=True)
class FigureRow:
    check: str  # the check stage
    prompt: str  # MEAN for the row of means
    figure: str  # AGREEMENT or TEACHER_FORCED
    values: tuple[float | None, ...]  # one per column


@dataclass(frozen=True)
class ParamRow:
    """A stage parameter whose declared value is not the same in every column."""

    stage: str
    name: str
    values: tuple[str, ...]  # one per column, as written ("–": the column has none)


@dataclass(frozen=True)
class Sweep:
    model: str  # the base model
    columns: tuple[str, ...]  # model names: the base (when built) first, then its variants
    stages: tuple[StageComparison, ...]
    figures: tuple[FigureRow, ...]
    passed: tuple[tuple[str, tuple[bool | None, ...]], ...]  # per check: its verdict per column
    params: tuple[ParamRow, ...] = ()  # what makes the columns differ, stage by stage
