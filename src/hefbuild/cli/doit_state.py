"""doit's own state commands, as they mean here.

hefbuild decides up-to-dateness by content keys (build/<model>/<stage>/manifest.json), not by
doit's dependency file; doit's `dumpdb` (which expects a dbm file) and `forget` (which would
forget nothing that matters) are replaced by versions that say so and do the useful thing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import HefbuildError
from .command import HelpfulCommand


def _root() -> Path | None:
    from ..declare.project import find_root

    try:
        return find_root(Path.cwd())
    except HefbuildError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return None


class DumpDB(HelpfulCommand):
    name = "dumpdb"
    doc_purpose = "print doit's dependency file (.hefbuild/doit.json); keys live in manifests"
    doc_usage = ""
    doc_description = None
    cmd_options = ()

    def execute(self, opt_values: dict, pos_args: list[str]) -> int:
        from ..declare.project import STATE_DIR

        root = _root()
        if root is None:
            return 3
        path = root / STATE_DIR / "doit.json"
        print(f"# {path.relative_to(root)}: doit's own record of task runs (JSON backend). It "
              f"decides nothing: each task's key and inputs are in "
              f"build/<model>/<stage>/manifest.json; `doit status` shows every verdict.")
        try:
            print(json.dumps(json.loads(path.read_text()), indent=1, sort_keys=True))
        except FileNotFoundError:
            print("# (no runs recorded yet)")
        except ValueError as exc:
            print(f"ERROR: {path.relative_to(root)} is not valid JSON ({exc}); delete it "
                  f"(it is a cache)", file=sys.stderr)
            return 3
        return 0


class Forget(HelpfulCommand):
    name = "forget"
    doc_purpose = "drop the remembered up-to-date verdicts of TASKs (all without TASK)"
    doc_usage = "[TASK ...]"
    doc_description = None
    cmd_options = ()

    def execute(self, opt_values: dict, pos_args: list[str]) -> int:
        from .session import actions_at, fast_path_at

        root = _root()
        if root is None:
            return 3
        known = actions_at(str(root))
        unknown = [t for t in pos_args if t not in known]
        if unknown:
            print(f"ERROR: '{unknown[0]}' is not a hefbuild stage task (see `doit list`)",
                  file=sys.stderr)
            return 3
        fast = fast_path_at(str(root))
        for task in pos_args or list(known):
            fast.drop(task)
        fast.save()
        which = ", ".join(pos_args) if pos_args else "every task"
        print(f"forgot the last verdicts of {which}: the next run checks their keys again. "
              f"Nothing rebuilds unless an input changed (keys, not doit's records, decide); "
              f"`doit -a TASK` rebuilds a task, `doit clean TASK` takes it out of build/.")
        return 0
