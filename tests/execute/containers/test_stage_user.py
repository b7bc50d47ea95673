"""A stage container runs as the invoking user, root on our CI and anyone on a normal user's
runner: whoever it is, the rule can write its working folder, /tmp and its HOME (the
container's configuration, as the docker executor makes it, on the real engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hefbuild.execute.base import StageRun
from hefbuild.execute.docker import container_config

WRITES = r"""
import json, os, pathlib
def can_write(folder):
    try:
        (pathlib.Path(folder) / "probe.txt").write_text("x")
        return True
    except OSError as exc:
        return exc.strerror
print(json.dumps({"uid": os.getuid(), "cwd": os.getcwd(), "work": can_write("."),
                  "tmp": can_write("/tmp"), "home": can_write(os.environ["HOME"]),
                  "root": can_write("/")}))
"""


@pytest.mark.parametrize("uid", [0, 1000, 65534])
def test_the_stage_user_can_write_its_work_folder_tmp_and_home(
        run: Any, python_image: str, tmp_path: Path, uid: int) -> None:
    stage = StageRun(task="export:m", interpreter="python3", rules_dir=tmp_path, rule="r.py",
                     action={}, inputs={}, files={}, scratch=tmp_path, env={},
                     image=python_image)
    config = container_config(stage, user=(uid, uid))
    keep = ("working_dir", "environment", "read_only", "tmpfs", "user", "network_mode")
    ran = run(python_image, ["python3", "-c", WRITES], **{k: config[k] for k in keep})
    assert ran.exit_code == 0, ran.stderr
    seen = json.loads(ran.stdout)
    assert seen == {"uid": uid, "cwd": "/hefbuild/work", "work": True, "tmp": True,
                    "home": True, "root": "Read-only file system"}
