"""The device host must present the declared host key before it gets anything.

Against the real loopback sshd of conftest.py: the declared key (`host_key`), a known_hosts
file (`known_hosts`, default ~/.ssh/known_hosts) and the CI override (HEFBUILD_DEVICE with
HEFBUILD_DEVICE_HOST_KEY) are checked with StrictHostKeyChecking=yes. A wrong key is "host key
changed", no key at all is "host key not known"; either way the HEF is never copied and the
failure is not retried. Neither the key nor the known_hosts path enters a key.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from hefbuild.declare.toolchains import load_toolchain
from hefbuild.errors import SpecError
from hefbuild.execute.toolchain import ToolchainResolver

from .conftest import REPO, Bench, SshHost, error_line, keygen, public_key

sys.path.insert(0, str(REPO / "rules"))
from common.device import (  # noqa: E402
    HostKeyError,
    HostTrust,
    SshTransport,
    open_transport,
)

TOOLCHAIN = "toolchain/hailo10h-device.toml"


def ed25519_key(seed: int) -> str:
    """A well-formed (never used) ssh-ed25519 public key."""
    kind = b"ssh-ed25519"
    blob = len(kind).to_bytes(4, "big") + kind + (32).to_bytes(4, "big") + bytes([seed]) * 32
    return f"ssh-ed25519 {base64.b64encode(blob).decode()}"


def other_key(tmp_path: Path) -> Path:
    """Another real ed25519 key pair; its public half is not the sshd's host key."""
    keygen(tmp_path / "other_host_key")
    return tmp_path / "other_host_key.pub"


def ssh_keygen_fingerprint(pub: Path) -> str:
    """`SHA256:…` as ssh-keygen prints it (independent of our own fingerprint())."""
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)],
                         capture_output=True, text=True, check=True).stdout
    return out.split()[1]


def transport(ssh_host: SshHost, scratch: Path, **trust) -> SshTransport:
    device = {"kind": "ssh", "host": "127.0.0.1", "user": ssh_host.user, "port": ssh_host.port,
              "key_file": str(ssh_host.key_file), "declared_in": TOOLCHAIN, **trust}
    return open_transport(device, scratch)


def changed(port: int, pub: Path) -> str:
    return (f"device host [127.0.0.1]:{port}: host key changed (expected ssh-ed25519 "
            f"{ssh_keygen_fingerprint(pub)}); refusing to send the HEF")


def not_known(port: int, where: str = "~/.ssh/known_hosts") -> str:
    return (f"device host [127.0.0.1]:{port}: host key not known; declare host_key in "
            f"{TOOLCHAIN} (ssh-keyscan -p {port} 127.0.0.1 prints it) or add it to {where}")


# -- the transport alone -----------------------------------------------------------------------


def test_declared_key_is_pinned_before_connecting_and_passes(ssh_host: SshHost, tmp_path: Path):
    ssh = transport(ssh_host, tmp_path / "scratch", host_key=ssh_host.host_key)
    try:
        pinned = tmp_path / "scratch" / "known_hosts"
        assert pinned.read_text() == f"[127.0.0.1]:{ssh_host.port} {ssh_host.host_key}\n"
        options = " ".join(ssh.options())
        assert "StrictHostKeyChecking=yes" in options and "accept-new" not in options
        assert f'UserKnownHostsFile="{pinned}"' in options
        assert ssh.run(["true"], timeout=30).code == 0
        assert pinned.read_text() == f"[127.0.0.1]:{ssh_host.port} {ssh_host.host_key}\n"
    finally:
        ssh.close()


def test_wrong_declared_key_is_refused_and_nothing_is_copied(ssh_host: SshHost, tmp_path: Path):
    pub = other_key(tmp_path)
    ssh = transport(ssh_host, tmp_path / "scratch", host_key=public_key(pub))
    hef = tmp_path / "model.hef"
    hef.write_bytes(b"HEF")
    remote = tmp_path / "remote" / "model.hef"
    try:
        with pytest.raises(HostKeyError) as err:
            ssh.put(hef, str(remote))
        assert str(err.value) == changed(ssh_host.port, pub)
        with pytest.raises(HostKeyError):
            ssh.run(["true"], timeout=30)
    finally:
        ssh.close()
    assert not remote.parent.exists()  # the "device" (this machine) never got a byte
    assert any("REMOTE HOST IDENTIFICATION HAS CHANGED" in line for line in ssh.log)


