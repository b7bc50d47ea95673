"""Constants and small helpers shared by the engine tests."""

from __future__ import annotations

import shutil
from pathlib import Path

from hefbuild.engine.engine import Engine

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-llama"
STAGES = ("fetch", "export", "quantize", "compile", "verify")
TASKS = tuple(f"{s}:{MODEL}" for s in STAGES)
RULES = ("fetch.py", "cpu_ort/export.py", "cpu_ort/quantize.py", "cpu_ort/compile.py",
         "cpu_ort/verify.py")
HOST_TOML = """\
[toolchain]
kind = "host"
interpreter = "current"

[packages]

[env]
PYTHONHASHSEED = "0"
"""


def make_tiny_project(root: Path) -> Path:
    """tiny-llama with a host toolchain and dummy rules (hashed into keys, never run)."""
    (root / "models").mkdir(parents=True)
    shutil.copy(REPO / "models" / f"{MODEL}.toml", root / "models")
    (root / "toolchain").mkdir()
    (root / "toolchain" / "host.toml").write_text(HOST_TOML)
    shutil.copytree(REPO / "data", root / "data")
    for rule in RULES:
        path = root / "rules" / rule
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# dummy rule {rule}: hashed into keys, never run\n")
    return root


def run_all(engine: Engine) -> list[str]:
    return [engine.run(task)["outcome"] for task in TASKS]


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def model_toml(root: Path) -> Path:
    return root / "models" / f"{MODEL}.toml"
