"""Commands as a normal user on a fresh clone, the way a CI runner or a new user runs them.

As root (our CI), the commands run as the user `hefbuild-ci` (created once; `.ci/setup`
creates it too), through setpriv with exactly the environment given; as anyone else, as
that user. A fresh clone is the repository's tracked files as they are in the working
tree (no .venv, no build/, no .hefbuild/), owned by that user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
USER = "hefbuild-ci"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int

    def owns(self, path: Path) -> None:
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", f"{self.uid}:{self.gid}", str(path)], check=True)

    def run(self, command: str, cwd: Path, env: dict[str, str],
            timeout: float = 1800) -> subprocess.CompletedProcess:
        """`command` in bash, as this user, with `env` and nothing else."""
        return subprocess.run([*self.runner(), "bash", "-c", command], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=timeout)

    def runner(self) -> tuple[str, ...]:
        """The prefix that runs a command as this user (exec'd: it keeps the PID)."""
        if os.geteuid() != 0:
            return ()
        return ("setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", "--")


def normal_user() -> User:
    """`hefbuild-ci` when we are root (made here if missing), else ourselves."""
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid())
        return User(me.pw_name, me.pw_uid, me.pw_gid)
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", USER], check=True)
        entry = pwd.getpwnam(USER)
    return User(USER, entry.pw_uid, entry.pw_gid)


def fresh_clone(dest: Path, user: User) -> Path:
    """The tracked files of the working tree, copied to `dest` and owned by `user`."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True)
    if listed.returncode != 0:  # a tarball, or a checkout of another user (safe.directory)
        said = listed.stderr.decode(errors="replace").strip().splitlines() or ["failed"]
        why = f"git ls-files in {REPO}: {said[0]}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(f"{why} (the fresh clone is the tracked files of a git checkout)")
    for rel in filter(None, listed.stdout.decode().split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    user.owns(dest)
    return dest


def base_env(home: Path, user: User, bin_dir: Path, pip_cache: Path) -> dict[str, str]:
    """What a runner's shell has: a PATH with `python` (setup-python's), HOME, LANG, how
    this machine reaches its package registries (pip's own variables) and a pip cache."""
    env = {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
           "USER": user.name, "LANG": "C.UTF-8"}
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
    env["PIP_CACHE_DIR"] = str(pip_cache)
    return env


def python_shim(bin_dir: Path, user: User) -> Path:
    """`python` and `python3` as the system's python3 (the interpreter setup-python gives a
    job); the user cannot reach ours under /root."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or "/usr/bin/python3"
    for name in ("python", "python3"):
        link = bin_dir / name
        if not link.exists():
            link.symlink_to(system)
    user.owns(bin_dir)
    return bin_dir
