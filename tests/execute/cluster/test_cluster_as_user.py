"""The Ray executor of a runner that is not root: the cluster and `doit` as a normal user.

The other cluster tests run everything as root (our CI). A CI runner or a developer starts
their own cluster and runs doit as themselves, so here both run as the user `hefbuild-ci`
(tests/ci/as_user.py), with that user's environment, in a loopback-only network namespace of
their own; the remote cache (nginx) is another party's server, as on a team. Root is needed
for the namespace and to become that user: as anyone else this module skips.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib
from ci.as_user import User, base_env, normal_user
from e2e.conftest import REPO, Project
from fakes.cache_server import NginxCache

from hefbuild.execute.sandbox import bwrap_path

from .conftest import NODES, _require, inside, loopback_namespace, outside
from .raycluster import start, stop
from .test_cluster import MODEL, cluster_project, ran_on

pytestmark = pytest.mark.e2e
HERE = Path(__file__).resolve().parent


def user_env(user: User, home: Path) -> dict[str, str]:
    """A runner's shell (as_user.base_env: no HEFBUILD_*, no root's HOME) without Ray's
    usage report."""
    env = base_env(home, user, home / "bin", home / "pip-cache")
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def cluster_pins() -> list[str]:
    """hefbuild's own requirements and its `cluster` extra (Ray), as pyproject pins them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["cluster"]]


def user_python(user: User, home: Path, env: dict[str, str]) -> Path:
    """The user's venv, from the system's python3, with hefbuild's requirements and a copy of
    its sources on the path: ours may be out of the user's reach (on our machines its
    interpreter lies in root's home: setpriv can start it, but it cannot start itself)."""
    shutil.copytree(REPO / "src" / "hefbuild", home / "src" / "hefbuild",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(HERE / "raycluster.py", home / "raycluster.py")
    user.owns(home)
    system = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
    venv = home / "venv"
    script = (f"{system} -m venv {venv} && {venv}/bin/pip install -q "
              + " ".join(shlex.quote(pin) for pin in cluster_pins())
              + f" && {venv}/bin/python -c 'import site; print(site.getsitepackages()[0])'")
    made = user.run(script, cwd=home, env=env, timeout=600)
    if made.returncode != 0:
        _require(False, f"a venv with ray for {user.name}: {made.stderr.strip()[-600:]}")
    site = Path(made.stdout.strip().splitlines()[-1])
    (site / "hefbuild-src.pth").write_text(str(home / "src") + "\n")
    user.owns(site)
    return venv / "bin" / "python"


@pytest.fixture(scope="module")
def user_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    _require(os.geteuid() == 0 and shutil.which("setpriv") is not None,
             "needs root and setpriv: a network namespace, and a normal user to run as")
    user = normal_user()
    # The user's own folder: pytest's base temp folder is root's, closed to others.
    home = Path(tempfile.mkdtemp(prefix="hefbuild-rayuser-", dir="/tmp"))
    try:
        env = user_env(user, home)
        with outside():  # pip reaches the package registries
            python = (*user.runner(), str(user_python(user, home, env)))
        nginx_root = tmp_path_factory.mktemp("ray-user-cache")
        with loopback_namespace() as holder, inside(holder):
            # Ray's sessions in the user's folder (conftest.ray_sessions); the driver finds
            # them through the cluster.
            node_env = {**env, "HEFBUILD_STORE": str(home / "node-store"),
                        "RAY_BACKEND_LOG_LEVEL": "error", "RAY_TMPDIR": str(home)}
            proc, address = start(NODES, home / "cluster.err", node_env,
                                  command=(*python, str(home / "raycluster.py")))
            cache = NginxCache(root=nginx_root).start()
            try:
                yield {"address": address, "cache": cache, "user": user, "home": home,
                       "env": env, "python": python}
            finally:
                cache.stop()
                stop(proc)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _foreign(root: Path, uid: int) -> list[str]:
    """Paths under `root` not owned by `uid`."""
    return [str(p) for p in [root, *root.rglob("*")] if p.lstat().st_uid != uid]


def test_a_normal_user_builds_on_their_own_cluster(user_cluster: dict) -> None:
    user, home = user_cluster["user"], user_cluster["home"]
    project = cluster_project(home / "p", home / "store", user_cluster,
                              {"m1": MODEL.format(word="mine")})
    user.owns(home / "p")
    project = Project(project.root, project.store, python=user_cluster["python"])
    run = project.doit("check:m1", env=user_cluster["env"])
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.outcomes() == {"prep:m1": "built", "train:m1": "built", "check:m1": "built"}
    assert ran_on(project, "m1", "train") == "gpu-node"
    assert ran_on(project, "m1", "check") == "device-node"
    if bwrap_path() is not None:  # CI installs it: the nodes sandbox the user's stages
        assert {project.manifest(f"{s}:m1")["sandbox"] for s in ("prep", "train", "check")} \
            == {"bwrap"}
    # Every file the driver and the nodes made is the user's: nothing ran as root.
    for made in ("p", "store", "node-store"):
        assert _foreign(home / made, user.uid) == [], made
    again = project.doit("check:m1", env=user_cluster["env"])
    assert again.returncode == 0 and again.tasks("built") == set(), again.stdout
