"""A real OpenSSH server on 127.0.0.1 standing in for the Hailo device host.

The "device host" is this machine reached over that sshd, as the user who runs the tests (an
sshd that is not root can let in no one else), with a generated key; the sshd's host key is
generated too, and `SshHost.host_key` is its public half (what a device toolchain declares as
`host_key`). Its python is a wrapper script (`device-python`) that runs this test run's
interpreter with `tests/fakes` and `rules` on PYTHONPATH and FAKE_HAILO_CONTROL set, so
`hailo_platform` is the test double (which generates by running the HEF's ONNX graph on ONNX
Runtime). Skipped when /usr/sbin/sshd is missing, unless CI=true (then it fails:
`.ci/sshd-up` installs it), and for a user whose login shell runs no command (nobody).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e.conftest import DoitRun, Project
from hailo_chain import MODEL, hailo_chain, hailo_project

REPO = Path(__file__).resolve().parents[2]
SSHD = "/usr/sbin/sshd"
START_TIMEOUT_S = 15.0
NO_SHELL = ("nologin", "false")  # login shells that run no command


@dataclass(frozen=True)
class SshHost:
    port: int
    user: str  # who runs the tests: root on CI, anyone elsewhere
    key_file: Path
    python: Path  # the wrapper the device toolchain names as its interpreter
    control: Path  # FAKE_HAILO_CONTROL of every device_check process
    root: Path  # scratch folder of the fixture

    @property
    def url(self) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}"

    @property
    def host_key(self) -> str:
        """The sshd's public host key, `ssh-ed25519 <base64>` (no comment)."""
        return public_key(self.root / "host_key.pub")

    def known_hosts(self, path: Path, key: str | None = None) -> Path:
        """A known_hosts file holding `key` (default: the real one) for this sshd."""
        path.write_text(f"[127.0.0.1]:{self.port} {key or self.host_key}\n")
        return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hefbuild-test",
                    "-f", str(path)], check=True, capture_output=True)


def public_key(pub: Path) -> str:
    """`<type> <base64>` of an OpenSSH .pub file."""
    return " ".join(pub.read_text().split()[:2])


def sshd_config(root: Path, port: int) -> str:
    return "\n".join([
        f"Port {port}",
        "ListenAddress 127.0.0.1",
        f"HostKey {root / 'host_key'}",
        f"PidFile {root / 'sshd.pid'}",
        f"AuthorizedKeysFile {root / 'authorized_keys'}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "StrictModes no",
        "MaxSessions 50",
        "MaxStartups 50:30:100",
        "LogLevel ERROR",
        "",
    ])


def wrapper(root: Path) -> Path:
    path = root / "device-python"
    pythonpath = f"{REPO / 'tests' / 'fakes'}:{REPO / 'rules'}"
    path.write_text("#!/bin/sh\n"
                    f"export PYTHONPATH='{pythonpath}'\n"
                    f"export FAKE_HAILO_CONTROL='{root / 'control.json'}'\n"
                    f"exec '{sys.executable}' \"$@\"\n")
    path.chmod(0o755)
    return path


def login_user() -> str:
    """Who the sshd lets in: the user running the tests, whose login shell runs each
    command, so a user without one (nobody's nologin) cannot be the device host's user."""
    me = pwd.getpwuid(os.getuid())
    if Path(me.pw_shell).name in NO_SHELL:
        pytest.skip(f"the loopback sshd logs in as {me.pw_name}, whose shell is "
                    f"{me.pw_shell}: run the tests as root or as a user with a shell")
    return me.pw_name


