"""Call recording of the fake DFC: one JSON object per line in $FAKE_DFC_CALLS."""

from __future__ import annotations

import enum
import hashlib
import json
import os
from pathlib import Path
from typing import Any


def jsonable(value: Any) -> Any:
    if hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "tobytes"):
        return {"ndarray": {"shape": [int(d) for d in value.shape], "dtype": str(value.dtype),
                            "sha256": hashlib.sha256(value.tobytes()).hexdigest()}}
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def record(call: str, *args: Any, **kwargs: Any) -> None:
    target = os.environ.get("FAKE_DFC_CALLS")
    if not target:
        return
    line = json.dumps({"call": call, "args": jsonable(list(args)), "kwargs": jsonable(kwargs)})
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
