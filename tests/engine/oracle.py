"""The one correctness oracle: after any build, a rebuild runs nothing and every output in
build/ matches the digest its manifest recorded."""

from __future__ import annotations

import json
from pathlib import Path

from fakes.fake_executor import FakeExecutor

from hefbuild.declare.project import load_project
from hefbuild.digest import sha256_file
from hefbuild.engine.engine import MANIFEST, Engine
from hefbuild.store.events import Outcome


def oracle_problems(root: Path, store: Path) -> list[str]:
    """Everything wrong with the build in `root`; empty when the build is correct."""
    executor = FakeExecutor()
    engine = Engine(load_project(root, store=store), executor=executor)
    problems = [f"{task}: {d.outcome.value} ({d.reason})"
                for task, d in ((t, engine.decide(a)) for t, a in engine.actions.items())
                if d.outcome is not Outcome.UPTODATE]
    for manifest_path in sorted((root / "build").glob(f"*/*/{MANIFEST}")):
        manifest = json.loads(manifest_path.read_text())
        for rel, out in manifest["outputs"].items():
            path = manifest_path.parent / rel
            if not path.is_file() or sha256_file(path).hex != out["digest"]:
                problems.append(f"{path.relative_to(root)}: does not match its manifest")
    if executor.ran:
        problems.append(f"deciding ran rules: {executor.ran}")
    return problems


def assert_oracle(root: Path, store: Path) -> None:
    problems = oracle_problems(root, store)
    assert not problems, "\n".join(problems)
