"""What doit keeps in its dependency file (`.hefbuild/doit.json`) of a hefbuild stage.

doit saves a task's returned dict twice (as its `values` and its `result`) and reads the
whole file back on every invocation. A stage's dict (outcome, key, seconds, why) is for the
reporter of the run that made it; nothing reads it later (the stage's manifest and the event
log keep it), so the file is mostly what every no-op parses for nothing: 1.9 MB at 5000
tasks. This codec leaves a stage's dict out when doit writes the file; doit's own fields
(`checker:`, `deps:`, `ignore:`, ...) and every other task's values stay as doit wrote them.
"""

from __future__ import annotations

import json
from typing import Any

_DOIT_VALUES = ("_values_:", "result:")


def stage_result(value: Any) -> bool:
    """A dict a hefbuild stage returned (cli/tasks.py `run_task`): its outcome and key."""
    return isinstance(value, dict) and "outcome" in value and "key" in value


def slim(entry: Any) -> Any:
    """One task's record without the values and result of a stage; None when nothing else
    is left in it but what doit assumes of a record it does not have (the checker's name
    and no file_dep: a stage has none, its key covers its inputs)."""
    if not isinstance(entry, dict):
        return entry
    left = entry
    if stage_result(entry.get("_values_:")):
        left = {k: v for k, v in entry.items() if k not in _DOIT_VALUES}
    return None if set(left) <= {"checker:", "deps:"} and not left.get("deps:") else left


class SlimCodec:
    """doit's `codec_cls`: JSON, as doit's own, without stage results. The json backend
    encodes the whole file at once (task -> record), dbm and sqlite3 one record at a time."""

    def __init__(self) -> None:
        self.encoder = json.JSONEncoder()
        self.decoder = json.JSONDecoder()

    def encode(self, data: Any) -> str:
        if isinstance(data, dict) and "_values_:" in data:
            return self.encoder.encode(slim(data) or {})
        if isinstance(data, dict):
            kept = ((task, slim(entry)) for task, entry in data.items())
            return self.encoder.encode({task: entry for task, entry in kept if entry is not None})
        return self.encoder.encode(data)

    def decode(self, data: str) -> Any:
        return self.decoder.decode(data)
