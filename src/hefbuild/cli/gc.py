"""`doit gc --max-size 10G --max-age 30d [--venvs] [--dry-run]`: keep the local store
bounded (an option not given comes from hefbuild.toml's [gc], the bounds every cluster node
keeps too), and with `--venvs` remove the venv toolchain environments no project declares
any more; `doit store`: where it is, how big, which results and environments fill it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from doit.exceptions import InvalidCommand

from ..declare.bounds import parse_age, parse_size
from ..declare.project import Project
from ..declare.settings import GcSettings
from ..errors import HefbuildError
from ..execute.venv_store import VenvGc, VenvInfo, declared_names, installed, remove_unnamed
from ..store.gc import GcPlan, GcPolicy, StoreSummary, collect_held, store_summary
from ..store.store import STORE_FORMAT
from ..store.storelock import StoreLock
from ..store.upload_queue import pending_by_remote
from .command import HelpfulDoitCmd
from .session import project_at

OPT_MAX_SIZE = {
    "name": "max_size", "long": "max-size", "type": str, "default": "", "metavar": "SIZE",
    "help": "shrink the store to SIZE (e.g. 10G, 500M, 2.5GiB, 0), least recently used first",
}
OPT_MAX_AGE = {
    "name": "max_age", "long": "max-age", "type": str, "default": "", "metavar": "AGE",
    "help": "delete results not used for AGE (e.g. 30d, 12h)",
}
OPT_VENVS = {
    "name": "venvs", "long": "venvs", "type": bool, "default": False,
    "help": "also remove venv toolchain environments that no declared toolchain of any "
            "project using this store names (alone: only those)",
}
OPT_DRY_RUN = {
    "name": "dry_run", "long": "dry-run", "type": bool, "default": False,
    "help": "say what would be deleted, delete nothing",
}


def format_size(n: int) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while power < len(units) - 1 and n >= 1024 ** (power + 1):
        power += 1
    return f"{n} B" if power == 0 else f"{n / 1024**power:.1f} {units[power]}"


def _project() -> Project:
    # doit has changed into the dodo.py folder by now: that is the project root.
    return project_at(str(Path.cwd().absolute()))


def _v1_root() -> Path:
    return _project().paths.store / STORE_FORMAT


def _policy(max_size: str, max_age: str, bounds: GcSettings, venvs: bool) -> GcPolicy | None:
    """The options, each over its [gc] setting; None: `--venvs` alone (results stay)."""
    if not (max_size or max_age or bounds.bounded):
        if venvs:
            return None
        raise InvalidCommand("gc needs a limit: --max-size SIZE (e.g. 10G) and/or --max-age "
                             "AGE (e.g. 30d), or [gc] max_size / max_age in hefbuild.toml "
                             "(or --venvs alone)")
    return GcPolicy(parse_size(max_size) if max_size else bounds.max_bytes,
                    parse_age(max_age) if max_age else bounds.max_age_s, time.time())


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Gc(HelpfulDoitCmd):
    name = "gc"
    doc_purpose = ("delete store results and objects no build/ uses, least recently used "
                   "first; with --venvs, environments no declared toolchain names")
    doc_usage = "[--max-size SIZE] [--max-age AGE] [--venvs] [--dry-run]"
    doc_description = ("Outputs linked from a build/ folder (of any project on this machine) "
                       "are never deleted. Each limit not given comes from [gc] in hefbuild.toml; "
                       "at least one is needed, unless --venvs is given.")
    cmd_options = (OPT_MAX_SIZE, OPT_MAX_AGE, OPT_VENVS, OPT_DRY_RUN)

    def _execute(self, max_size: str, max_age: str, venvs: bool, dry_run: bool,
                 pos_args: list[str] | None = None) -> int:
        if pos_args:
            raise InvalidCommand(f"gc takes no task names, got {' '.join(pos_args)}")
        try:
            project = _project()
            policy = _policy(max_size, max_age, project.settings.gc, venvs)
            v1_root = project.paths.store / STORE_FORMAT
            # Read before the lock: declarations only, and the lock stops every build.
            naming = declared_names(v1_root, [project.paths.root]) if venvs else None
            with StoreLock(v1_root).exclusive(on_wait=_say):
                plan = collect_held(v1_root, policy, dry_run) if policy else None
                envs = remove_unnamed(v1_root / "venvs", naming, dry_run) if naming else None
        except HefbuildError as exc:
            raise InvalidCommand(str(exc)) from exc
        lines = [gc_line(plan, dry_run)] if plan else []
        lines += venv_lines(envs, naming.unsure, dry_run) if envs and naming else []
        self.outstream.write("\n".join(lines) + "\n")
        return 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def gc_line(plan: GcPlan, dry_run: bool) -> str:
    verb, kept = ("would remove", "would keep") if dry_run else ("removed", "kept")
    return (f"gc: {verb} {_count(len(plan.drop_records), 'result')} and "
            f"{_count(len(plan.drop_objects), 'object')}, {format_size(plan.freed_bytes)} "
            f"freed; {kept} {format_size(plan.kept_bytes)} "
            f"({_count(plan.pinned_records, 'result')} and "
            f"{_count(plan.pinned_objects, 'object')} pinned by build/ folders)")


def venv_lines(done: VenvGc, unsure: tuple[str, ...], dry_run: bool) -> list[str]:
    verb = "would remove" if dry_run else "removed"
    kept = len(done.named) + len(done.busy) + len(done.unsure)
    lines = [f"gc: {verb} {_count(len(done.removed), 'environment')} of venv toolchains, "
             f"{format_size(done.freed_bytes)} freed; kept {kept} ({len(done.named)} named "
             f"by a declared toolchain, {len(done.busy)} in use)"]
    lines += [f"  {verb} {_env_name(v)}, {format_size(v.size)}" for v in done.removed]
    if done.unsure:
        lines.append(f"  kept {_count(len(done.unsure), 'environment')}: which ones are "
                     f"declared is not known ({'; '.join(unsure)})")
    return lines


def _env_name(env: VenvInfo) -> str:
    return f"{env.toolchain or '?'} ({env.name})" if env.complete else \
        f"{env.name} (an unfinished creation)"


class StoreInfo(HelpfulDoitCmd):
    name = "store"
    doc_purpose = "show where the store is, its size, its largest results and its environments"
    doc_usage = ""
    doc_description = None
    cmd_options = ()

    def _execute(self, pos_args: list[str] | None = None) -> int:
        if pos_args:
            raise InvalidCommand(f"store takes no arguments, got {' '.join(pos_args)}")
        try:
            v1_root = _v1_root()
            summary = store_summary(v1_root)
        except HefbuildError as exc:
            raise InvalidCommand(str(exc)) from exc
        lines = store_lines(summary, pending_by_remote(v1_root), installed(v1_root / "venvs"))
        self.outstream.write("\n".join(lines) + "\n")
        return 0


def store_lines(summary: StoreSummary, pending: dict[str, int] | None = None,
                envs: list[VenvInfo] | None = None) -> list[str]:
    envs = envs or []
    env_bytes = sum(e.size for e in envs)
    lines = [f"store: {summary.root}",
             f"size: {format_size(summary.total_bytes + env_bytes)} in all: "
             f"{format_size(summary.total_bytes)} in {_count(summary.objects, 'object')}, "
             f"{_count(summary.records, 'result')}; {format_size(env_bytes)} in "
             f"{_count(len(envs), 'environment')} of venv toolchains (venvs/)"]
    for remote, count in sorted((pending or {}).items()):
        lines.append(f"pending uploads: {_count(count, 'result')} to {remote} (sent by the "
                     f"next run with uploads on)")
    if summary.largest:
        lines += ["largest results:",
                  f"  {'size':>10}  {'last used':<16}  {'stage':<10}  key"]
    for rec in summary.largest:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(rec.last_used))
        lines.append(f"  {format_size(rec.size):>10}  {used:<16}  {rec.stage:<10}  "
                     f"{rec.key[:16]}")
    return lines + env_lines(envs)


def env_lines(envs: list[VenvInfo]) -> list[str]:
    """The environments, largest first: when each was made and how long that took."""
    if not envs:
        return []
    lines = ["environments (doit gc --venvs removes those no project declares):",
             f"  {'size':>10}  {'created':<16}  {'took':>6}  {'toolchain':<12}  folder"]
    for env in envs:
        made = time.strftime("%Y-%m-%d %H:%M", time.localtime(env.created_at)) \
            if env.created_at else "unfinished" if not env.complete else "?"
        took = f"{env.seconds:.0f} s" if env.seconds is not None else "–"
        lines.append(f"  {format_size(env.size):>10}  {made:<16}  {took:>6}  "
                     f"{env.toolchain or '?':<12}  {env.name}")
    return lines
