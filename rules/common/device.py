"""Reaching the Hailo device host: one small interface, two transports.

    Transport              run(argv, timeout, cwd) -> Completed; put(local, remote);
    |                      exists(remote); home(); close(); `log` lists every command and upload
    +-- SshTransport       the OpenSSH client (BatchMode, the key file, the port), host keys
    |                      accepted on first use into a known_hosts file in the scratch dir, one
    |                      shared master connection (ControlMaster/ControlPersist)
    +-- LocalTransport     the same, on this machine (doit runs on the device host itself)

Every `run` has a HARD timeout on both sides: the command runs under coreutils `timeout`
(TERM at the limit, KILL 5 s later; it needs `timeout` on the device host, as every Debian-based
Pi image has), and the local client process group is killed a little after that. A timed-out
command comes back with `timed_out=True` instead of raising.

Remote paths are absolute (see `home()`), or relative to the login directory.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

KILL_AFTER_S = 5  # remote: TERM at the limit, then KILL this much later
CLIENT_GRACE_S = 15  # local: the client is killed this long after the remote limit
TIMEOUT_EXITS = (124, 137)  # coreutils timeout: TERM worked / had to KILL
SSH_FAILED = 255  # the OpenSSH client's own failure (connection, authentication)
# Unix socket paths are limited (~104 bytes); a longer scratch path gets a short temp dir.
MAX_SOCKET_PATH = 90


class TransportError(Exception):
    """The device host could not be reached or a file could not be copied to it."""


@dataclass(frozen=True)
class Completed:
    code: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False


class Transport(Protocol):
    log: list[str]

    def run(self, argv: list[str], timeout: float, cwd: str | None = None) -> Completed: ...

    def put(self, local: Path, remote: str) -> None: ...

    def exists(self, remote: str) -> bool: ...

    def home(self) -> str: ...

    def close(self) -> None: ...


def remote_command(argv: list[str], timeout: float, cwd: str | None) -> str:
    """The shell line the device host runs: `cd`, then argv under coreutils `timeout`."""
    limited = ["timeout", "-k", str(KILL_AFTER_S), f"{max(timeout, 1):.0f}", *argv]
    line = shlex.join(limited)
    return f"cd {shlex.quote(cwd)} && exec {line}" if cwd else f"exec {line}"


def _run_local(argv: list[str], timeout: float, stdin: Any = subprocess.DEVNULL,
               env: dict[str, str] | None = None) -> Completed:
    """Run a client process in its own group; kill the whole group at `timeout`."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", start_new_session=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate()
        return Completed(-signal.SIGKILL, out, err, time.monotonic() - start, timed_out=True)
    except BaseException:
        _kill_group(proc.pid)
        proc.wait()
        raise
    seconds = time.monotonic() - start
    return Completed(proc.returncode, out, err, seconds, proc.returncode in TIMEOUT_EXITS)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@dataclass
