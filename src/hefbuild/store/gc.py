"""Keeping the local store bounded: what to delete (pure), then deleting it under the lock.

Policy (`plan_gc`, no I/O): a record's last use is the mtime of its results file (the
engine touches it on every build, restore and fetch). Unreadable records go first, then
records older than the age limit, then the least recently used (ties by key) until the
objects still needed fit the size limit. A pinned record is never dropped. Last, every
object that no kept record names and nothing pins is dropped. The size of the store is the
sum of its object sizes, each object counted once however many records share it.

Pinned (`pins`): whatever the `build/*/*/manifest.json` of a registered project names (its
record, output objects and that record's log), and every object with more than one hard
link (some build/ links it, registered or not).

`collect` holds the store lock exclusively from the inventory to the last deletion, so a
build never sees its fresh objects deleted before its record and links are in place.

A cluster node's store (`collect_node`) holds mostly objects no record names: the inputs it
fetched and the outputs it uploaded, kept to spare the next stage a download. There each
such object counts as a record of its own, last used when it was last linked (its ctime:
every fetch and every store links it), so the same limits and the same LRU order apply.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import StoreError
from .store import Record
from .storelock import StoreLock, registered_projects

TMP_MAX_AGE_S = 24 * 3600
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class RecordInfo:
    key: str
    size: int  # bytes of the objects it names that are in the store
    last_used: float  # mtime of its results file
    objects: frozenset[str]  # output digests and the log digest
    stage: str = ""
    readable: bool = True  # False: garbage, dropped unless pinned


@dataclass(frozen=True)
class GcPolicy:
    max_bytes: int | None
    max_age_s: float | None
    now: float


@dataclass(frozen=True)
class GcPlan:
    drop_records: list[str]  # in the order chosen: unreadable, expired, then LRU
    drop_objects: list[str]  # sorted
    freed_bytes: int
    kept_bytes: int
    pinned_records: int = 0  # pinned and present in the store
    pinned_objects: int = 0


# -- policy (pure) -------------------------------------------------------------------


def plan_gc(records: Iterable[RecordInfo], object_sizes: dict[str, int],
            pinned_records: set[str], pinned_objects: set[str], policy: GcPolicy) -> GcPlan:
    lru = sorted(records, key=lambda r: (r.last_used, r.key))
    dropped = [r for r in lru if r.key not in pinned_records and _expired(r, policy)]
    gone = {r.key for r in dropped}
    kept = [r for r in lru if r.key not in gone]
    dropped += _over_budget(kept, object_sizes, pinned_records, pinned_objects, policy.max_bytes)
    gone = {r.key for r in dropped}
    needed = pinned_objects.union(*(r.objects for r in lru if r.key not in gone))
    drop_objects = sorted(d for d in object_sizes if d not in needed)
    freed = sum(object_sizes[d] for d in drop_objects)
    return GcPlan([r.key for r in dropped], drop_objects, freed,
                  sum(object_sizes.values()) - freed,
                  len(pinned_records & {r.key for r in lru}),
                  len(pinned_objects & object_sizes.keys()))


def _expired(record: RecordInfo, policy: GcPolicy) -> bool:
    if not record.readable:
        return True  # garbage: nothing can be restored from it
    return policy.max_age_s is not None and policy.now - record.last_used > policy.max_age_s


def _over_budget(lru: list[RecordInfo], sizes: dict[str, int], pinned_records: set[str],
                 pinned_objects: set[str], max_bytes: int | None) -> list[RecordInfo]:
    """The least recently used records to drop until the objects still needed fit."""
    if max_bytes is None:
        return []
    users = Counter(d for r in lru for d in r.objects)
    live = (set(users) | pinned_objects) & sizes.keys()
    total = sum(sizes[d] for d in live)
    dropped = []
    for record in lru:
        if total <= max_bytes:
            break
        if record.key in pinned_records:
            continue
        dropped.append(record)
        for d in record.objects:
            users[d] -= 1
            if users[d] == 0 and d in live and d not in pinned_objects:
                total -= sizes[d]
    return dropped


# -- sizes and ages on the command line ----------------------------------------------

# -- reading the store ---------------------------------------------------------------


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _stat(path: Path | os.DirEntry[str]) -> os.stat_result | None:
    try:
        return os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _objects(v1_root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """(digest, stat) of every object file; names that are not digests are not ours."""
    for fan in _entries(v1_root / "objects"):
        for obj in _entries(Path(fan.path)) if len(fan.name) == 2 else []:
            digest, st = fan.name + obj.name, _stat(obj)
            if st is not None and _HEX64.fullmatch(digest):
                yield digest, st


def _record_path(v1_root: Path, key: str) -> Path:
    return v1_root / "results" / key[:2] / f"{key}.json"


def _object_path(v1_root: Path, digest: str) -> Path:
    return v1_root / "objects" / digest[:2] / digest[2:]


def _record_info(path: Path, sizes: dict[str, int]) -> RecordInfo | None:
    st = _stat(path)
    if st is None:
        return None  # gone meanwhile
    try:
        rec = Record.from_json(path.read_text())
        objects = frozenset([o.digest for o in rec.outputs.values()] + [rec.log])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return RecordInfo(path.stem, 0, st.st_mtime, frozenset(), readable=False)
    if rec.key != path.stem:
        return RecordInfo(path.stem, 0, st.st_mtime, frozenset(), readable=False)
    size = sum(sizes.get(d, 0) for d in objects)
    return RecordInfo(rec.key, size, st.st_mtime, objects, rec.stage)


def inventory(v1_root: Path) -> tuple[list[RecordInfo], dict[str, int]]:
    """Every record (unreadable ones marked as garbage) and the size of every object."""
    sizes = {digest: st.st_size for digest, st in _objects(v1_root)}
    records = []
    for fan in _entries(v1_root / "results"):
        for entry in _entries(Path(fan.path)):
            if entry.name.endswith(".json") and entry.name.startswith(fan.name):
                info = _record_info(Path(entry.path), sizes)
                records += [info] if info is not None else []
    return records, sizes


def _manifest_pins(path: Path) -> tuple[str | None, set[str]]:
    try:
        manifest = json.loads(path.read_text())
        outputs = {str(o["digest"]) for o in manifest.get("outputs", {}).values()}
        return str(manifest["key"]), outputs
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None, set()  # half-written or foreign: pins nothing


def _record_log(v1_root: Path, key: str) -> str | None:
    try:
        return str(json.loads(_record_path(v1_root, key).read_text())["log"])
    except (OSError, ValueError, TypeError, KeyError):
        return None


def pins(v1_root: Path) -> tuple[set[str], set[str]]:
    """(record keys, object digests) that gc must keep; see the module docstring."""
    keys: set[str] = set()
    digests = {digest for digest, st in _objects(v1_root) if st.st_nlink > 1}
    for root in registered_projects(v1_root):
        for manifest in sorted(root.glob("build/*/*/manifest.json")):
            key, outputs = _manifest_pins(manifest)
            keys |= {key} if key else set()
            digests |= outputs
    logs = (_record_log(v1_root, key) for key in keys)
    return keys, digests | {log for log in logs if log}


# -- deleting ------------------------------------------------------------------------


def collect(v1_root: Path, policy: GcPolicy, dry_run: bool = False,
            on_wait: Callable[[str], None] | None = None) -> GcPlan:
    """Plan and (unless `dry_run`) delete, with no build writing to the store meanwhile."""
    with StoreLock(v1_root).exclusive(on_wait=on_wait):
        return collect_held(v1_root, policy, dry_run)


def collect_held(v1_root: Path, policy: GcPolicy, dry_run: bool = False) -> GcPlan:
    """`collect` for a caller that already holds the store lock exclusively (and does more
    under it: `doit gc --venvs`)."""
    records, sizes = inventory(v1_root)
    pinned_records, pinned_objects = pins(v1_root)
    plan = plan_gc(records, sizes, pinned_records, pinned_objects, policy)
    if not dry_run:
        _delete(v1_root, plan)
        _clean_tmp(v1_root / "tmp", policy.now - TMP_MAX_AGE_S)
    return plan


LOOSE = "object:"  # the key of a loose object planned as a record of its own (never a file)


def loose_records(records: list[RecordInfo], sizes: dict[str, int],
                  last_linked: dict[str, float]) -> list[RecordInfo]:
    """Every object no record names, as a record of one object last used when last linked."""
    named = set().union(*(r.objects for r in records))
    return [RecordInfo(LOOSE + d, size, last_linked.get(d, 0.0), frozenset([d]), "object")
            for d, size in sorted(sizes.items()) if d not in named]


def collect_node(v1_root: Path, policy: GcPolicy) -> GcPlan | None:
    """A cluster node's store within `policy` after a stage (see the module docstring);
    None when another stage is writing to it (never waits: the next stage collects)."""
    with StoreLock(v1_root).exclusive_if_free() as held:
        if not held:
            return None
        records, sizes = inventory(v1_root)
        linked = {digest: st.st_ctime for digest, st in _objects(v1_root)}
        pinned_records, pinned_objects = pins(v1_root)
        pinned_records |= {LOOSE + d for d in pinned_objects}
        plan = plan_gc(records + loose_records(records, sizes, linked), sizes, pinned_records,
                       pinned_objects, policy)
        real = [k for k in plan.drop_records if not k.startswith(LOOSE)]
        _delete(v1_root, replace(plan, drop_records=real))
        _clean_tmp(v1_root / "tmp", policy.now - TMP_MAX_AGE_S)
        return plan


def _delete(v1_root: Path, plan: GcPlan) -> None:
    """Records first: a crash in between leaves orphan objects, never a dangling record."""
    for key in plan.drop_records:
        _unlink(_record_path(v1_root, key))
    for digest in plan.drop_objects:
        path = _object_path(v1_root, digest)
        st = _stat(path)
        if st is not None and st.st_nlink <= 1:  # linked since the inventory: keep it
            _unlink(path)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise StoreError(f"gc cannot remove {path}: {exc.strerror}") from exc


def _clean_tmp(tmp: Path, cutoff: float) -> None:
    """Scratch left by killed runs: entries in which nothing changed since `cutoff`."""
    for entry in _entries(tmp):
        if _newest_mtime(Path(entry.path)) >= cutoff:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with suppress(FileNotFoundError):
                os.unlink(entry.path)


def _newest_mtime(path: Path) -> float:
    st = _stat(path)
    newest = st.st_mtime if st is not None else 0.0
    if path.is_dir() and not path.is_symlink():
        for folder, dirs, files in os.walk(path):
            for name in dirs + files:
                found = _stat(Path(folder) / name)
                newest = max(newest, found.st_mtime if found is not None else 0.0)
    return newest


# -- `doit store` --------------------------------------------------------------------


@dataclass(frozen=True)
class StoreSummary:
    root: Path
    total_bytes: int
    objects: int
    records: int
    largest: list[RecordInfo]  # readable records, largest first (ties by key)


def store_summary(v1_root: Path, top: int = 10) -> StoreSummary:
    records, sizes = inventory(v1_root)
    largest = sorted((r for r in records if r.readable), key=lambda r: (-r.size, r.key))
    return StoreSummary(v1_root, sum(sizes.values()), len(sizes), len(records), largest[:top])