def wait_for_banner(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {proc.stderr.read()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                if conn.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"sshd did not accept on 127.0.0.1:{port} in {START_TIMEOUT_S} s")


@pytest.fixture(scope="session")
def ssh_host(tmp_path_factory: pytest.TempPathFactory):
    if not Path(SSHD).exists() or shutil.which("ssh") is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{SSHD} or ssh missing on CI: run .ci/sshd-up first")
        pytest.skip(f"{SSHD} or the ssh client is missing (apt-get install openssh-server)")
    user = login_user()
    root = tmp_path_factory.mktemp("sshd")
    keygen(root / "host_key")
    keygen(root / "client_key")
    shutil.copy(root / "client_key.pub", root / "authorized_keys")
    port = free_port()
    (root / "sshd_config").write_text(sshd_config(root, port))
    if os.getuid() == 0:  # privilege separation; an sshd that is not root does without
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(root / "sshd_config")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for_banner(port, proc)
        yield SshHost(port, user, root / "client_key", wrapper(root), root / "control.json", root)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- a project wired to that device host ----------------------------------------------------

VERIFY = f"verify:{MODEL}"
DEVICE = """\
[toolchain]
kind = "ssh"
host = "{host}"
user = "{user}"
port = {port}
key_file = "{key}"
{trust}
interpreter = "{python}"
remote_dir = "{remote}"
description = "this machine over a loopback sshd; hailo_platform is the FAKE test double"

[pins]
hailort = "5.3.0"
firmware = "5.3.0"

[retry]
attempts = {attempts}
backoff = "0.2s"
attempt_timeout = "{timeout}"
"""


@pytest.fixture(scope="module")
def device_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store per file, holding the tiny hailo chain up to its HEF and reference, which
    the session builds once (tests/hailo_chain.py); the device's verify is never in it
    (test_verify_over_ssh.py's first verify must be a build)."""
    shared = hailo_chain(tmp_path_factory)
    store = tmp_path_factory.mktemp("device-store") / "store"
    shutil.copytree(shared / "store", store, symlinks=True)
    return store


class Bench:
    """One project copy wired to the loopback device host (for the `doit verify` tests)."""

    def __init__(self, project: Project, host: SshHost, remote: Path, state: Path):
        self.project, self.host, self.remote, self.state = project, host, remote, state

    def device(self, *, attempts: int = 3, timeout: str = "60s", host: str = "127.0.0.1",
               port: int | None = None, host_key: str | list[str] | None = None,
               known_hosts: Path | None = None) -> None:
        """The device toolchain; it declares the sshd's real host key unless given another
        `host_key` ("" declares none) or a `known_hosts` file instead."""
        if known_hosts is not None:
            trust = f'known_hosts = "{known_hosts}"'
        elif host_key == "":
            trust = ""
        else:
            trust = f"host_key = {json.dumps(host_key or self.host.host_key)}"
        text = DEVICE.format(host=host, port=port or self.host.port, user=self.host.user,
                             key=self.host.key_file,
                             trust=trust, python=self.host.python, remote=self.remote,
                             attempts=attempts, timeout=timeout)
        (self.project.root / "toolchain/hailo10h-device.toml").write_text(text)

    def fake(self, mode: str = "ok", **versions: str) -> None:
        control = {"mode": mode, "versions": versions, "state_dir": str(self.state)}
        self.host.control.write_text(json.dumps(control))

    def verify(self, *args: str, env: dict | None = None) -> DoitRun:
        return self.project.doit(*args, VERIFY, timeout=300, env=env)

    @property
    def stage_dir(self) -> Path:
        return self.project.root / "build" / MODEL

    def log(self) -> str:
        return (self.stage_dir / "verify" / "log.txt").read_text()

    def failed_log(self) -> str:
        return (self.stage_dir / "verify.failed.log").read_text()

    def report(self) -> dict:
        return json.loads((self.stage_dir / "verify" / "report.json").read_text())


@pytest.fixture
def bench(tmp_path: Path, device_store: Path, ssh_host: SshHost) -> Bench:
    project = hailo_project(tmp_path / "project", device_store)
    run = project.doit(f"hef:{MODEL}", f"reference:{MODEL}")  # restored from the store
    assert run.returncode == 0, run.stdout + run.stderr
    b = Bench(project, ssh_host, tmp_path / "device-cache", tmp_path / "fake-state")
    b.device()
    b.fake("ok")
    return b


def error_line(run: DoitRun) -> str:
    """doit's one ERROR line for the stage: it quotes the rule's last log line."""
    return next(line for line in (run.stdout + run.stderr).splitlines()
                if line.startswith(f"ERROR: {VERIFY}"))
