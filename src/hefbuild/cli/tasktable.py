"""A project's doit tasks as plain values, read back while nothing they were made from changed.

Beyond bare doit, a no-op spent most of its time loading: importing the declaration classes
(their frozen dataclasses' generated methods alone cost ~13 ms), unpickling the models and
planning them, only to make the very task dicts of the last run. So whenever hefbuild makes
its tasks from the declarations it also keeps them as plain records in `.hefbuild/tasks.bin`,
beside what they were made from:
- the declarations stamp (plan/stamp.py: every declaration file's stat, the existence of the
  files they name, hefbuild's loader code) and the code of this module and of `cli/tasks.py`
  and `cli/tablemake.py`, which turn declarations into records;
- the settings' inputs: `hefbuild.toml`'s stat, the environment variables settings read (a
  credential by its presence only: its value never reaches the file), the netrc file's stat,
  and the existence of the files the settings name.
While all of these are as they were, loading would make the same tasks, so the table gives
them and no declaration is loaded; on any difference the tasks are made from the declarations
(with their errors, if any) and the table is written anew. A table decides nothing about a
result: it holds no key and no digest, only what doit is told and what the reporter shows.

A model's group (its task records, each stage's toolchain and upstream, what its target says)
is decoded when first needed: a no-op of one model of 1000 decodes one. A run that made only
some models' tasks adds their groups to a table whose stamp still holds.

On disk: a group file (store/groupfile.py) whose meta is {"format", "stamp", "named",
"settings_files", "settings", "code", "project": {...}} and whose groups are the marshal of
each model's; replaced atomically.
"""

from __future__ import annotations

import hashlib
import marshal
import os
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from contextlib import suppress
from pathlib import Path
from typing import Any

from ..declare.checks import Checks, checks_from
from ..declare.layout import SETTINGS_FILE, STATE_DIR
from ..plan.stamp import code_stamp, declarations_stamp, file_sig
from ..store.groupfile import read_groups, write_groups

FORMAT = 3  # 2: a group file; 3: the fast path's stamp leaves the model files out
FILE = "tasks.bin"
_CODE = ("cli/tasktable.py", "cli/tablemake.py", "cli/tasks.py", "declare/checks.py",
         "execute/toolchain.py")
# Environment variables whose value is a credential: the stamp takes their presence only.
_SECRET = ("HEFBUILD_REMOTE_TOKEN", "HEFBUILD_REMOTE_USER", "HEFBUILD_REMOTE_PASSWORD")
# Read by settings and the store's location besides HEFBUILD_*.
_ENV = ("HOME", "NETRC", "XDG_CACHE_HOME")

_PROJECT_KEYS = {"models", "broken", "recipes", "images", "uploads"}
_GROUP_KEYS = {"records", "toolchains", "upstream", "target", "checks", "docs", "manual",
               "variant_of", "example", "default", "unread"}
# One doit task: (kind, basename, name, arguments after the root, task_dep, doc).
Record = tuple[str, str, str, tuple, tuple, str]


