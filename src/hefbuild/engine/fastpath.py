"""The no-op fast path: a task's last up-to-date verdict, reused while nothing it read changed.

Deciding that a task is up to date means computing its key: digests of its rule's code, its
file parameters and its upstream outputs (through the stat cache), upstream manifests read
as JSON, the toolchain identity. For a no-op of 1000 tasks that is most of the time. So
after each decision hefbuild keeps, per task, the list of files that decision depended on
and a fingerprint of their stat signatures together with the declarations' stamp and the
toolchain's. When the fingerprint is unchanged, the same files with the same bytes would
give the same key and the same verdict, so neither is computed again.

A fingerprint is only ever a reason to skip work, never to trust bytes: any change of size,
mtime, ctime or inode of any listed file, of any declaration, or of the toolchain stamp
sends the task down the full path (which is what `doit explain` always takes).

A task's own model files (its TOML and its lock) are among its listed files, with the
signatures they had before loading read them (ModelSpec.declared); the stamp covers the
other declarations (targets, toolchains, hefbuild's loader code), not the other model
files. So an edit to one model file of 1000 sends that model's tasks down the full path
and leaves the other 999 verdicts standing.

Each file is stat-ed once per invocation (one Engine is one invocation, as doit reads its
task definitions once); a stage dir the engine replaces is forgotten and looked at anew.

On disk: `.hefbuild/fastpath.bin`, a group file (store/groupfile.py) of one group per
model (task names end in `:<model>`) with meta {"format": 5}; each group the marshal of
([relative paths...], {task: (fingerprint, key, (indexes into those paths...), note)}).
A model's group is read and decoded when one of its tasks is first asked about: a no-op of
one model of 1000 maps the file and reads one group, and a group whose verdicts did not
change is written back as it was read, decoded or not (after an edit of one model of 1000,
a save encodes that model's group alone). (marshal: 5000 tasks in a few milliseconds, where
JSON took tens.)
"""

from __future__ import annotations

import hashlib
import marshal
from collections.abc import Callable, MutableMapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..declare.filesig import stat_signature
from ..store.groupfile import read_groups, write_groups

if TYPE_CHECKING:
    from ..declare.project import Project

FORMAT = 5  # 5: a group file


@dataclass(frozen=True)
class Verdict:
    fingerprint: str
    key: str
    paths: tuple[int, ...]  # indexes into the path table
    note: str = ""  # a check's one-line verdict, shown again while it stays up to date


