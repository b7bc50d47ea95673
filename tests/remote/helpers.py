"""Engines on two machines' worth of state (a project, a store) sharing one remote cache."""

from __future__ import annotations

import shutil
from pathlib import Path

from fakes.fake_executor import FakeExecutor

from hefbuild.engine import Engine
from hefbuild.project import load_project

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


def make_project(root: Path, settings: str) -> Path:
    """A tiny-llama project with dummy rules (the FakeExecutor runs none) and hefbuild.toml."""
    (root / "models").mkdir(parents=True)
    shutil.copy(REPO / "models" / f"{MODEL}.toml", root / "models")
    (root / "toolchain").mkdir()
    (root / "toolchain" / "host.toml").write_text(HOST_TOML)
    shutil.copytree(REPO / "data", root / "data")
    for rule in RULES:
        path = root / "rules" / rule
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# dummy rule {rule}: hashed into keys, never run\n")
    (root / "hefbuild.toml").write_text(settings)
    return root


def engine(root: Path, store: Path, fake: FakeExecutor) -> Engine:
    return Engine(load_project(root, store=store), executor=fake)


def run_all(engine: Engine) -> list[str]:
    return [engine.run(task)["outcome"] for task in TASKS]


def cache_toml(url: str, upload: bool = False, extra: str = "") -> str:
    return f'[cache]\nremote = "{url}"\nupload = {str(upload).lower()}\ntimeout = "3s"\n{extra}'
