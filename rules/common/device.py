"""Reaching the Hailo device host: one small interface, two transports.

    Transport              run(argv, timeout, cwd) -> Completed; put(local, remote);
    |                      exists(remote); home(); close(); `log` lists every command and upload
    +-- SshTransport       the OpenSSH client (BatchMode, the key file, the port), the host key
    |                      checked strictly against a pinned one (HostTrust), one shared master
    |                      connection (ControlMaster/ControlPersist)
    +-- LocalTransport     the same, on this machine (doit runs on the device host itself)

Every `run` has a HARD timeout on both sides: the command runs under coreutils `timeout`
(TERM at the limit, KILL 5 s later; it needs `timeout` on the device host, as every Debian-based
Pi image has), and the local client process group is killed a little after that. A timed-out
command comes back with `timed_out=True` instead of raising.

Remote paths are absolute (see `home()`), or relative to the login directory.

The device host must prove it is the declared one before anything is sent to it: ssh runs
with `StrictHostKeyChecking=yes` against exactly the declared keys (`host_key`, written to a
known_hosts file in the scratch dir under `HostKeyAlias=[host]:port`), or against a
known_hosts file (`known_hosts`, default `~/.ssh/known_hosts`); the system-wide file is not
consulted and nothing is ever added. A host that cannot prove it raises `HostKeyError`, one
line, which is never retried as a transient failure.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
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
HOST_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                  "ecdsa-sha2-nistp521", "ssh-rsa")
USER_KNOWN_HOSTS = "~/.ssh/known_hosts"
# What ssh prints when it refuses the host key (StrictHostKeyChecking=yes).
HOST_KEY_REFUSED = ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED",
                    "and you have requested strict checking")


class TransportError(Exception):
    """The device host could not be reached or a file could not be copied to it."""


class HostKeyError(TransportError):
    """The device host did not prove it is the declared one: nothing was sent, no retry."""


def parse_host_key(text: object, source: str) -> str:
    """`<type> <base64> [comment]` -> `<type> <base64>`, else a one-line HostKeyError naming
    `source` (the toolchain key or the environment variable)."""
    parts = text.split() if isinstance(text, str) else []
    if len(parts) >= 2 and parts[0] in HOST_KEY_TYPES and _blob_type(parts[1]) == parts[0]:
        return f"{parts[0]} {parts[1]}"
    shown = " ".join(str(text).split())
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise HostKeyError(f"{source}: expected a public host key '<type> <base64>' with type one "
                       f"of {', '.join(HOST_KEY_TYPES)}, got {shown!r}")


def _blob_type(b64: str) -> str | None:
    """The key type a public key blob names in its first field (RFC 4253 string)."""
    try:
        blob = base64.b64decode(b64, validate=True)
    except ValueError:
        return None
    size = int.from_bytes(blob[:4], "big")
    return blob[4:4 + size].decode("ascii", "replace") if 4 + size <= len(blob) else None


def fingerprint(key: str) -> str:
    """`<type> SHA256:<digest>` as ssh-keygen -l shows it (unpadded base64 of the sha256)."""
    kind, b64 = key.split()[:2]
    digest = hashlib.sha256(base64.b64decode(b64)).digest()
    return f"{kind} SHA256:{base64.b64encode(digest).decode().rstrip('=')}"


def known_hosts_name(host: str, port: int) -> str:
    """How ssh names host:port in known_hosts (`host` on port 22, else `[host]:port`)."""
    return host if port == 22 else f"[{host}]:{port}"


@dataclass(frozen=True)
class HostTrust:
    """Which host keys the device host may present: the pinned `keys`, else the entries for
    it in the known_hosts file `known_hosts` (`~` expanded when used)."""

    keys: tuple[str, ...] = ()
    known_hosts: str = USER_KNOWN_HOSTS
    declared_in: str = "the device toolchain"  # where to declare host_key, for the message
    overridden: bool = False  # HEFBUILD_DEVICE names another host than the toolchain

    @classmethod
    def of(cls, device: dict[str, Any]) -> HostTrust:
        """From `action["device"]`: `host_key` (a string or a list), `host_key_for` (the
        `[host]:port` those keys are for; they are ignored for any other host, e.g. the one
        HEFBUILD_DEVICE names; absent: the host reached), `host_key_from` (who declared them,
        for errors), `known_hosts`, `declared_host` (the toolchain's `[host]:port`, or
        `local`) and `declared_in` (the toolchain file)."""
        target = f"[{device.get('host')}]:{int(device.get('port') or 22)}"
        declared = device.get("host_key") or []
        listed = [declared] if isinstance(declared, str) else list(declared)
        if device.get("host_key_for") not in (None, target):
            listed = []
        source = str(device.get("host_key_from") or "toolchain.host_key")
        return cls(tuple(parse_host_key(key, source) for key in listed),
                   str(device.get("known_hosts") or USER_KNOWN_HOSTS),
                   str(device.get("declared_in") or cls.declared_in),
                   device.get("declared_host") not in (None, target))

    def expected(self, host: str, port: int) -> list[str]:
        """The keys the host must present: the pinned ones, else its known_hosts entries."""
        if self.keys:
            return list(self.keys)
        path = os.path.expanduser(self.known_hosts)
        if not os.path.isfile(path) or shutil.which("ssh-keygen") is None:
            return []
        try:  # ssh-keygen also finds hashed entries
            found = subprocess.run(["ssh-keygen", "-F", known_hosts_name(host, port), "-f", path],
                                   capture_output=True, text=True, errors="replace", timeout=30)
        except (OSError, subprocess.SubprocessError):
            return []
        keys = []
        for line in found.stdout.splitlines():
            fields = line.split()
            if len(fields) >= 3 and not line.startswith(("#", "@")) and \
                    fields[1] in HOST_KEY_TYPES:
                keys.append(f"{fields[1]} {fields[2]}")
        return keys


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
    trust: HostTrust = field(default_factory=HostTrust)
    log: list[str] = field(default_factory=list)
    _home: str | None = None

    def __post_init__(self) -> None:
        self.scratch.mkdir(parents=True, exist_ok=True)
        if self.trust.keys:  # exactly the declared keys, for exactly this host:port
            lines = [f"{self.alias} {key}\n" for key in self.trust.keys]
            (self.scratch / "known_hosts").write_text("".join(lines))
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

    @property
    def alias(self) -> str:
        """The device host in messages, and its name in the pinned known_hosts file."""
        return f"[{self.host}]:{self.port}"

    @property
    def known_hosts(self) -> str:
        """The one known_hosts file ssh checks the host key against."""
        if self.trust.keys:
            return str(self.scratch / "known_hosts")
        return os.path.expanduser(self.trust.known_hosts)

    def options(self) -> list[str]:
        opts = {
            "BatchMode": "yes",
            "StrictHostKeyChecking": "yes",
            # quoted: ssh splits this option on blanks and expands %-tokens
            "UserKnownHostsFile": '"{}"'.format(self.known_hosts.replace("%", "%%")),
            # nothing else vouches for a host key (whatever ~/.ssh/config says), nothing is added
            "GlobalKnownHostsFile": "/dev/null",
            "KnownHostsCommand": "none",
            "VerifyHostKeyDNS": "no",
            "UpdateHostKeys": "no",
            "CheckHostIP": "no",
            "ControlMaster": "auto",
            "ControlPath": str(self._control),
            "ControlPersist": "60",
            "ConnectTimeout": "20",
            "ServerAliveInterval": "15",
            "ServerAliveCountMax": "3",
            "LogLevel": "ERROR",
        }
        if self.trust.keys:  # looked up under this name, whatever ~/.ssh/config says
            opts["HostKeyAlias"] = self.alias
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
            if any(sign in done.stderr for sign in HOST_KEY_REFUSED):
                raise HostKeyError(self.refusal(done.stderr))
            raise TransportError(
                f"ssh {self.target} port {self.port}: {_last_line(done.stderr) or 'failed'}")
        return done

    def refusal(self, stderr: str) -> str:
        """ssh refused the host key: say which case it is and what to do, in one line."""
        for line in stderr.splitlines():  # ssh's own account, for the stage log
            if line.strip() and not line.startswith("@@@"):
                self.log.append(f"ssh: {line.strip()}")
        expected = self.trust.expected(self.host, self.port)
        if expected:
            shown = " or ".join(fingerprint(key) for key in expected)
            return (f"device host {self.alias}: host key changed (expected {shown}); "
                    f"refusing to send the HEF")
        declare = ("give it in HEFBUILD_DEVICE_HOST_KEY" if self.trust.overridden
                   else f"declare host_key in {self.trust.declared_in}")
        return (f"device host {self.alias}: host key not known; {declare} (ssh-keyscan -p "
                f"{self.port} {self.host} prints it) or add it to {self.trust.known_hosts}")

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
                        key, scratch, HostTrust.of(device))


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