class FastPath:
    def __init__(self, file: Path, root: Path,
                 stamp_of: Callable[[str], str] = lambda toolchain: "") -> None:
        self._file = file
        self._root = str(root)
        self._prefix = self._root + "/"
        self._stamp_of = stamp_of
        self._stamps: dict[str, str] = {}
        self._paths: list[str] = []
        self._index: dict[str, int] | None = None  # made when a path is first looked up
        self._groups: MutableMapping[str, bytes] = {}  # model -> its verdicts, not yet decoded
        self._read_as: dict[str, bytes] = {}  # model -> its group as read, once decoded
        self._changed: set[str] = set()  # models a verdict of which was recorded or dropped
        self._sigs: dict[int, bytes] = {}  # path index -> its stat signature, this invocation
        # A verdict as read (a tuple) until it is asked for: a no-op of one model of 1000
        # reads the file but needs five of them.
        self._verdicts: dict[str, Verdict | tuple] | None = None
        # (task, stamp) -> still_uptodate's answer, while no verdict and no signature
        # changed: the preflight and doit's uptodate check both ask it of every task.
        self._answers: dict[tuple[str, str], str | None] = {}
        self._dirty = False

    def stamp(self, toolchain: str) -> str:
        """The declarations' and the toolchain's stamp, once per invocation."""
        if toolchain not in self._stamps:
            self._stamps[toolchain] = self._stamp_of(toolchain)
        return self._stamps[toolchain]

    def answer(self, task: str, toolchain: str) -> str | None:
        """`still_uptodate` with this invocation's stamp for the task's toolchain."""
        return self.still_uptodate(task, self.stamp(toolchain))

    # -- paths and their signatures ------------------------------------------------------

    def indexes(self, rels: list[str] | tuple[str, ...]) -> tuple[int, ...]:
        self._load()
        if self._index is None:
            self._index = {rel: i for i, rel in enumerate(self._paths)}
        index = self._index
        out = []
        for rel in rels:
            i = index.get(rel)
            if i is None:
                i = index[rel] = len(self._paths)
                self._paths.append(rel)
            out.append(i)
        return tuple(out)

    def _signature(self, i: int) -> bytes:
        sig = self._sigs[i] = stat_signature(self._prefix + self._paths[i])
        return sig

    def pin(self, signed: tuple[tuple[str, bytes], ...]) -> tuple[int, ...]:
        """Files read before this invocation's first stat of them (a model's declaration
        files, read at load), with the signatures taken before they were read: a verdict
        made from what was read then carries those, so an edit during the load shows."""
        indexes = self.indexes([rel for rel, _ in signed])
        for i, (_, sig) in zip(indexes, signed, strict=True):
            if self._sigs.get(i) != sig:
                self._sigs[i] = sig
                self._answers.clear()
        return indexes

    def fingerprint(self, stamp: str, paths: tuple[int, ...]) -> str:
        """The stamp and the signature of each path, in order (the verdict holds the paths,
        so their names need not be hashed)."""
        sigs = self._sigs
        sign = self._signature
        data = b"".join([sigs[i] if i in sigs else sign(i) for i in paths])
        return hashlib.blake2b(stamp.encode() + b"\0" + data, digest_size=16).hexdigest()

    def forget(self, rel_dir: str) -> None:
        """The engine replaced this stage dir: its files are looked at anew."""
        prefix = rel_dir.rstrip("/") + "/"
        for i in [i for i in self._sigs if self._paths[i].startswith(prefix)]:
            del self._sigs[i]
        self._answers.clear()  # any answer may have read one of them

    def forget_all(self) -> None:
        """Other processes may have replaced any file: every file is looked at anew."""
        self._sigs.clear()
        self._answers.clear()

    def paths(self, verdict: Verdict) -> list[str]:
        return [self._paths[i] for i in verdict.paths]

    # -- verdicts --------------------------------------------------------------------

    def verdict(self, task: str) -> Verdict | None:
        verdicts = self._decoded(task)
        verdict = verdicts.get(task)
        if verdict is not None and not isinstance(verdict, Verdict):
            try:
                verdict = verdicts[task] = Verdict(*verdict)
            except TypeError:  # a damaged entry: no verdict
                verdicts.pop(task)
                return None
        return verdict

    def note(self, task: str) -> str:
        verdict = self.verdict(task)
        return verdict.note if verdict is not None else ""

    def still_uptodate(self, task: str, stamp: str) -> str | None:
        """The key of the task's last up-to-date verdict, if nothing it read has changed.
        Asked again in this invocation, the same answer: it is forgotten whenever a verdict
        or a file's signature is (the signatures are this invocation's, stat-ed once)."""
        asked = (task, stamp)
        if asked in self._answers:
            return self._answers[asked]
        # As read (fingerprint, key, paths, note) or a Verdict: no object made to compare
        raw = self._decoded(task).get(task)
        key = None
        if raw is not None:
            try:
                fingerprint, verdict_key, paths = (
                    (raw.fingerprint, raw.key, raw.paths) if isinstance(raw, Verdict)
                    else raw[:3])
                if self.fingerprint(stamp, paths) == fingerprint:
                    key = verdict_key
            except (IndexError, TypeError, ValueError):  # a damaged entry or path index
                key = None
        self._answers[asked] = key
        return key

    def record(self, task: str, verdict: Verdict) -> None:
        if self.verdict(task) != verdict:
            self._decoded(task)[task] = verdict
            self._answers.clear()
            self._dirty = True
            self._changed.add(_model_of(task))

    def portable(self, task: str) -> tuple[str, str, list[str], str] | None:
        """The task's verdict with its paths by name, for another process to `adopt` (the
        path indexes are this invocation's own)."""
        verdict = self.verdict(task)
        if verdict is None:
            return None
        return verdict.fingerprint, verdict.key, self.paths(verdict), verdict.note

    def adopt(self, task: str, portable: object) -> None:
        """A verdict another process kept (`portable`): a worker of `doit -n N` decides and
        runs its stages, and only this process saves. Anything malformed is left out."""
        try:
            fingerprint, key, paths, note = portable  # type: ignore[misc]
            if not all(isinstance(x, str) for x in (fingerprint, key, note, *paths)):
                return
        except (TypeError, ValueError):
            return
        self.record(task, Verdict(fingerprint, key, self.indexes(paths), note))

    def drop(self, task: str) -> None:
        if self._decoded(task).pop(task, None) is not None:
            self._answers.clear()
            self._dirty = True
            self._changed.add(_model_of(task))

    def save(self) -> None:
        if not self._dirty or self._verdicts is None:
            return
        by_model: dict[str, list[str]] = {}
        for task in sorted(self._verdicts):
            if (model := _model_of(task)) in self._changed:
                by_model.setdefault(model, []).append(task)
        # Untouched, decoded or not: as they were read (one edited model of 1000 re-encodes
        # its own group only; a damaged one not decoded is left out).
        groups = {m: g for m in self._groups if (g := self._groups.get(m)) is not None}
        groups.update((m, g) for m, g in self._read_as.items() if m not in self._changed)
        for model, tasks in by_model.items():
            groups[model] = self._encoded([(t, v) for t in tasks
                                           if (v := self.verdict(t)) is not None])
        with suppress(OSError):  # a cache: the next run takes the full path
            write_groups(self._file, {"format": FORMAT}, groups)
        self._dirty = False
        self._changed.clear()

    def _load(self) -> dict[str, Verdict | tuple]:
        if self._verdicts is None:
            self._groups, self._verdicts = _read(self._file), {}
        return self._verdicts

    def _decoded(self, task: str) -> dict[str, Verdict | tuple]:
        """The verdicts, with those of the task's model decoded (its paths joined to this
        invocation's path table)."""
        verdicts = self._verdicts
        if verdicts is None:
            verdicts = self._load()
        model = task.partition(":")[2]  # `_model_of`
        group = self._groups.pop(model, None)
        if group is None:
            return verdicts
        try:
            paths, tasks = marshal.loads(group)
            local = self.indexes(paths)
            entries = list(tasks.items())
        except (ValueError, EOFError, TypeError, AttributeError):
            return verdicts  # a damaged group: its tasks take the full path
        self._read_as[model] = group
        at = local.__getitem__
        for name, raw in entries:
            try:
                fingerprint, key, indexes, note = raw
                verdicts[name] = (fingerprint, key, tuple(map(at, indexes)), note)
            except (ValueError, TypeError, IndexError):
                continue  # a damaged entry: that task takes the full path
        return verdicts

    def _encoded(self, verdicts: list[tuple[str, Verdict]]) -> bytes:
        """One model's group, with a path table of its own (dead paths dropped)."""
        used: dict[int, int] = {}  # index in this invocation's table -> in the group's
        tasks = {t: (v.fingerprint, v.key,
                     tuple(used.setdefault(i, len(used)) for i in v.paths), v.note)
                 for t, v in verdicts}
        return marshal.dumps(([self._paths[i] for i in used], tasks))


def fast_path_of(project: Project) -> FastPath:
    """The project's fast path; stamps from its declarations and toolchain identities."""
    from ..execute.toolchain import ToolchainResolver
    from ..plan.projectcache import shared_stamp_of

    resolver = ToolchainResolver(project.paths.state / "toolchains.json",
                                 project.paths.toolchains)

    def stamp(toolchain: str) -> str:
        return shared_stamp_of(project) + "|" + resolver.stamp(project.toolchains[toolchain])

    return FastPath(project.paths.state / "fastpath.bin", project.paths.root, stamp)


def _model_of(task: str) -> str:
    return task.partition(":")[2]


def _read(file: Path) -> MutableMapping[str, bytes]:
    """model -> its group, each read, decoded and checked when first asked for (`_decoded`)."""
    found = read_groups(file)
    if found is None or not isinstance(found[0], dict) or found[0].get("format") != FORMAT:
        return {}
    return found[1]
