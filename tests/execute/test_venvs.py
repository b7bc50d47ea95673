"""venv toolchains: identity from the lock and the base python; atomic, locked creation."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hefbuild.declare.toolchains import load_toolchain
from hefbuild.errors import SpecError
from hefbuild.execute import venvs

BASE = {"python": "3.11.7", "implementation": "cpython", "platform": "linux-x86_64",
        "executable": sys.executable}


@pytest.fixture
def spec(tmp_path: Path) -> venvs.VenvSpec:
    lock = tmp_path / "tc.requirements.txt"
    lock.write_text("numpy==2.1.3\n")
    return venvs.VenvSpec("tc", "python3", lock)


@pytest.fixture
def fake_pip(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """`python -m venv` makes bin/python; pip does nothing: what ran is recorded."""
    ran: list[list[str]] = []

    def run(argv, spec, log_path, watch):
        ran.append(argv)
        if argv[1:3] == ["-m", "venv"]:
            (Path(argv[3]) / "bin").mkdir(parents=True)
            os.symlink(sys.executable, Path(argv[3]) / "bin" / "python")

    monkeypatch.setattr(venvs, "_run", run)
    return ran


def test_identity_is_the_lock_and_the_base_python(spec):
    one = venvs.identity(spec, BASE)
    assert one["kind"] == "venv" and one["venv"].startswith("sha256:")
    assert venvs.identity(spec, {**BASE, "executable": "/elsewhere/python3"}) == one
    assert venvs.identity(spec, {**BASE, "python": "3.12.1"})["venv"] != one["venv"]
    spec.requirements.write_text("numpy==2.1.4\n")
    assert venvs.identity(spec, BASE)["lock"] != one["lock"]


def test_created_once_then_reused(spec, tmp_path, fake_pip):
    said: list[str] = []
    ident = venvs.identity(spec, BASE)
    ready = venvs.ensure(spec, ident, BASE, tmp_path / "venvs", said.append)
    assert ready.python == venvs.venv_dir(tmp_path / "venvs", ident) / "bin" / "python"
    assert ready.created and ready.seconds is not None
    assert venvs.is_complete(ready.python.parent.parent)
    assert any("creating its Python environment" in m for m in said)
    assert [a[1:3] for a in fake_pip] == [["-m", "venv"], ["-m", "pip"]]
    fake_pip.clear()
    said.clear()
    again = venvs.ensure(spec, ident, BASE, tmp_path / "venvs", said.append)
    assert again == venvs.Ready(ready.python)  # there already: nothing spent, nothing made
    assert fake_pip == [] and said == []


def test_a_crashed_creation_is_never_trusted(spec, tmp_path, fake_pip):
    ident = venvs.identity(spec, BASE)
    root = tmp_path / "venvs"
    folder = venvs.venv_dir(root, ident)
    (folder / "bin").mkdir(parents=True)  # a folder without its marker
    stale = root / f".tmp-{folder.name}-999999"
    stale.mkdir()
    assert not venvs.is_complete(folder)
    venvs.ensure(spec, ident, BASE, root, lambda m: None)
    assert venvs.is_complete(folder) and not stale.exists()
    assert len(fake_pip) == 2


def test_failed_pip_leaves_no_trusted_folder(spec, tmp_path, monkeypatch):
    def run(argv, spec, log_path, watch):
        raise venvs.VenvError("pip exited 1 while creating its environment")

    monkeypatch.setattr(venvs, "_run", run)
    ident = venvs.identity(spec, BASE)
    with pytest.raises(venvs.VenvError):
        venvs.ensure(spec, ident, BASE, tmp_path / "venvs", lambda m: None)
    assert not venvs.venv_dir(tmp_path / "venvs", ident).exists()
    assert not list((tmp_path / "venvs").glob(".tmp-*"))


def test_toolchain_file_declares_base_and_exact_pins(tmp_path):
    (tmp_path / "toolchain").mkdir()
    lock = tmp_path / "toolchain" / "ov.requirements.txt"
    lock.write_text("# pinned\nopenvino==2026.4.1\n")
    toml = tmp_path / "toolchain" / "ov.toml"
    toml.write_text('[toolchain]\nkind = "venv"\npython = "python3"\n'
                    'requirements = "toolchain/ov.requirements.txt"\n')
    tc = load_toolchain(toml, tmp_path)
    assert tc.kind == "venv"
    assert tc.venv == {"python": "python3", "requirements": "toolchain/ov.requirements.txt"}
    lock.write_text("openvino>=2026\n")
    with pytest.raises(SpecError, match="exact pin"):
        load_toolchain(toml, tmp_path)


def test_a_creation_beats_like_a_stage_with_pips_last_line(tmp_path, monkeypatch):
    """Real processes (a stand-in python and pip) under the stage watchdog: a heartbeat
    names the step and pip's last line while pip still runs (it waits for that beat)."""
    from fakes.venv_python import write_fake_python

    from hefbuild.execute import Watch

    python = write_fake_python(tmp_path / "bin" / "python3")
    lock = tmp_path / "tc.requirements.txt"
    lock.write_text("numpy==2.1.3\n")
    spec = venvs.VenvSpec("tc", str(python), lock)
    go = tmp_path / "go"
    monkeypatch.setenv("FAKE_PIP_GO", str(go))
    beats: list[dict] = []

    def emit(beat: dict) -> None:
        beats.append(beat)
        if beat["step"] == "pip install" and "Collecting numpy==2.1.3" in beat["message"]:
            go.touch()  # pip may finish now

    base = venvs.probe_base(str(python))
    ident = venvs.identity(spec, base)
    ready = venvs.ensure(spec, ident, base, tmp_path / "venvs", lambda m: None,
                         Watch(interval_s=0.0, emit=emit))
    assert go.exists() and ready.created and venvs.is_complete(ready.python.parent.parent)
    pip = [b for b in beats if b["step"] == "pip install"]
    assert pip and pip[-1]["last_line"].startswith(("Collecting", "Successfully"))
    assert {"elapsed_s", "cpu_cores", "rss_mb"} <= set(pip[0])
    log = (tmp_path / "venvs" / f"{ready.python.parent.parent.name}.log").read_text()
    assert "Successfully installed numpy-2.1.3" in log and "[hefbuild] heartbeat: " in log
