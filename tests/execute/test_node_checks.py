"""What a cluster node compares before it runs a stage (its toolchain against the key's,
its hefbuild against the driver's) and the driver's loopback-cache warning: pure checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from hefbuild.execute.node_checks import (
    hefbuild_differs,
    loopback_cache,
    probe_wanted,
    source_digest,
    toolchain_differs,
)

HOST = {"kind": "host", "python": "3.11.9", "implementation": "cpython",
        "platform": "linux-x86_64", "packages": {"torch": "2.13.0", "numpy": "2.1.0"}}


def found(**changes: object) -> dict:
    packages = {**HOST["packages"], **changes.pop("packages", {})}  # type: ignore[dict-item]
    return {**{k: v for k, v in HOST.items() if k != "kind"}, **changes, "packages": packages}


def test_the_same_toolchain_passes() -> None:
    assert toolchain_differs("gpu-1", "host", HOST, found()) is None


def test_another_package_version_names_node_package_wanted_and_found() -> None:
    assert toolchain_differs("gpu-1", "cpu-ort", HOST, found(packages={"torch": "2.14.1"})) == (
        "node gpu-1 has torch 2.14.1, the key was made for 2.13.0 (toolchain cpu-ort)")


def test_a_missing_package_and_one_the_key_was_made_without() -> None:
    assert toolchain_differs("n", "t", HOST, found(packages={"numpy": None})) == (
        "node n has no numpy installed, the key was made for 2.1.0 (toolchain t)")
    wanted = {**HOST, "packages": {"onnx": None}}
    assert toolchain_differs("n", "t", wanted, found(packages={"onnx": "1.17"})) == (
        "node n has onnx 1.17, the key was made without it (toolchain t)")


@pytest.mark.parametrize("field,value", [("python", "3.12.1"), ("implementation", "pypy"),
                                         ("platform", "linux-aarch64")])
def test_another_interpreter_is_refused(field: str, value: str) -> None:
    assert toolchain_differs("pi", "host", HOST, found(**{field: value})) == (
        f"node pi has {field} {value}, the key was made for {HOST[field]} (toolchain host)")


def test_only_host_and_venv_identities_are_probed() -> None:
    assert probe_wanted("host", HOST) == ["numpy", "torch"]
    venv = {"kind": "venv", "python": "3.11.9", "implementation": "cpython",
            "platform": "linux-x86_64", "lock": "sha256:ab", "venv": "sha256:cd"}
    assert probe_wanted("venv", venv) == []
    assert probe_wanted("docker", {"kind": "docker", "image_id": "sha256:ef"}) is None
    assert probe_wanted("device", {"kind": "device", "hailort": "5.3.0"}) is None


def test_another_hefbuild_names_the_node_and_both_versions() -> None:
    driver = {"version": "0.1.0", "source": "sha256:" + "a" * 64}
    assert hefbuild_differs("gpu-1", driver, dict(driver)) is None
    node = {"version": "0.1.0", "source": "sha256:" + "b" * 64}
    assert hefbuild_differs("gpu-1", driver, node) == (
        "node gpu-1 runs hefbuild 0.1.0 (source sha256:bbbbbbbbbbbb…), the driver 0.1.0 "
        "(source sha256:aaaaaaaaaaaa…): install the driver's hefbuild on that node")


def test_the_source_digest_follows_every_py_file_but_not_bytecode(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    first = source_digest(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.cpython-311.py").write_text("cache")
    assert source_digest(tmp_path) == first
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    edited = source_digest(tmp_path)
    assert edited != first
    (tmp_path / "sub" / "b.py").rename(tmp_path / "sub" / "c.py")  # same bytes, other name
    assert source_digest(tmp_path) not in (first, edited)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/cache", "https://localhost/c",
                                 "http://127.3.0.1/c", "http://[::1]:9090/c"])
def test_a_loopback_cache_is_warned_about_for_a_node_on_another_host(url: str) -> None:
    message = loopback_cache("10.0.0.5", "gpu-1", "10.0.0.7", url)
    assert message is not None
    assert message.startswith(f"the remote cache {url} is on loopback, and node gpu-1 "
                              f"(10.0.0.7) is not on this host (10.0.0.5)")


@pytest.mark.parametrize("driver,node,url", [
    ("10.0.0.5", "10.0.0.5", "http://127.0.0.1:8080/c"),   # the node is on this host
    ("10.0.0.5", "127.0.0.1", "http://127.0.0.1:8080/c"),  # so is one that reports loopback
    ("10.0.0.5", "10.0.0.7", "http://cache.lan:8080/c"),   # a cache every node reaches
    ("10.0.0.5", "10.0.0.7", "http://10.0.0.5:8080/c"),
    ("10.0.0.5", "10.0.0.7", "file:///mnt/cache"),
])
def test_no_warning_when_the_node_reaches_the_same_cache(driver: str, node: str,
                                                          url: str) -> None:
    assert loopback_cache(driver, "n", node, url) is None


def test_a_node_probes_its_interpreter_once_while_nothing_is_installed(monkeypatch) -> None:  # noqa: ANN001
    from hefbuild.execute import toolchain

    calls: list[str] = []
    monkeypatch.setattr(toolchain, "_probe", lambda python, names: calls.append(python) or
                        {"python": "3.11.9", "packages": {}})
    monkeypatch.setattr(toolchain, "_PROBED", {})
    stamps = iter(["s1", "s1", "s2"])
    monkeypatch.setattr(toolchain, "_stamp", lambda python, names: next(stamps))
    for _ in range(3):
        toolchain.probe("/usr/bin/python3", ["torch"])
    assert calls == ["/usr/bin/python3", "/usr/bin/python3"]  # again once the stamp moved
