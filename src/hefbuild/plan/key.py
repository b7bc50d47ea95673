"""Action keys: SHA-256 over one canonical description of everything that can change a result.

The description holds: the key format version; the stage and its declared outputs; the
rule's code (the rule file and each `rules/common` module it imports, by digest); the
content digest of every input (each upstream output file, each declared file parameter);
the resolved parameters; the source (fetch only); the toolchain identity; the toolchain's
declared environment; whether the stage gets a GPU (a CPU-only optimize differs).

Deliberately not part of it: absolute paths, the model's name (two models that agree on
all of the above share results), timestamps, host and user names, and every environment
variable passed through untouched (HF_TOKEN, proxies, HOME), and a stage's timeout and
memory cap: they decide whether a stage finishes, never what it makes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..digest import Digest, canonical_json, sha256_bytes

KEY_FORMAT = 1


@dataclass(frozen=True)
class ActionKey:
    digest: Digest
    description: dict[str, Any]

    @classmethod
    def of(cls, description: dict[str, Any]) -> ActionKey:
        return cls(sha256_bytes(canonical_json(description).encode()), description)

    @property
    def hex(self) -> str:
        return self.digest.hex


def describe(
    *,
    stage: str,
    outputs: tuple[str, ...],
    rule: dict[str, str],
    inputs: dict[str, str],
    files: dict[str, dict[str, str]],
    params: dict[str, Any],
    source: dict[str, Any] | None,
    toolchain: dict[str, Any],
    env: dict[str, str],
    gpu: bool = False,
) -> dict[str, Any]:
    """The canonical description; every argument is already plain JSON data."""
    description = {
        "format": KEY_FORMAT,
        "stage": stage,
        "declared_outputs": list(outputs),
        "rule": dict(rule),
        "inputs": dict(inputs),
        "files": dict(files),
        "params": dict(params),
        "toolchain": dict(toolchain),
        "env": dict(env),
        "gpu": gpu,
    }
    if source is not None:
        description["source"] = source
    return description


def diff_descriptions(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Field-by-field changes, as `path: old -> new` lines, for `doit explain`."""
    return [f"{path}: {_show(a)} -> {_show(b)}" for path, a, b in _changes(old, new)]


# The order a short reason names changes in: what people edit most, first.
_FIELD_ORDER = ("params", "rule", "inputs", "files", "source", "toolchain", "env", "gpu")
# Fields of file digests, said as the file that changed: field -> how its files are named.
_FILE_FIELDS = {"rule": "rules/{}", "inputs": "upstream {}"}


def short_reason(old: dict[str, Any], new: dict[str, Any], shown: int = 2) -> str:
    """What changed between the last build's description and this key's, in a few words
    for a task's line: `params.samples 32 → 16`, `rules/toy/make.py changed`,
    `upstream make/thing.txt changed`; the first `shown`, then how many more."""
    rank = {f: i for i, f in enumerate(_FIELD_ORDER)}
    words: list[str] = []
    for field in sorted(set(old) | set(new), key=lambda f: (rank.get(f, len(rank)), f)):
        a, b = old.get(field, _ABSENT), new.get(field, _ABSENT)
        if a == b:
            continue
        if field in _FILE_FIELDS and isinstance(a, dict) and isinstance(b, dict):
            words += _files_changed(a, b, _FILE_FIELDS[field])
        elif field == "files" and isinstance(a, dict) and isinstance(b, dict):
            words += _file_params_changed(a, b)
        elif isinstance(a, dict) and isinstance(b, dict):
            words += [_was_now(p, x, y) for p, x, y in _changes(a, b, field + ".")]
        else:
            words.append(_was_now(field, a, b))
    more = f" (+{len(words) - shown} more)" if len(words) > shown else ""
    return ", ".join(words[:shown]) + more


def _files_changed(old: dict[str, str], new: dict[str, str], name: str) -> list[str]:
    """`<file> changed` (or added, removed) for each path whose digest differs."""
    words = []
    for rel in sorted(set(old) | set(new)):
        if old.get(rel) != new.get(rel):
            state = "added" if rel not in old else "removed" if rel not in new else "changed"
            words.append(f"{name.format(rel)} {state}")
    return words


def _file_params_changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """A file parameter that names another file says so; one whose bytes changed, which."""
    words = []
    for param in sorted(set(old) | set(new)):
        a, b = old.get(param, {}), new.get(param, {})
        if a.get("path") != b.get("path"):
            words.append(_was_now(f"params.{param}", a.get("path", _ABSENT),
                                  b.get("path", _ABSENT)))
        elif a.get("digest") != b.get("digest"):
            words.append(f"{b['path']} changed")
    return words


def _was_now(path: str, old: Any, new: Any) -> str:
    return f"{path} {_show(old, 32)} → {_show(new, 32)}"


def _changes(old: dict[str, Any], new: dict[str, Any],
             prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted path, old value, new value) of every leaf that differs, in path order."""
    found = []
    for field in sorted(set(old) | set(new)):
        path = f"{prefix}{field}"
        a, b = old.get(field, _ABSENT), new.get(field, _ABSENT)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            found += _changes(a, b, path + ".")
        else:
            found.append((path, a, b))
    return found


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()


def _show(value: Any, width: int = 80) -> str:
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return f"sha256:{value[:12]}…"
    if isinstance(value, dict) and set(value) == {"path", "digest"}:
        return f"{value['path']} sha256:{value['digest'][:12]}…"
    text = repr(value) if not isinstance(value, _Absent) else "(absent)"
    return text if len(text) <= width else text[:width - 3] + "…"