class SshTransport:
    host: str
    user: str | None
    port: int
    key_file: str | None
    scratch: Path
    log: list[str] = field(default_factory=list)
    _home: str | None = None

    def __post_init__(self) -> None:
        self.scratch.mkdir(parents=True, exist_ok=True)
        sock_dir = self.scratch
        if len(str(sock_dir / "ssh-control")) > MAX_SOCKET_PATH:
            sock_dir = Path(tempfile.mkdtemp(prefix="hb-ssh-"))
            self._own_sock_dir = sock_dir
        else:
            self._own_sock_dir = None
        self._control = sock_dir / "ssh-control"

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    def options(self) -> list[str]:
        opts = {
            "BatchMode": "yes",
            "StrictHostKeyChecking": "accept-new",
            "UserKnownHostsFile": str(self.scratch / "known_hosts"),
            "ControlMaster": "auto",
            "ControlPath": str(self._control),
            "ControlPersist": "60",
            "ConnectTimeout": "20",
            "ServerAliveInterval": "15",
            "ServerAliveCountMax": "3",
            "LogLevel": "ERROR",
        }
        args = ["-p", str(self.port)]
        if self.key_file:
            args += ["-i", self.key_file, "-o", "IdentitiesOnly=yes"]
        for key, value in opts.items():
            args += ["-o", f"{key}={value}"]
        return args

    def _ssh(self, line: str, timeout: float, stdin: Any = subprocess.DEVNULL) -> Completed:
        argv = ["ssh", *self.options(), self.target, line]
        done = _run_local(argv, timeout, stdin=stdin)
        if done.code == SSH_FAILED and not done.timed_out:
            raise TransportError(
                f"ssh {self.target} port {self.port}: {_last_line(done.stderr) or 'failed'}")
        return done

    def run(self, argv: list[str], timeout: float, cwd: str | None = None) -> Completed:
        self.log.append(f"run {shlex.join(argv)}")
        return self._ssh(remote_command(argv, timeout, cwd), timeout + CLIENT_GRACE_S)

    def put(self, local: Path, remote: str) -> None:
        self.log.append(f"put {local.name} -> {remote}")
        parent, tmp = os.path.dirname(remote) or ".", f"{remote}.part"
        line = (f"mkdir -p {shlex.quote(parent)} && cat > {shlex.quote(tmp)} && "
                f"mv -f {shlex.quote(tmp)} {shlex.quote(remote)}")
        with open(local, "rb") as stream:
            done = self._ssh(line, 600, stdin=stream)
        if done.code != 0:
            raise TransportError(f"copy of {local.name} to {self.target}:{remote} failed "
                                 f"(exit {done.code}): {_last_line(done.stderr)}")

    def exists(self, remote: str) -> bool:
        return self.run(["test", "-e", remote], 60).code == 0

    def home(self) -> str:
        if self._home is None:
            done = self.run(["pwd"], 60)
            if done.code != 0 or not done.stdout.strip():
                raise TransportError(f"cannot read the login directory on {self.target}")
            self._home = done.stdout.strip().splitlines()[-1]
        return self._home

    def close(self) -> None:
        """Stop the shared master connection (it would linger for ControlPersist)."""
        if self._control.exists():
            _run_local(["ssh", *self.options(), "-O", "exit", self.target], 20)
        if self._own_sock_dir is not None:
            shutil.rmtree(self._own_sock_dir, ignore_errors=True)


@dataclass
class LocalTransport:
    """The device is on this machine: the same interface, no SSH."""

    log: list[str] = field(default_factory=list)

    def _path(self, remote: str) -> Path:
        return Path(self.home(), remote)

    def run(self, argv: list[str], timeout: float, cwd: str | None = None) -> Completed:
        self.log.append(f"run {shlex.join(argv)}")
        line = remote_command(argv, timeout, str(self._path(cwd)) if cwd else None)
        return _run_local(["sh", "-c", line], timeout + CLIENT_GRACE_S,
                          env={**os.environ, "HOME": self.home()})

    def put(self, local: Path, remote: str) -> None:
        self.log.append(f"put {local.name} -> {remote}")
        dest = self._path(remote)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        shutil.copyfile(local, tmp)
        os.replace(tmp, dest)

    def exists(self, remote: str) -> bool:
        return self._path(remote).exists()

    def home(self) -> str:
        return os.path.expanduser("~")

    def close(self) -> None:
        return None


def open_transport(device: dict[str, Any], scratch: Path) -> Transport:
    """The transport `action["device"]` asks for (kind ssh or local)."""
    kind = device.get("kind")
    if kind == "local":
        return LocalTransport()
    if kind != "ssh":
        raise TransportError(f"device kind {kind!r} is neither 'ssh' nor 'local'")
    if not device.get("host"):
        raise TransportError("the device toolchain names no host (toolchain.host)")
    key = device.get("key_file")
    if key and not Path(key).is_file():
        raise TransportError(f"ssh key file {key} does not exist (toolchain.key_file)")
    return SshTransport(str(device["host"]), device.get("user"), int(device.get("port") or 22),
                        key, scratch)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
