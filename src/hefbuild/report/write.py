"""`doit report` writes the page: the snapshot of build/, the views, the HTML page and its
Markdown summary (build/report/), and the new checks appended to the report's history.
`current_report` is the reading half alone (`doit report --variants` prints from it)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .content import build_report, history_rows, merge_history, project_chains, snapshot
from .model import HISTORY, REPORT_DIR, BuildReport, Chain, Snapshot


def write_report(root: Path, chains: Mapping[str, Chain] | None = None) -> Path:
    """Write build/report/index.html and summary.md for the project at `root` (its models,
    unless `chains` names them) and append the new checks to the history; the page's path."""
    from .html import render

    report, snap = current_report(root, chains)
    out = root / REPORT_DIR / "index.html"
    _write_atomic(out, render(report))
    from .markdown import render_markdown  # a CI job's summary page shows it

    _write_atomic(root / REPORT_DIR / "summary.md", render_markdown(report))
    current = [row for m in report.models for row in history_rows(m.name, m.checks,
                                                                  report.made)]
    _append_lines(root / HISTORY, merge_history(list(snap.history), current)[1])
    return out


def current_report(root: Path, chains: Mapping[str, Chain] | None = None
                   ) -> tuple[BuildReport, Snapshot]:
    """The views of what build/ holds now (the project's models unless `chains` names
    them), and the snapshot they were made from. Reads only."""
    broken: Mapping[str, str] = {}
    if chains is None:
        from ..plan.projectcache import load_project_cached

        project = load_project_cached(root)
        chains, broken = project_chains(project), project.broken
    snap = snapshot(root, chains)
    made = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # as event lines date
    return build_report(snap, chains, root.name, made, broken), snap


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _append_lines(path: Path, rows: list[dict[str, Any]]) -> None:
    if rows:
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
