"""The tiny hailo chain up to its HEF, built through doit with the FAKE DFC once a session.

Three files read that build: the device tests verify it over the loopback sshd (each copies
the store), the device_check rule runs its HEF on the FAKE HailoRT, and the fidelity rule reads
its fetch, export and reference. Each built it for itself before (a trained checkpoint, a torch
export and a torch reference: some 20 s of CPU each time, on a suite bound by CPU). The folder
`once_per_session` returns holds `project/` (its `build/` as the engine leaves it) and
`store/`; it is shared, so readers copy what they change.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from e2e.conftest import Project, copy_project
from fakes.toolchains import FAKE_DFC_TOOLCHAIN
from session_once import once_per_session

REPO = Path(__file__).resolve().parents[1]
MODEL = "tiny-hailo-llama"


def hailo_project(root: Path, store: Path) -> Project:
    """The project with the tiny hailo model and the FAKE DFC toolchain (no device yet)."""
    project = copy_project(root, store)
    shutil.copy(REPO / "tests/hailo_models" / f"{MODEL}.toml", project.root / "models")
    (project.root / "toolchain/hailo-dfc-5.3.0.toml").write_text(FAKE_DFC_TOOLCHAIN)
    return project


def _build(folder: Path) -> None:
    run = hailo_project(folder / "project", folder / "store").doit(f"hef:{MODEL}",
                                                                  f"reference:{MODEL}")
    assert run.returncode == 0, run.stdout + run.stderr


def hailo_chain(factory: pytest.TempPathFactory) -> Path:
    """The session's folder: `project/build/<MODEL>/<stage>/` and `store/`; read only."""
    return once_per_session(factory, "hailo-chain", _build)
