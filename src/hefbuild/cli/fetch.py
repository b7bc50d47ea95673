"""`doit fetch TASK...`: bring into build/ what a run in `[cache] download = "minimal"`
left in the remote cache (the outputs and the log of each stage named). A stage whose
bytes the cache no longer holds is built here instead; nothing else runs.

A TASK is what `doit explain` takes: a stage task, an artifact alias or a group. doit
takes a command's name before a group's, so a target's stage group of the same name runs
with `doit run <name>`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import HefbuildError
from .command import HelpfulCommand


class Fetch(HelpfulCommand):
    name = "fetch"
    doc_purpose = ("bring a stage's outputs and log from the remote cache into build/ (what "
                   "download = \"minimal\" left there)")
    doc_usage = "TASK [TASK ...]   (a stage task, an artifact alias, or a group: a stage)"
    doc_description = None
    cmd_options = ()

    def execute(self, opt_values: dict, pos_args: list[str]) -> int:
        from ..declare.project import STATE_DIR, find_root
        from ..store.projectlock import ProjectLock
        from .explain import artifact_aliases, resolve
        from .session import engine_for

        if not pos_args:
            # doit takes a command's name before a task's: a stage group of this name is
            # still `doit run <name>`.
            print(f"ERROR: {self.name} needs at least one task name, e.g. export:tiny-llama "
                  f"(a stage group of that name runs with `doit run {self.name}`)",
                  file=sys.stderr)
            return 3
        try:
            root = find_root(Path.cwd())
            engine = engine_for(str(root))
        except HefbuildError as exc:
            print(f"ERROR: {exc}", file=sys.stderr)
            return 3
        tasks: list[str] = []
        for name in pos_args:
            found = resolve(name, list(engine.actions), artifact_aliases(engine))
            if isinstance(found, str):
                print(f"ERROR: {found}", file=sys.stderr)
                return 3
            tasks += [t for t in found if t not in tasks]
        lock = ProjectLock(root / STATE_DIR / "lock")
        lock.acquire(True, lambda msg: print(msg, file=sys.stderr, flush=True))
        try:
            return _fetch_each(engine, tasks)
        finally:
            engine.fast.save()
            lock.release()


def _fetch_each(engine, tasks: list[str]) -> int:  # noqa: ANN001 - Engine, loaded lazily
    from ..engine.lazy import in_remote
    from ..report.summary import human_bytes

    code = 0
    for task in tasks:
        action = engine.actions[task]
        if not (engine.paths.root / action.out_dir / "manifest.json").is_file():
            print(f"{task}: no result in build/ (run `doit {task}` first)")
            code = 1
            continue
        names = in_remote(engine.paths.root, action.out_dir)
        if not names:
            print(f"{task}: already in build/")
            continue
        try:
            moved = engine.fetch_outputs(task, log=True)
        except HefbuildError as exc:
            print(f"ERROR: {task}: {exc}", file=sys.stderr)
            code = 1
            continue
        print(f"{task}: {len(names)} file(s) into {action.out_dir}/ "
              f"({human_bytes(moved)} from the remote cache)")
    return code
