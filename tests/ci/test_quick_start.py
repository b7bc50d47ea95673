"""The README's first Quick start command, word for word, as a normal user on a fresh clone
with an empty store: it installs hefbuild and checks the tiny Llama. Then what the README
says next: run again, every stage is up to date; `rm -rf build`, everything is restored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .as_user import REPO, User, base_env, fresh_clone, python_shim

pytestmark = pytest.mark.e2e


def quick_start_command() -> str:
    lines = (REPO / "README.md").read_text().splitlines()
    at = lines.index("# 1. install (bubblewrap sandboxes the stages), then build and check "
                     "the tiny Llama on the CPU target")
    return lines[at + 1]


def outcomes(clone: Path) -> list[str]:
    events = [json.loads(ln) for ln in (clone / "build/events.jsonl").read_text().splitlines()]
    last = max(i for i, e in enumerate(events) if "summary" in e)
    first = max((i for i, e in enumerate(events[:last]) if "summary" in e), default=-1) + 1
    found = [e["outcome"] for e in events[first:last] if "outcome" in e]
    return found + ["uptodate"] * len(events[last].get("uptodate", []))


# Slow by nature (about a minute): the README's first command on a fresh clone as a normal
# user, pip installing the project into a new venv and building the tiny chain from nothing.
def test_the_quick_start_works_for_a_normal_user(workdir: Path, user: User,
                                                 pip_cache: Path) -> None:
    command = quick_start_command()
    assert "doit verify:tiny-llama" in command
    clone = fresh_clone(workdir / "repo", user)
    (workdir / "home").mkdir()
    user.owns(workdir)
    env = base_env(workdir / "home", user, python_shim(workdir / "bin", user), pip_cache)
    first = user.run(command, clone, env)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    assert "verify:tiny-llama: passed" in first.stdout
    assert outcomes(clone) == ["built"] * 5
    assert (clone / "build/tiny-llama/verify/report.json").is_file()

    again = user.run(".venv/bin/doit verify:tiny-llama", clone, env)
    assert again.returncode == 0 and outcomes(clone) == ["uptodate"] * 5, again.stdout
    restored = user.run("rm -rf build && .venv/bin/doit verify:tiny-llama", clone, env)
    assert restored.returncode == 0 and outcomes(clone) == ["restored"] * 5, restored.stdout