class TaskTable:
    """The project's part (models, broken ones, toolchains, image tasks, whether uploads are
    on) and each model's group, as made from the declarations."""

    def __init__(self, root: str, head: dict[str, Any], groups: MutableMapping[str, Any],
                 dirty: bool = False) -> None:
        self.root = root
        self.head = head
        self._groups = groups  # model -> its group, as bytes until first needed
        self._dirty = dirty  # not as on disk: `save` writes it
        # Adds the groups of models the table lacks (from the loaded declarations), where
        # a caller other than the run that made it may ask about any model.
        self.fill: Callable[[list[str]], object] | None = None

    # -- the project's part -------------------------------------------------------------

    @property
    def stamp(self) -> str:
        return self.head["stamp"]

    @property
    def models(self) -> list[str]:
        """Every loaded model (variants included), in the declarations' order."""
        return self.head["project"]["models"]

    @property
    def broken(self) -> dict[str, str]:
        return self.head["project"]["broken"]

    @property
    def toolchains(self) -> list[str]:
        return list(self.head["project"]["recipes"])

    @property
    def images(self) -> list[Record]:
        return self.head["project"]["images"]

    @property
    def uploads(self) -> bool:
        """A remote cache with uploads on: the end of a run may have results to send."""
        return self.head["project"]["uploads"]

    def toolchain_stamp(self, toolchain: str) -> str:
        """The fast path's stamp of a toolchain's tasks (engine/fastpath.py `fast_path_of`
        computes the same from the loaded declarations)."""
        from ..execute.toolchain import toolchain_stamp

        recipe = self.head["project"]["recipes"][toolchain]
        return self.head["project"]["shared"] + "|" + toolchain_stamp(recipe, Path(self.root))

    # -- the models' groups -------------------------------------------------------------

    def covers(self, models: Iterable[str]) -> bool:
        """Whether the table has every one of these models' groups, whole."""
        return all(self._decoded(m) is not None for m in models)

    def group(self, model: str) -> dict[str, Any]:
        group = self._decoded(model)
        if group is None and self.fill is not None:
            self.fill([model])
            group = self._decoded(model)
        if group is None:
            raise KeyError(f"{model}: not in the task table")
        return group

    def _decoded(self, model: str) -> dict[str, Any] | None:
        """The model's group, decoded once; None (and forgotten) if absent or damaged."""
        group = self._groups.get(model)
        if isinstance(group, bytes):
            try:
                group = marshal.loads(group)
            except (ValueError, EOFError, TypeError):
                group = None
            if isinstance(group, dict) and group.keys() >= _GROUP_KEYS:
                self._groups[model] = group
            else:
                del self._groups[model]
                group = None
        return group

    def add_group(self, model: str, group: dict[str, Any]) -> None:
        self._groups[model] = group
        self._dirty = True

    def records(self, models: Iterable[str]) -> Iterator[Record]:
        for model in models:
            yield from self.group(model)["records"]

    def toolchain_of(self, task: str) -> str:
        return self.group(task.partition(":")[2])["toolchains"][task]

    def upstream_of(self, task: str) -> list[str]:
        """A stage task's upstream stage tasks (not those it only runs after)."""
        return self.group(task.partition(":")[2])["upstream"].get(task, [])

    def is_stage(self, task: str) -> bool:
        model = task.partition(":")[2]
        return model in self._groups and task in self.group(model)["toolchains"]

    def checks(self, models: Iterable[str]) -> Checks:
        """What the targets of these models say of checks and artifacts (each target once,
        in the order its first model comes)."""
        facts = {}
        for model in models:
            group = self.group(model)
            facts.setdefault(group["target"], group["checks"])
        return checks_from(facts.values())

    # -- on disk --------------------------------------------------------------------------

    def save(self) -> None:
        if not self._dirty:
            return
        groups = {}
        for model in list(self._groups):
            group = self._groups.get(model)  # None: damaged as read
            if group is not None:
                groups[model] = group if isinstance(group, bytes) else marshal.dumps(group)
        with suppress(OSError):  # a cache: the next run loads the declarations
            write_groups(Path(self.root) / STATE_DIR / FILE, self.head, groups)
        self._dirty = False


def new_table(root: str, stamp: str, named: Iterable[str], settings_files: Iterable[str],
              project: dict[str, Any]) -> TaskTable:
    """A table with the project's part and no group yet."""
    named, files = tuple(named), tuple(settings_files)
    head = {"format": FORMAT, "stamp": stamp, "named": named, "settings_files": files,
            "settings": settings_stamp(Path(root), files), "code": code_stamp(_CODE),
            "project": project}
    return TaskTable(root, head, {}, dirty=True)


def read_table(root: str) -> TaskTable | None:
    """The table of the project at `root` if everything it was made from is unchanged."""
    found = read_groups(Path(root) / STATE_DIR / FILE)
    if found is None:
        return None
    head, groups = found
    try:
        if not isinstance(head, dict) or head.get("format") != FORMAT or \
                not head["project"].keys() >= _PROJECT_KEYS or \
                head["code"] != code_stamp(_CODE) or \
                head["settings"] != settings_stamp(Path(root), head["settings_files"]) or \
                head["stamp"] != declarations_stamp(Path(root), head["named"]):
            return None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # damaged: a cache, made again
    return TaskTable(root, head, groups)


def settings_stamp(root: Path, files: Iterable[str], env: dict[str, str] | None = None) -> str:
    """What the settings are read from, as one short string (no credential's value)."""
    env = os.environ if env is None else env
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{SETTINGS_FILE}\0{file_sig(str(root / SETTINGS_FILE))}".encode())
    for name in sorted(n for n in env if n.startswith("HEFBUILD_") or n in _ENV):
        h.update(f"\0{name}={_shown(name, env[name])}".encode())
    home = env.get("HOME", "")
    netrc = env.get("NETRC") or (os.path.join(home, ".netrc") if home else "")
    h.update(f"\0netrc\0{file_sig(netrc) if netrc else '-'}".encode())
    for path in files:
        h.update(f"\0{path}\0{os.path.isfile(path)}".encode())
    return h.hexdigest()


def _shown(name: str, value: str) -> str:
    if name in _SECRET:
        return "(set)" if value else ""
    if name == "HEFBUILD_REMOTE_CACHE" and "@" in value:
        scheme, _, rest = value.partition("://")
        return f"{scheme}://(credentials)@{rest.rpartition('@')[2]}"
    return value
