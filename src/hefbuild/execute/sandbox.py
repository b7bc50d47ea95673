"""What a host stage can see, write and reach, and making sure nothing it starts outlives it.

Sandboxed (bubblewrap), the rule runs in a new root that holds only: the system (`/usr`,
`/bin`, `/lib*`, `/etc`, `/sys`) and its interpreter's installation, read-only; `rules/`,
its inputs and its file parameters, read-only at their own paths; its scratch `out/` and
`work/`, writable; a private `/tmp`, `/proc` and `/dev`. The project, `$HOME`, the store and
other projects do not exist in there. It has no network (not even the host's loopback)
unless it is `fetch`, which gets the network and the Hugging Face cache. Its environment is
exactly what the executor passes. bwrap is the init of a new PID namespace: when the rule
exits, the kernel ends every process it started, daemons included.

The rule holds no capabilities and cannot gain any, even when doit runs as root: it runs as
an unprivileged uid in its own user namespace (which maps it to whoever runs doit, so its
files are theirs), with every capability dropped, no new privileges, no further user
namespaces, a read-only /proc (its sysctls would otherwise answer to a uid that is root
outside) and a seccomp filter (execute/seccomp.py) on the calls that reach outside.

Unsandboxed (the project opted out), a small reaper runs the rule as a child subreaper
(PR_SET_CHILD_SUBREAPER): whatever double-forks or calls setsid is re-parented to it, and
everything still alive when the rule exits is killed before the stage counts as done.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from . import seccomp
from .base import StageRun

SANDBOX_ID = "1000"  # the rule's uid and gid in its namespace: anyone's but root's
OPT_OUT = "opt out with `sandbox = false` in hefbuild.toml (or HEFBUILD_SANDBOX=0)"
# What bwrap prints when it may not make (or, under AppArmor's restriction of unprivileged
# user namespaces on Ubuntu 23.10+, not use) the user namespace a stage runs in.
NO_USERNS = ("setting up uid map: Permission denied", "No permissions to creat")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")
# /proc read-only: the rule's uid is root's outside, and a sysctl file checks only that uid
# (core_pattern would run a program of its choosing as root).
PRIVATE_MOUNTS = ("--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev",
                  "--tmpfs", "/tmp")

# Run with doit's own python, stdlib only: rule argv follows. Exits with the rule's status.
REAPER = r"""
import ctypes, os, signal, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
pid = os.fork()
if pid == 0:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    os.execv(sys.argv[1], sys.argv[1:])
def reap_all():
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
def orphans():
    me, found = str(os.getpid()), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                found.append(int(entry))
    return found
signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
status = os.waitpid(pid, 0)[1]
for _ in range(50):  # the rule is done: nothing it started may go on
    left = orphans()
    if not left:
        break
    for child in left:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.02)
    reap_all()
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


@dataclass(frozen=True)
class Bwrap:
    """bubblewrap as the probe found it: its path when it can sandbox a stage here, else
    why not (one line that says what to do)."""

    path: str | None
    problem: str = ""


@cache
def probe_bwrap() -> Bwrap:
    """Probed once, with a real stage's namespaces and filter: a bwrap that runs `true`
    but cannot drop to a user namespace would fail every stage instead."""
    path = shutil.which("bwrap")
    if path is None:
        return Bwrap(None, "bubblewrap (bwrap) is needed to sandbox host stages and is not "
                           f"installed: apt-get install bubblewrap, or {OPT_OUT}")
    with seccomp_fd() as fd:
        probe = [path, *isolation(fd), "--unshare-net", "--ro-bind", "/", "/",
                 *PRIVATE_MOUNTS, "true"]
        try:
            done = subprocess.run(probe, capture_output=True, text=True, timeout=10,
                                  pass_fds=() if fd is None else (fd,))
        except (OSError, subprocess.SubprocessError) as exc:
            return Bwrap(None, f"bubblewrap ({path}) cannot run here ({exc}); {OPT_OUT}")
    if done.returncode == 0:
        return Bwrap(path)
    return Bwrap(None, unusable(path, done.stderr, done.returncode))


def bwrap_path() -> str | None:
    """bubblewrap, if installed and able to sandbox a stage here."""
    return probe_bwrap().path


