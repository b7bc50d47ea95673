"""Typed loader for the engine's ACTION_JSON, plus the one-line failure helper."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

SUPPORTED_FORMAT = 1


@dataclass(frozen=True)
class Action:
    model: str
    stage: str
    target: str
    params: dict[str, Any]
    source: dict[str, Any]
    inputs: dict[str, Path]
    files: dict[str, Path]
    out: Path
    outputs: list[str] = field(default_factory=list)

    def input_dir(self, stage: str) -> Path:
        """Folder of an upstream stage; a missing key means the stage graph is misdeclared."""
        if stage not in self.inputs:
            fail(
                f"{self.stage}: upstream stage '{stage}' is not among inputs {sorted(self.inputs)}"
            )
        return self.inputs[stage]

    def file(self, name: str) -> Path:
        if name not in self.files:
            fail(f"{self.stage}: file parameter '{name}' is not among files {sorted(self.files)}")
        return self.files[name]


def fail(message: str) -> NoReturn:
    """Print the single line the engine surfaces as the failure reason, then exit 1."""
    sys.stdout.flush()
    one_line = " ".join(str(message).split())
    print(one_line, file=sys.stderr, flush=True)
    raise SystemExit(1)


def load_action(argv: list[str]) -> Action:
    """Parse `rule.py ACTION_JSON`; argv is sys.argv."""
    if len(argv) != 2:
        fail(f"usage: {Path(argv[0]).name if argv else 'rule.py'} ACTION_JSON")
    try:
        raw = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        fail(f"cannot read action file {argv[1]}: {exc}")
    if raw.get("format") != SUPPORTED_FORMAT:
        fail(f"unsupported action format {raw.get('format')!r}; expected {SUPPORTED_FORMAT}")
    try:
        action = Action(
            model=str(raw["model"]),
            stage=str(raw["stage"]),
            target=str(raw["target"]),
            params=dict(raw.get("params") or {}),
            source=dict(raw.get("source") or {}),
            inputs={k: Path(v) for k, v in (raw.get("inputs") or {}).items()},
            files={k: Path(v) for k, v in (raw.get("files") or {}).items()},
            out=Path(raw["out"]),
            outputs=[str(o) for o in raw.get("outputs") or []],
        )
    except KeyError as exc:
        fail(f"action file {argv[1]} lacks required key {exc}")
    action.out.mkdir(parents=True, exist_ok=True)
    return action


def check_outputs(action: Action) -> None:
    """Fail unless every declared output exists (folders, ending in '/', must be non-empty)."""
    for name in action.outputs:
        path = action.out / name.rstrip("/")
        if name.endswith("/"):
            if not path.is_dir() or not any(path.iterdir()):
                fail(f"{action.stage}: declared output folder {name} is missing or empty")
        elif not path.is_file():
            fail(f"{action.stage}: declared output {name} was not written")


def write_json(path: Path, data: Any) -> None:
    """Deterministic JSON: sorted keys, fixed indent, trailing newline."""
    text = json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")


def round_sig(value: float, digits: int = 6) -> float:
    """Round to significant digits so float noise in the last bits never reaches a report."""
    return float(f"{float(value):.{digits}g}")
