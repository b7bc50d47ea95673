"""`doit report`: what the last builds left, gathered into one page (`build/report/index.html`).

Three steps, the middle one pure: `snapshot` reads what `build/` holds (manifests, failed
and running logs, check reports, the event logs, the report's own history), `build_report`
turns it into typed views, `report_html.render` writes them as one self-contained page.

History: stage times come from the event logs (every built or failed task has a line);
check figures are not in events, so each `doit report` appends the current checks' means to
`build/report/history.jsonl`, one line per (model, check, key), and plots what it holds.
A task line that carries `mean_agreement` (should the engine add it) counts as well.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..store.events import Outcome, read_events, read_json
from .checks import Answerer, check_kind, number, read_check, titled
from .model import (
    EVENT_LOGS,
    HISTORY,
    PLOTTED,
    AgreementPoint,
    BuildReport,
    Chain,
    Check,
    ModelReport,
    Run,
    Snapshot,
    Stage,
    StageHistory,
    StageState,
    Unbuilt,
)
from .variants import compare_variants

if TYPE_CHECKING:
    from ..declare.project import Project
    from ..declare.specs import ModelSpec
    from ..declare.targets import TargetSpec


def chains_of(targets: Mapping[str, str],
              declared: Mapping[str, TargetSpec] | None = None) -> dict[str, Chain]:
    """Each model's stages in pipeline order, from model name -> target (`declared`: the
    project's targets; else hefbuild's own)."""
    from ..declare.targets import load_targets

    specs = load_targets(None) if declared is None else declared
    return {name: chain_of(specs[t]) for name, t in targets.items()}


def project_chains(project: Project) -> dict[str, Chain]:
    """Each model's chain, with what its declarations say: its stages' parameters and what
    keeps it out of a plain `doit` (manual, or a source not locked)."""
    models = dict(sorted(project.models.items()))
    chains = chains_of({n: m.target for n, m in models.items()},
                       {m.target: m.pipeline for m in models.values()})
    return {n: replace(c, params=models[n].stages, held_back=held_back(models[n]))
            for n, c in chains.items()}


def held_back(model: ModelSpec) -> tuple[str, ...]:
    why = [f"manual: {model.manual}"] if model.manual else []
    if not model.source.pinned:
        why.append(f"not locked: its source is not pinned to a commit and file digests "
                   f"(`doit lock:{model.variant_of or model.name}`)")
    return tuple(why)


def chain_of(spec: TargetSpec) -> Chain:
    reports = {s.name: s.report for s in spec.stages if s.report is not None}
    return Chain(spec.name, tuple(s.name for s in spec.stages), reports, spec.check,
                 Answerer(spec.device, spec.test_double))


def wanted(chains: Mapping[str, Chain]) -> tuple[list[str], list[str]]:
    """The JSON files and the logs the report looks at."""
    files, logs = [], []
    for model, chain in chains.items():
        for stage in chain.stages:
            base = f"build/{model}/{stage}"
            files.append(f"{base}/manifest.json")
            logs += [f"{base}.failed.log", f"{base}.running.log"]
            if stage in chain.reports:
                file = chain.reports[stage].file
                files += [f"{base}/{file}", f"{base}.failed/{file}"]
    return files, logs


def snapshot(root: Path, chains: Mapping[str, Chain]) -> Snapshot:
    files, logs = wanted(chains)
    found = {rel: data for rel in files if (data := read_json(root / rel)) is not None}
    events: list[dict[str, Any]] = []
    damaged = 0
    for rel in EVENT_LOGS:
        lines, bad = read_events(root / rel)
        events += lines
        damaged += bad
    history, _ = read_events(root / HISTORY)
    return Snapshot(found, frozenset(p for p in logs if (root / p).exists()), tuple(events),
                    tuple(history), damaged)


# -- the views (pure) ----------------------------------------------------------------


def build_report(snap: Snapshot, chains: Mapping[str, Chain], project: str = "",
                 made: str = "", broken: Mapping[str, str] | None = None) -> BuildReport:
    """The views; `broken`: model files that do not load, by name, with their error."""
    history = Past(by_task(snap.events), last_outcomes(snap.events),
                   list(snap.history) + event_history(snap.events))
    models = [model_report(name, chain, snap, history, made) for name, chain in chains.items()]
    unbuilt = [Unbuilt(m.name, why_unbuilt(m.name, chains[m.name], history))
               for m in models if not m.touched]
    unbuilt += [Unbuilt(name, (f"its model file does not load: {error}",))
                for name, error in sorted((broken or {}).items())]
    return BuildReport(
        project, made, last_summary(snap.events), tuple(m for m in models if m.touched),
        tuple(unbuilt), snap.damaged, compare_variants(models, snap.files),
    )


def why_unbuilt(name: str, chain: Chain, past: Past) -> tuple[str, ...]:
    """Why a model has nothing in build/: a stage that failed before it left a log (its
    toolchain, its environment, its declaration), what its declarations hold back, or
    else that no run has asked for it."""
    why = []
    for stage in chain.stages:
        task = f"{stage}:{name}"
        if past.last.get(task) == Outcome.FAILED.value:
            error = next((e.get("error") for e in reversed(past.lines.get(task, []))
                          if e.get("outcome") == Outcome.FAILED.value), None)
            later = " (the stages after it did not run)" if stage != chain.stages[-1] else ""
            why.append(f"{stage} failed{later}: {error or 'no error recorded'}")
            break
    why += chain.held_back
    if not why:
        goal = chain.check or chain.stages[-1]
        why.append(f"no run has built it yet (`doit {goal}:{name}`)")
    return tuple(why)


@dataclass(frozen=True)
class Past:
    """The event logs and the report's history, indexed once for every model."""

    lines: Mapping[str, list[dict[str, Any]]]  # task -> its lines, oldest first
    last: Mapping[str, str]  # task -> its outcome in the last invocation that named it
    checks: list[dict[str, Any]]  # history rows of checks