def unusable(path: str, stderr: str, returncode: int) -> str:
    """Why bubblewrap failed its probe, in one line, with bwrap's own words in it."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    said = lines[-1] if lines else f"exit status {returncode}"
    if any(sign in said for sign in NO_USERNS):
        return (f"bubblewrap ({path}) may not create the user namespace a host stage runs in "
                f"(`{said}`): AppArmor restricts unprivileged user namespaces here (Ubuntu "
                "23.10+, GitHub's ubuntu-24.04 runners); allow them with `sudo sysctl -w "
                "kernel.apparmor_restrict_unprivileged_userns=0`, or load an AppArmor profile "
                f"for {path} that allows `userns` (README, The sandbox)")
    return f"bubblewrap ({path}) cannot sandbox a stage here (`{said}`); {OPT_OUT}"


def isolation(filter_fd: int | None) -> list[str]:
    """The namespaces and privileges of a stage (its network aside): no capability, as an
    unprivileged uid, whoever runs doit. bwrap sets no-new-privileges itself."""
    cmd = ["--unshare-user", "--uid", SANDBOX_ID, "--gid", SANDBOX_ID, "--disable-userns",
           "--cap-drop", "ALL", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
           "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    return cmd if filter_fd is None else [*cmd, "--seccomp", str(filter_fd)]


@contextmanager
def seccomp_fd() -> Iterator[int | None]:
    """An fd holding the stage's filter, for bwrap's --seccomp; None (said once) on an
    architecture without a table."""
    machine = platform.machine()
    data = seccomp.compiled(machine)
    if data is None:
        _say_unfiltered(machine)
        yield None
        return
    fd = os.memfd_create("hefbuild-seccomp", os.MFD_CLOEXEC)
    try:
        with open(fd, "wb", closefd=False) as f:
            f.write(data)
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


@cache
def _say_unfiltered(machine: str) -> None:
    print(f"hefbuild: WARNING: no system-call table for {machine}: host stages run in "
          "bubblewrap without a seccomp filter (still without capabilities)", file=sys.stderr)


def reaped(argv: list[str]) -> list[str]:
    return [sys.executable, "-c", REAPER, *argv]


def sandboxed(bwrap: str, stage: StageRun, argv: list[str], env: dict[str, str],
              network: bool, writable: tuple[Path, ...] = (),
              filter_fd: int | None = None) -> list[str]:
    """The bwrap command line that runs `argv` for `stage` with exactly `env`; `filter_fd`
    holds the seccomp filter (seccomp_fd) and must reach bwrap open (ExecRequest.pass_fds)."""
    cmd = [bwrap, *isolation(filter_fd)]
    if not network:
        cmd.append("--unshare-net")
    for d in SYSTEM_DIRS:
        cmd += ["--ro-bind-try", d, d]
    if os.geteuid() == 0:
        cmd += list(covered_secrets())
    cmd += PRIVATE_MOUNTS
    for path in interpreter_paths(argv[0]):
        cmd += ["--ro-bind-try", path, path]
    # A toolchain's own PYTHONPATH entries (its declared libraries) are readable too.
    declared = [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    readable = [stage.rules_dir, *stage.inputs.values(), *stage.files.values(),
                stage.scratch / "action.json", *(p for p in declared if p.exists())]
    for path in readable:
        cmd += ["--ro-bind", str(path), str(path)]
    for path in (stage.out, stage.work, *writable):
        cmd += ["--bind", str(path), str(path)]
    # The new root is a tmpfs holding the mount points: read-only too, so that a write to,
    # say, $HOME fails instead of landing in a folder that vanishes with the stage.
    cmd += ["--remount-ro", "/", "--clearenv"]
    for name, value in sorted(env.items()):
        cmd += ["--setenv", name, value]
    return [*cmd, "--chdir", str(stage.work), "--", *argv]


@cache
def covered_secrets(top: str = "/etc") -> tuple[str, ...]:
    """bwrap arguments that hide what only its owner or group may read under `top` (the
    ssh host keys, /etc/shadow, a daemon's key). Run by root, the rule's uid is root's
    outside, and those would be readable: each is covered by an empty file (/dev/null) or
    an empty read-only folder. Looked for once per process, when a first stage builds."""
    args: list[str] = []
    for folder, dirs, files in os.walk(top):
        for name in sorted(files):
            path = os.path.join(folder, name)
            if _private(path, stat.S_IROTH):
                args += ["--ro-bind", "/dev/null", path]
        for name in sorted(dirs):
            path = os.path.join(folder, name)
            if _private(path, stat.S_IROTH | stat.S_IXOTH):
                args += ["--tmpfs", path, "--remount-ro", path]
                dirs.remove(name)  # nothing below it is reachable anyway
    return tuple(args)


def _private(path: str, bits: int) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    kind = stat.S_IFMT(st.st_mode)
    return kind in (stat.S_IFREG, stat.S_IFDIR) and st.st_mode & bits != bits


@cache
def interpreter_paths(interpreter: str) -> tuple[str, ...]:
    """The folders an interpreter needs: its prefixes and every existing sys.path entry."""
    # Not the real paths: a venv's bin/python links to its base interpreter, as ours may.
    if os.path.abspath(interpreter) == os.path.abspath(sys.executable):
        entries = [sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path]
    else:
        probe = "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix, " \
                "sys.exec_prefix, *sys.path]))"
        try:
            done = subprocess.run([interpreter, "-c", probe], capture_output=True, text=True,
                                  timeout=60, env={"PATH": os.environ.get("PATH", "")})
            entries = json.loads(done.stdout)
        except (OSError, ValueError, subprocess.SubprocessError):
            entries = []
    real = os.path.dirname(os.path.realpath(interpreter))
    found = {os.path.dirname(real), *_link_folders(os.path.abspath(interpreter))}
    # Not the folder doit runs in: `python -m doit` puts the project itself on sys.path.
    found |= {e for e in entries if e and e != os.getcwd() and os.path.exists(e)}
    return tuple(sorted(p for p in found if not _covered(p)))


def _link_folders(path: str) -> list[str]:
    """The folder of every hop of a symlink chain: a venv's python may point at a `python`
    that points on (setup-python's tool cache, a shim folder), and exec follows each hop."""
    folders: list[str] = []
    for _ in range(40):  # the kernel's own limit on links followed
        folders.append(os.path.dirname(path))
        if not os.path.islink(path):
            break
        path = os.path.join(os.path.dirname(path), os.readlink(path))
    return folders


def _covered(path: str) -> bool:
    return any(path == d or path.startswith(d + "/") for d in SYSTEM_DIRS)