def test_no_key_and_no_user_known_hosts_is_not_known(
    ssh_host: SshHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.ssh/known_hosts at all
    ssh = transport(ssh_host, tmp_path / "scratch")
    try:
        with pytest.raises(HostKeyError) as err:
            ssh.run(["true"], timeout=30)
    finally:
        ssh.close()
    assert str(err.value) == not_known(ssh_host.port)
    assert not (tmp_path / "home" / ".ssh").exists()  # nothing was written there either


def test_known_hosts_file_with_the_right_hashed_key_passes(ssh_host: SshHost, tmp_path: Path):
    known = ssh_host.known_hosts(tmp_path / "known_hosts")
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], check=True, capture_output=True)
    assert "127.0.0.1" not in known.read_text()
    ssh = transport(ssh_host, tmp_path / "scratch", known_hosts=str(known))
    try:
        assert ssh.run(["true"], timeout=30).code == 0
    finally:
        ssh.close()
    assert not (tmp_path / "scratch" / "known_hosts").exists()  # the declared file is used


def test_known_hosts_file_with_another_key_is_changed(
    ssh_host: SshHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    pub = other_key(tmp_path)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    ssh_host.known_hosts(home / ".ssh" / "known_hosts", public_key(pub))
    monkeypatch.setenv("HOME", str(home))  # the default: the user's known_hosts
    ssh = transport(ssh_host, tmp_path / "scratch")
    try:
        with pytest.raises(HostKeyError) as err:
            ssh.home()
    finally:
        ssh.close()
    assert str(err.value) == changed(ssh_host.port, pub)


def test_override_key_pins_the_host_hefbuild_device_names(
    ssh_host: SshHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The device entry HEFBUILD_DEVICE (+ HEFBUILD_DEVICE_HOST_KEY) makes: the toolchain's own
    key was declared for another host and is ignored; the variable's key is pinned."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.ssh/known_hosts
    declared = {"declared_host": "[device.invalid]:22", "host_key": [ssh_host.host_key],
                "host_key_for": "[device.invalid]:22"}
    ssh = transport(ssh_host, tmp_path / "scratch", **declared)
    try:
        with pytest.raises(HostKeyError) as err:  # even though it is the right key
            ssh.run(["true"], timeout=30)
    finally:
        ssh.close()
    assert str(err.value) == (
        f"device host [127.0.0.1]:{ssh_host.port}: host key not known; give it in "
        f"HEFBUILD_DEVICE_HOST_KEY (ssh-keyscan -p {ssh_host.port} 127.0.0.1 prints it) or add "
        f"it to ~/.ssh/known_hosts")
    pub = other_key(tmp_path)
    for key, ok in ((public_key(pub), False), (ssh_host.host_key, True)):
        override = {**declared, "host_key": [key], "host_key_for": None,
                    "host_key_from": "HEFBUILD_DEVICE_HOST_KEY"}
        ssh = transport(ssh_host, tmp_path / f"scratch-{ok}", **override)
        try:
            if ok:
                assert ssh.run(["true"], timeout=30).code == 0
            else:
                with pytest.raises(HostKeyError) as err:
                    ssh.run(["true"], timeout=30)
                assert str(err.value) == changed(ssh_host.port, pub)
        finally:
            ssh.close()


def test_malformed_override_key_names_the_variable(ssh_host: SshHost, tmp_path: Path):
    with pytest.raises(HostKeyError) as err:
        transport(ssh_host, tmp_path, host_key="ssh-dss AAAA",
                  host_key_from="HEFBUILD_DEVICE_HOST_KEY")
    assert str(err.value).startswith("HEFBUILD_DEVICE_HOST_KEY: expected a public host key "
                                     "'<type> <base64>' with type one of ssh-ed25519")
    assert str(err.value).endswith("got 'ssh-dss AAAA'")


# -- loading the toolchain -----------------------------------------------------------------------

DEVICE_TOML = """\
[toolchain]
kind = "ssh"
host = "pi.local"
{trust}
[pins]
hailort = "5.3.0"
firmware = "5.3.0"
"""


def load(tmp_path: Path, trust: str):
    path = tmp_path / TOOLCHAIN
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(DEVICE_TOML.format(trust=trust))
    return load_toolchain(path, tmp_path)


EXPECTED = ("expected a public host key '<type> <base64>' with type one of ssh-ed25519, "
            "ecdsa-sha2-nistp256, ecdsa-sha2-nistp384, ecdsa-sha2-nistp521, ssh-rsa, got ")


@pytest.mark.parametrize("value, got", [
    ('"ssh-dss AAAAB3NzaC1kc3MAAACBAP"', "'ssh-dss AAAAB3NzaC1kc3MAAACBAP'"),
    ('"ssh-ed25519"', "'ssh-ed25519'"),
    ('"AAAAC3NzaC1lZDI1NTE5AAAAIA"', "'AAAAC3NzaC1lZDI1NTE5AAAAIA'"),
    ('"ssh-ed25519 not*base64"', "'ssh-ed25519 not*base64'"),
    (f'"ssh-rsa {ed25519_key(2).split()[1]}"', f"'ssh-rsa {ed25519_key(2).split()[1][:49]}...'"),
    (f'["{ed25519_key(3)}", "[pi.local]:22 {ed25519_key(4)}"]', "'[pi.local]:22 ssh-ed25519"),
])
def test_malformed_host_key_is_a_spec_error_at_load(tmp_path: Path, value: str, got: str):
    with pytest.raises(SpecError) as err:
        load(tmp_path, f"host_key = {value}")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{TOOLCHAIN}: toolchain.host_key: {EXPECTED}{got}")


@pytest.mark.parametrize("trust, message", [
    (f'host_key = "{ed25519_key(5)}"\nknown_hosts = "~/kh"',
     "toolchain.known_hosts: expected either host_key or known_hosts, not both"),
    ('known_hosts = "ssh/known_hosts"',
     "toolchain.known_hosts: expected an absolute path or one starting with ~, "
     "got 'ssh/known_hosts'"),
    ("host_key = []", "toolchain.host_key: expected at least one host key"),
])
def test_host_key_and_known_hosts_are_checked_at_load(tmp_path: Path, trust: str, message: str):
    with pytest.raises(SpecError) as err:
        load(tmp_path, trust)
    assert str(err.value) == f"{TOOLCHAIN}: {message}"


def test_host_key_loads_and_stays_out_of_the_toolchain_identity(tmp_path: Path):
    one, two = ed25519_key(6), ed25519_key(7)
    single = load(tmp_path / "a", f'host_key = "{one} root@pi"').device
    assert (single["host_key"], single["host_key_for"]) == ([one], "[pi.local]:22")
    listed = load(tmp_path / "b", f'host_key = ["{one}", "{two}"]').device
    assert listed["host_key"] == [one, two]
    assert load(tmp_path / "c", 'known_hosts = "~/.ssh/pi_hosts"').device["known_hosts"] == \
        "~/.ssh/pi_hosts"
    declarations = ("", f'host_key = "{one}"', f'host_key = "{two}"', 'known_hosts = "/etc/kh"')
    identities = [ToolchainResolver(tmp_path / f"{n}.json").identity(load(tmp_path / f"{n}", t))
                  for n, t in enumerate(declarations)]  # what the stage's key holds
    assert identities == [{"kind": "device", "hailort": "5.3.0", "firmware": "5.3.0"}] * 4


# -- doit verify end to end --------------------------------------------------------------------


def test_the_override_key_reaches_the_rule_and_replaces_the_declared_one() -> None:
    """HEFBUILD_DEVICE_HOST_KEY goes with HEFBUILD_DEVICE to the rule (runtime.py)."""
    from hefbuild.declare.toolchains import ToolchainSpec
    from hefbuild.plan.limits import device_target

    device = {"kind": "ssh", "host": "a.invalid", "port": 22, "host_key": [ed25519_key(8)],
              "host_key_for": "[a.invalid]:22"}
    spec = ToolchainSpec("d", TOOLCHAIN, "ssh", device=device)
    env = {"HEFBUILD_DEVICE": "ssh://u@b.invalid:2222",
           "HEFBUILD_DEVICE_HOST_KEY": ed25519_key(9)}
    with mock.patch.dict(os.environ, env):
        assert HostTrust.of(device_target(spec)).keys == (ed25519_key(9),)


def nothing_sent(bench: Bench) -> bool:
    return not bench.remote.exists() or not any(bench.remote.rglob("*"))


@pytest.mark.e2e
def test_declared_key_passes_and_neither_it_nor_known_hosts_is_in_the_key(
    bench: Bench, tmp_path: Path
):
    first = bench.verify("-a")  # the bench declares the sshd's real host key
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.outcomes()["verify:tiny-hailo-llama"] == "built" and bench.report()["passed"]

    bench.device(known_hosts=bench.host.known_hosts(tmp_path / "known_hosts"))
    again = bench.verify()
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.outcomes()["verify:tiny-hailo-llama"] == "uptodate"  # same key

    forced = bench.verify("-a")  # the known_hosts file with the right key passes
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert forced.outcomes()["verify:tiny-hailo-llama"] == "built" and bench.report()["passed"]


@pytest.mark.e2e
def test_wrong_declared_key_fails_once_and_the_hef_is_never_copied(
    bench: Bench, tmp_path: Path
):
    pub = other_key(tmp_path)
    bench.device(host_key=public_key(pub))
    run = bench.verify("-a")  # forced: a passed check of this HEF may be in the store
    assert run.returncode != 0 and run.outcomes()["verify:tiny-hailo-llama"] == "failed"
    assert changed(bench.host.port, pub) in error_line(run)
    assert nothing_sent(bench)
    log = bench.failed_log()
    assert sum(1 for line in log.splitlines() if line.startswith("[transport] run")) == 1
    assert "attempt 1/" not in log and "device logs" not in log  # no retry, nothing more


@pytest.mark.e2e
def test_no_key_and_an_empty_known_hosts_is_not_known(bench: Bench, tmp_path: Path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text("")
    bench.device(host_key="")  # neither host_key nor known_hosts: ~/.ssh/known_hosts
    run = bench.verify("-a", env={"HOME": str(home)})
    assert run.returncode != 0
    assert not_known(bench.host.port) in error_line(run)
    assert nothing_sent(bench)
    assert (home / ".ssh" / "known_hosts").read_text() == ""  # nothing accepted into it

    # HEFBUILD_DEVICE names this host instead of the declared one: the key declared for that
    # one (even the right key) is not inherited, and the line says where to give it
    bench.device(host="device.invalid", port=22)
    run = bench.verify("-a", env={"HOME": str(home), "HEFBUILD_DEVICE": bench.host.url})
    assert run.returncode != 0
    port = bench.host.port
    assert (f"device host [127.0.0.1]:{port}: host key not known; give it in "
            f"HEFBUILD_DEVICE_HOST_KEY (ssh-keyscan -p {port} 127.0.0.1 prints it) or add it "
            f"to ~/.ssh/known_hosts") in error_line(run)
    assert nothing_sent(bench)


@pytest.mark.e2e
def test_hefbuild_device_with_hefbuild_device_host_key(bench: Bench, tmp_path: Path):
    home = tmp_path / "home"  # an empty ~/.ssh/known_hosts: only the variable can vouch
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text("")
    # the toolchain names another host, with that host's key: the override must not use it
    bench.device(host="device.invalid", port=22, host_key=ed25519_key(10))
    pub = other_key(tmp_path)
    env = {"HEFBUILD_DEVICE": bench.host.url, "HOME": str(home)}

    wrong = bench.verify("-a", env={**env, "HEFBUILD_DEVICE_HOST_KEY": public_key(pub)})
    assert wrong.returncode != 0
    assert changed(bench.host.port, pub) in error_line(wrong)
    assert nothing_sent(bench)

    right = bench.verify("-a", env={**env, "HEFBUILD_DEVICE_HOST_KEY": bench.host.host_key})
    assert right.returncode == 0, right.stdout + right.stderr
    assert bench.report()["passed"]