def by_task(events: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for line in events:
        if "task" in line:
            out.setdefault(str(line["task"]), []).append(line)
    return out


def invocations(events: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The event lines grouped per invocation: each group ends with its summary line (the
    last group has none while a build is running)."""
    groups: list[list[dict[str, Any]]] = [[]]
    for line in events:
        groups[-1].append(line)
        if "summary" in line:
            groups.append([])
    return [g for g in groups if g]


def last_summary(events: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    return next((ln for ln in reversed(list(events)) if "summary" in ln), None)


def last_outcomes(events: Iterable[dict[str, Any]]) -> dict[str, str]:
    """What each task came to in the last invocation that named it."""
    seen: dict[str, str] = {}
    for group in invocations(events):
        for line in group:
            if "summary" in line:
                seen.update({t: Outcome.UPTODATE.value for t in line.get("uptodate", [])})
            elif "outcome" in line and "task" in line:
                seen[line["task"]] = line["outcome"]
    return seen


def model_report(name: str, chain: Chain, snap: Snapshot, past: Past,
                 made: str = "") -> ModelReport:
    tasks = {s: past.lines.get(f"{s}:{name}", []) for s in chain.stages}
    stages = tuple(stage_of(name, s, snap, tasks[s], past.last.get(f"{s}:{name}"))
                   for s in chain.stages)
    checks = tuple(c for s in chain.stages if s in chain.reports
                   if (c := check_of(name, s, chain, snap, tasks[s])) is not None)
    history = tuple(stage_history(s, tasks[s]) for s in chain.stages)
    rows = merge_history(past.checks, history_rows(name, checks, made))[0]
    return ModelReport(name, chain.target, stages, checks, history,
                       agreement_points(name, rows), chain.check, chain.params)


def stage_of(model: str, stage: str, snap: Snapshot, lines: list[dict[str, Any]],
             last_run: str | None) -> Stage:
    base = f"build/{model}/{stage}"
    manifest = snap.files.get(f"{base}/manifest.json")
    done = [e for e in lines if "outcome" in e]
    if f"{base}.running.log" in snap.present:  # a build in progress: what it has said so far
        beat = next((e for e in reversed(lines) if "heartbeat" in e), {})
        return Stage(stage, StageState.RUNNING, key=beat.get("key"), last_run=last_run,
                     log=f"{base}.running.log",
                     peak_mb=(beat.get("heartbeat") or {}).get("rss_mb"))
    if f"{base}.failed.log" in snap.present:
        failed = next((e for e in reversed(done) if e["outcome"] == Outcome.FAILED.value), {})
        return Stage(stage, StageState.FAILED, failed.get("seconds"), None,
                     failed.get("peak_rss_mb"), failed.get("key"), last_run,
                     f"{base}.failed.log", failed.get("error"))
    if manifest is None:  # a failure before the rule ran (its toolchain) leaves no log
        failed = next((e for e in reversed(done) if e["outcome"] == Outcome.FAILED.value), {})
        return Stage(stage, StageState.MISSING, last_run=last_run,
                     error=failed.get("error") if last_run == Outcome.FAILED.value else None)
    try:
        state = StageState(manifest.get("outcome"))
    except ValueError:
        state = StageState.BUILT
    made = next((e for e in reversed(done) if e.get("outcome") == Outcome.BUILT.value
                 and e.get("key") == manifest.get("key")), {})
    return Stage(stage, state, manifest.get("seconds"), manifest.get("build_seconds"),
                 manifest.get("peak_rss_mb"), manifest.get("key"), last_run,
                 env=made.get("env"), env_s=made.get("env_s"),
                 in_remote=tuple(manifest.get("in_remote", ())))


def check_of(model: str, stage: str, chain: Chain, snap: Snapshot,
             lines: list[dict[str, Any]]) -> Check | None:
    """The figures of a stage's declared report: of its failed run when it left one (a
    success removes `<stage>.failed/`), else of its result in build/."""
    declared = chain.reports[stage]
    file = declared.file
    failed_path, path = f"build/{model}/{stage}.failed/{file}", f"build/{model}/{stage}/{file}"
    failed = failed_path in snap.files
    report = snap.files.get(failed_path if failed else path)
    if report is None:
        return None
    kind = check_kind(report)
    manifest = snap.files.get(f"build/{model}/{stage}/manifest.json") or {}
    key = _last_failed_key(lines) if failed else manifest.get("key")
    (figures, threshold, means), prompts = read_check(kind, report, chain.answerer)
    return Check(
        stage, kind, titled(declared.title, report), chain.answerer,
        failed_path if failed else path, failed,
        bool((report.get("device") or {}).get("fake")),
        False if failed else report.get("passed"), figures, prompts, threshold,
        str(report.get("note") or ""), key, _first_time(lines, key), *means,
    )


def _last_failed_key(lines: list[dict[str, Any]]) -> str | None:
    return next((e.get("key") for e in reversed(lines)
                 if e.get("outcome") == Outcome.FAILED.value), None)


def _first_time(lines: list[dict[str, Any]], key: str | None) -> str | None:
    """When the result of `key` was made: its first built (or failed) line, else (built
    elsewhere, or before the oldest log) the first line that names it."""
    mine = [e for e in lines if key and e.get("key") == key and "outcome" in e]
    made = [e for e in mine if e["outcome"] in (Outcome.BUILT.value, Outcome.FAILED.value)]
    return next((e.get("time") for e in made or mine), None)


# -- history -------------------------------------------------------------------------


def stage_history(stage: str, lines: list[dict[str, Any]]) -> StageHistory:
    made = (Outcome.BUILT.value, Outcome.FAILED.value)
    runs = [Run(str(e.get("time", "")), float(e.get("seconds") or 0.0), e["outcome"],
                e.get("key")) for e in lines if e.get("outcome") in made]
    reused = sum(e.get("outcome") in (Outcome.RESTORED.value, Outcome.REMOTE.value)
                 for e in lines)
    return StageHistory(stage, tuple(runs[-PLOTTED:]), len(runs), reused)


def history_rows(model: str, checks: Iterable[Check], made: str) -> list[dict[str, Any]]:
    """The lines `history.jsonl` gets for the checks in build/ now; a result no event
    line dates (restored after its lines rotated away) is dated by this report."""
    return [{"model": model, "check": c.stage, "key": c.key, "time": c.built or made,
             "mean_agreement": c.mean_agreement, "mean_teacher_forced": c.mean_teacher_forced,
             "passed": c.passed, "fake": c.fake_device, "failed_run": c.failed_run}
            for c in checks if c.key and (c.built or made)]


def event_history(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Check figures carried by task lines themselves (none today, see the module doc)."""
    return [{"model": e["task"].split(":", 1)[1], "check": e["task"].split(":", 1)[0],
             "key": e.get("key"), "time": e.get("time"),
             "mean_agreement": e.get("mean_agreement"),
             "mean_teacher_forced": e.get("mean_teacher_forced_agreement"),
             "passed": e.get("outcome") != Outcome.FAILED.value, "fake": bool(e.get("fake"))}
            for e in events if "mean_agreement" in e and ":" in str(e.get("task", ""))]


def merge_history(old: list[dict[str, Any]], current: list[dict[str, Any]]
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """All rows, one per (model, check, key), and those of `current` that are new."""
    seen = {(r.get("model"), r.get("check"), r.get("key")) for r in old}
    new = []
    for row in current:
        ident = (row["model"], row["check"], row["key"])
        if ident not in seen:
            seen.add(ident)
            new.append(row)
    return old + new, new


def agreement_points(model: str, rows: Iterable[dict[str, Any]]) -> tuple[AgreementPoint, ...]:
    points = [AgreementPoint(str(r.get("time") or ""), str(r.get("check")), str(r.get("key")),
                             number(r.get("mean_agreement")), number(r.get("mean_teacher_forced")),
                             r.get("passed"), bool(r.get("fake")))
              for r in rows if r.get("model") == model]
    return tuple(sorted(points, key=lambda p: p.time)[-PLOTTED:])


# -- writing -------------------------------------------------------------------------
