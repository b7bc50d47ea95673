"""What a stage needs from the machine that runs it: CPUs, GPUs, memory, custom resources.

Declared as `resources = {GPU = 1, memory = "8GiB", gpu_host = 1}` on a target's stage, a
toolchain (`[resources]`, for every stage that runs in it) or a model's `[stages.<stage>]`
(the model wins, then the target, then the toolchain). Resources never enter a key: where a
stage runs must not change what it makes. Locally they are only a description; on a cluster
(execute/ray.py) they choose the node.

`CPU`, `GPU` and `memory` are the scheduler's own; any other name is a custom resource that
a node offers (`ray start --resources='{"<name>": 1}'`).
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import SpecError
from .params import parse_size

Resources = dict[str, float]

KEY = "resources"  # the declaration key, in target, toolchain and model files

BUILTIN = ("CPU", "GPU", "memory")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


def parse_resources(value: Any, shown: str, key: str) -> Resources:
    """A table of resource name -> positive amount (memory: a size like "8GiB")."""
    if not isinstance(value, dict):
        raise SpecError(shown, key, f"a table of resources like {{GPU = 1}}, got {value!r}"[:120])
    parsed: Resources = {}
    for name, amount in value.items():
        if not _NAME_RE.match(name):
            raise SpecError(shown, f"{key}.{name}", "a resource name (letters, digits, _ . -)")
        parsed[name] = _amount(name, amount, shown, f"{key}.{name}")
    return parsed


def _amount(name: str, amount: Any, shown: str, key: str) -> float:
    if name == "memory":
        try:
            return float(parse_size(amount))
        except (ValueError, TypeError):
            raise SpecError(shown, key, f"a memory size like \"8GiB\", got {amount!r}") from None
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not amount > 0:
        raise SpecError(shown, key, f"a positive number, got {amount!r}")
    return float(amount)


def merged(*layers: Resources) -> Resources:
    """Later layers win, name by name."""
    out: Resources = {}
    for layer in layers:
        out.update(layer)
    return out


def shown(resources: Resources) -> str:
    """`GPU=1, gpu_host=1, memory=2.0 GiB` for messages."""
    parts = []
    for name, amount in sorted(resources.items()):
        value = f"{amount / (1 << 30):.1f} GiB" if name == "memory" else f"{amount:g}"
        parts.append(f"{name}={value}")
    return ", ".join(parts) or "nothing beyond one CPU"
