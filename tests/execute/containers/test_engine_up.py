"""The Docker engine .ci/docker-up starts is what hefbuild's docker executor relies on: no
network, read-only bind mounts, memory limits that kill, a Python image, cached builds."""

from __future__ import annotations

from pathlib import Path

MIB = 1 << 20


def interfaces(proc_net_dev: str) -> list[str]:
    """Interface names from /proc/net/dev (two header lines, then `name: counters`)."""
    return [line.split(":", 1)[0].strip() for line in proc_net_dev.splitlines()[2:] if line]


def test_engine_has_no_bridge_network(docker_client):
    drivers = {n.attrs["Driver"] for n in docker_client.networks.list()}
    assert "bridge" not in drivers, drivers
    assert docker_client.info()["Driver"] != "vfs"  # overlay2 here; vfs copies every layer


def test_network_none_has_only_loopback(run, busybox_image):
    ran = run(busybox_image, ["cat", "/proc/net/dev"])
    assert ran.exit_code == 0, ran.stderr
    assert interfaces(ran.stdout) == ["lo"], ran.stdout


def test_read_only_bind_mount_cannot_be_written(run, busybox_image, tmp_path: Path):
    (tmp_path / "in.txt").write_text("hello\n")
    script = "cat /data/in.txt && echo changed > /data/in.txt; touch /data/new.txt"
    ran = run(busybox_image, ["sh", "-c", script],
              volumes={str(tmp_path): {"bind": "/data", "mode": "ro"}})
    assert ran.stdout == "hello\n"  # mounted and readable
    assert ran.exit_code != 0
    assert "Read-only file system" in ran.stderr, ran.stderr
    assert (tmp_path / "in.txt").read_text() == "hello\n"
    assert not (tmp_path / "new.txt").exists()

    # The same script on a read-write mount does write: the failure above is the mount's.
    ran = run(busybox_image, ["sh", "-c", script],
              volumes={str(tmp_path): {"bind": "/data", "mode": "rw"}})
    assert ran.exit_code == 0, ran.stderr
    assert (tmp_path / "in.txt").read_text() == "changed\n"
    assert (tmp_path / "new.txt").exists()


def test_memory_limit_kills_a_memory_hog(run, busybox_image):
    limits = {"mem_limit": 64 * MIB, "memswap_limit": 64 * MIB}
    # dd allocates (and fills) one block of bs bytes.
    ran = run(busybox_image, ["dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"],
              **limits)
    assert ran.state["OOMKilled"] is True, ran.state
    assert ran.exit_code == 137  # SIGKILL

    ran = run(busybox_image, ["dd", "if=/dev/zero", "of=/dev/null", "bs=8M", "count=1"],
              **limits)
    assert ran.exit_code == 0, ran.stderr
    assert ran.state["OOMKilled"] is False


def test_python_image_runs_python3(run, python_image):
    ran = run(python_image, ["python3", "-c", "import sys; print(1); print(sys.version_info[0])"])
    assert ran.exit_code == 0, ran.stderr
    assert ran.stdout.splitlines() == ["1", "3"]


def test_identical_rebuild_keeps_the_image_id(built_images, busybox_image, run,
                                              tmp_path: Path):
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM hefbuild-test/busybox:1\nCOPY data.txt /data.txt\n")
    (context / "data.txt").write_text("one\n")

    first = built_images(context, "rebuild")
    assert built_images(context, "rebuild") == first

    (context / "data.txt").write_text("two\n")
    changed = built_images(context, "rebuild")
    assert changed != first
    ran = run(changed, ["cat", "/data.txt"])
    assert ran.stdout == "two\n"
    ran = run(first, ["cat", "/data.txt"])
    assert ran.stdout == "one\n"


def test_no_container_is_left_behind(docker_client, session_label):
    # Last in this file: every run above has removed its container.
    left = docker_client.containers.list(all=True, filters={"label": session_label})
    assert left == []


def test_the_code_finds_the_engine_without_docker_host(docker_client, monkeypatch):
    """A Quick start machine has the engine as its current docker context and no
    DOCKER_HOST exported: the executor must reach the engine the tests use."""
    from hefbuild.execute.docker import connect

    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert connect().info()["ID"] == docker_client.info()["ID"]


def test_a_docker_context_names_the_endpoint(tmp_path: Path, monkeypatch):
    import shutil
    import subprocess

    import pytest

    from hefbuild.execute.docker import docker_endpoint

    cli = shutil.which("docker")
    if cli is None:
        pytest.skip("the docker CLI is not installed (apt-get install docker.io)")
    env = {"PATH": "/usr/bin:/bin", "DOCKER_CONFIG": str(tmp_path), "HOME": str(tmp_path)}
    for argv in (["context", "create", "elsewhere", "--docker", "host=unix:///tmp/x.sock"],
                 ["context", "use", "elsewhere"]):
        subprocess.run([cli, *argv], env=env, check=True, capture_output=True, timeout=30)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert docker_endpoint() == "unix:///tmp/x.sock"
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")
    assert docker_endpoint() == "tcp://127.0.0.1:2375"  # DOCKER_HOST wins, as for the CLI
