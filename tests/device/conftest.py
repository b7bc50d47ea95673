"""A real OpenSSH server on 127.0.0.1 standing in for the Hailo device host.

The "device host" is this machine reached over that sshd, as root with a generated key. Its
python is a wrapper script (`device-python`) that runs this test run's interpreter with
`tests/fakes` and `rules` on PYTHONPATH and FAKE_HAILO_CONTROL set, so `hailo_platform` is the
test double (which generates by running the HEF's ONNX graph on ONNX Runtime). Skipped when
/usr/sbin/sshd is missing, unless CI=true (then it fails: `.ci/sshd-up` installs it).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SSHD = "/usr/sbin/sshd"
START_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class SshHost:
    port: int
    key_file: Path
    python: Path  # the wrapper the device toolchain names as its interpreter
    control: Path  # FAKE_HAILO_CONTROL of every device_check process
    root: Path  # scratch folder of the fixture

    @property
    def url(self) -> str:
        return f"ssh://root@127.0.0.1:{self.port}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hefbuild-test",
                    "-f", str(path)], check=True, capture_output=True)


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
    root = tmp_path_factory.mktemp("sshd")
    keygen(root / "host_key")
    keygen(root / "client_key")
    shutil.copy(root / "client_key.pub", root / "authorized_keys")
    port = free_port()
    (root / "sshd_config").write_text(sshd_config(root, port))
    Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)  # privilege separation
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(root / "sshd_config")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for_banner(port, proc)
        yield SshHost(port, root / "client_key", wrapper(root), root / "control.json", root)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
