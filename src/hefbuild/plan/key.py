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


def diff_descriptions(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Field-by-field changes, as `path: old -> new` lines, for `doit explain`."""
    lines = []
    for field in sorted(set(old) | set(new)):
        path = f"{prefix}{field}"
        a, b = old.get(field, _ABSENT), new.get(field, _ABSENT)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            lines += diff_descriptions(a, b, path + ".")
        else:
            lines.append(f"{path}: {_show(a)} -> {_show(b)}")
    return lines


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()


def _show(value: Any) -> str:
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return f"sha256:{value[:12]}…"
    if isinstance(value, dict) and set(value) == {"path", "digest"}:
        return f"{value['path']} sha256:{value['digest'][:12]}…"
    text = repr(value) if not isinstance(value, _Absent) else "(absent)"
    return text if len(text) <= 80 else text[:77] + "…"
