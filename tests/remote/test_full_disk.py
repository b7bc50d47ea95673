"""A local disk that fills while a blob downloads is said as a full disk, not as a cache that
"cannot be reached": the reader's store is a 1 MiB tmpfs (in a mount namespace of its own,
so nothing outside the test sees it) and the blob is 2 MiB (received whole, then landed) or
6 MiB (written by a second thread as it streams in, remote/overlap.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import MODEL, TASKS, cache_toml, engine, make_project, run_all

BIG_EXECUTOR = """
from fakes.fake_executor import FakeExecutor


class BigExecutor(FakeExecutor):
    def _write_outputs(self, action):
        super()._write_outputs(action)
        if action["stage"] == "export":
            from pathlib import Path
            (Path(action["out"]) / "model.onnx").write_bytes(b"x" * {big})
"""

READER = """
import json, sys
sys.path[:0] = sys.argv[3:]
from fakes.fake_executor import FakeExecutor
from remote.helpers import engine
from hefbuild.errors import HefbuildError
from pathlib import Path
eng = engine(Path(sys.argv[1]), Path(sys.argv[2]), FakeExecutor())
outcomes, error = [], None
for task in ["fetch:tiny-llama", "export:tiny-llama"]:
    try:
        outcomes.append(eng.run(task)["outcome"])
    except HefbuildError as exc:
        error = str(exc)
print(json.dumps({"outcomes": outcomes, "error": error, "warnings": eng.warnings}))
"""


@pytest.mark.parametrize("big", [2 << 20, 6 << 20], ids=["landed", "streamed"])
def test_a_full_disk_while_downloading_says_the_disk_is_full(tmp_path, make_cache, big):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to mount a small tmpfs in its own namespace")
    server = make_cache()
    namespace = {}
    exec(BIG_EXECUTOR.format(big=big), namespace)  # noqa: S102 - the test's own executor, defined above
    ci = engine(make_project(tmp_path / "ci", cache_toml(server.url, upload=True)),
                tmp_path / "ci-store", namespace["BigExecutor"]())
    assert run_all(ci) == ["built"] * len(TASKS)
    export = json.loads((tmp_path / "ci" / "build" / MODEL / "export" / "manifest.json")
                        .read_text())
    assert export["outputs"]["model.onnx"]["size"] == big

    reader = make_project(tmp_path / "reader", cache_toml(server.url))
    store = tmp_path / "reader-store"
    store.mkdir()
    tests = Path(__file__).resolve().parents[1]
    script = (f"mount -t tmpfs -o size=1m tmpfs {store} && exec {sys.executable} -c "
              f"\"$READER\" {reader} {store} {tests}")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           script], env={**os.environ, "READER": READER},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["outcomes"] == ["remote"], got
    assert "No space left on device" in got["error"] and "free some space" in got["error"]
    assert got["error"].startswith(f"export:{MODEL}: ")
    assert not any("cannot be reached" in w for w in got["warnings"]), got["warnings"]
