"""`common.device` against the real sshd on loopback: run, hard timeout, put, exists.
(The host key checks themselves: test_host_key.py.)"""

from __future__ import annotations

import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import REPO, SshHost

sys.path.insert(0, str(REPO / "rules"))
from common.device import LocalTransport, SshTransport, TransportError, open_transport  # noqa: E402


@pytest.fixture
def ssh(ssh_host: SshHost, tmp_path: Path):
    transport = open_transport({"kind": "ssh", "host": "127.0.0.1", "user": ssh_host.user,
                                "port": ssh_host.port, "key_file": str(ssh_host.key_file),
                                "host_key": ssh_host.host_key}, tmp_path / "scratch")
    yield transport
    transport.close()


def test_run_returns_code_and_both_streams(ssh: SshTransport):
    done = ssh.run(["sh", "-c", "echo out; echo err >&2; exit 7"], timeout=30)
    assert (done.code, done.stdout, done.stderr, done.timed_out) == (7, "out\n", "err\n", False)


def test_scratch_known_hosts_holds_exactly_the_declared_key(
    ssh: SshTransport, ssh_host: SshHost, tmp_path: Path
):
    ssh.run(["true"], timeout=30)
    pinned = f"[127.0.0.1]:{ssh_host.port} {ssh_host.host_key}\n"
    assert (tmp_path / "scratch" / "known_hosts").read_text() == pinned  # nothing added
    assert "StrictHostKeyChecking=yes" in ssh.options()


def test_hard_timeout_kills_the_remote_process(ssh: SshTransport, tmp_path: Path):
    marker = tmp_path / "survived"
    start = time.monotonic()
    done = ssh.run(["sh", "-c", f"sleep 4 && touch {marker}"], timeout=1)
    assert done.timed_out and time.monotonic() - start < 4
    time.sleep(4)
    assert not marker.exists()  # the remote sleep was killed, not just the client


def test_put_exists_and_cwd(ssh: SshTransport, tmp_path: Path):
    src = tmp_path / "blob.bin"
    src.write_bytes(b"\x00\x01 data")
    remote = str(tmp_path / "remote" / "deep" / "blob.bin")
    assert not ssh.exists(remote)
    ssh.put(src, remote)
    assert ssh.exists(remote) and Path(remote).read_bytes() == src.read_bytes()
    assert ssh.run(["ls"], 30, cwd=str(Path(remote).parent)).stdout == "blob.bin\n"
    assert ssh.home() == pwd.getpwnam(ssh.user).pw_dir  # the login's, from passwd


def test_connection_is_shared_and_closed(ssh: SshTransport):
    for _ in range(3):
        assert ssh.run(["true"], timeout=30).code == 0
    check = ["ssh", *ssh.options(), "-O", "check", ssh.target]
    running = subprocess.run(check, capture_output=True, text=True)
    assert running.returncode == 0 and "Master running" in running.stderr
    ssh.close()
    assert subprocess.run(check, capture_output=True, text=True).returncode != 0


def test_refused_connection_is_a_transport_error(ssh_host: SshHost, tmp_path: Path):
    from .conftest import free_port

    bad = SshTransport("127.0.0.1", ssh_host.user, free_port(), str(ssh_host.key_file), tmp_path)
    with pytest.raises(TransportError, match="127.0.0.1"):
        bad.run(["true"], timeout=30)


def test_local_transport_has_the_same_behaviour(tmp_path: Path):
    local = LocalTransport()
    src = tmp_path / "a.txt"
    src.write_text("x")
    local.put(src, str(tmp_path / "b" / "a.txt"))
    assert local.exists(str(tmp_path / "b" / "a.txt"))
    done = local.run(["sh", "-c", "sleep 5"], timeout=1)
    assert done.timed_out
