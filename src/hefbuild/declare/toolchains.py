"""Toolchain declarations as typed values: `toolchain/*.toml` (host, docker, venv, and the
device kinds ssh and local). A toolchain's identity, as it enters keys, is probed by
execute/toolchain.py; here only what the file says."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError
from .declfile import SHA256_RE, _only_keys, _table, read_toml
from .params import ParamDef, check_params, check_project_file
from .params import ParamType as T
from .resources import KEY as RESOURCES
from .resources import parse_resources

SECRET_ENV_RE = re.compile(
    r"(^|_)(TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIALS?|API_KEY|ACCESS_KEY|PRIVATE_KEY)(_|$)", re.I)


@dataclass(frozen=True)
class ToolchainSpec:
    name: str
    file: str
    kind: str
    interpreter: str = "current"
    packages: dict[str, str] = field(default_factory=dict)  # distribution -> required version
    env: dict[str, str] = field(default_factory=dict)
    description: str = ""
    limits: dict[str, Any] = field(default_factory=dict)  # timeout (s), memory (bytes), cpus
    image: dict[str, Any] = field(default_factory=dict)  # docker: context, tag, reference
    wheels: dict[str, str] = field(default_factory=dict)  # docker: file -> sha256
    device: dict[str, Any] = field(default_factory=dict)  # ssh/local: see _device
    venv: dict[str, str] = field(default_factory=dict)  # venv: python (base), requirements
    # docker: where a missing wheel is downloaded from (said when one is missing); no key
    wheels_source: str = ""
    resources: dict[str, float] = field(default_factory=dict)  # every stage's in it (no key)


LIMIT_KEYS = {
    "timeout": ParamDef(T.DURATION),
    "memory": ParamDef(T.SIZE),
    "cpus": ParamDef(T.FLOAT, minimum=0.01),
}


TOOLCHAIN_KINDS = ("host", "docker", "ssh", "local", "venv")
_DEVICE_KEYS = {"kind", "interpreter", "description", "host", "user", "port", "key_file",
                "remote_dir", "host_key", "known_hosts"}
_TOOLCHAIN_KEYS = {"host": {"kind", "interpreter", "description", "wheels_source"},
                   "ssh": _DEVICE_KEYS,
                   "local": _DEVICE_KEYS - {"host", "user", "port", "host_key", "known_hosts"},
                   "docker": {"kind", "interpreter", "description", "context", "tag", "image",
                              "wheels_source"},
                   "venv": {"kind", "python", "requirements", "description"}}


def load_toolchain(path: Path, root: Path) -> ToolchainSpec:
    shown = path.relative_to(root).as_posix()
    doc = read_toml(path, shown)
    _only_keys(doc, {"toolchain", "packages", "env", "limits", "wheels", "pins", "retry",
                     RESOURCES}, shown, "")
    tc = _table(doc, "toolchain", shown, "toolchain")
    kind = tc.get("kind")
    if kind not in TOOLCHAIN_KINDS:
        raise SpecError(shown, "toolchain.kind", "one of " + ", ".join(TOOLCHAIN_KINDS))
    _only_keys(tc, _TOOLCHAIN_KEYS[kind], shown, "toolchain")
    interpreter = tc.get("interpreter", "current" if kind == "host" else "python3")
    if not isinstance(interpreter, str) or not interpreter:
        raise SpecError(shown, "toolchain.interpreter", "'current' or a path to a python")
    limits = check_params(_table(doc, "limits", shown, "limits"), LIMIT_KEYS, shown, "limits",
                          root)
    image = _docker_image(tc, shown, root, path.stem) if kind == "docker" else {}
    device = _device(doc, tc, shown, root) if kind in ("ssh", "local") else {}
    venv = _venv(tc, shown, root) if kind == "venv" else {}
    wheels = _str_table(doc, "wheels", shown)
    for name, sha in wheels.items():
        if sha and not SHA256_RE.match(sha):  # "" = not pinned yet: the image will not build
            raise SpecError(shown, f"wheels.{name}", "a sha256 hex digest of the wheel")
    env = _str_table(doc, "env", shown)
    for name in env:
        if SECRET_ENV_RE.search(name):
            raise SpecError(shown, f"env.{name}", "no secrets in a toolchain's environment (it "
                            "enters every key and manifest): export it in your shell; fetch "
                            "gets the hub's token from there")
    return ToolchainSpec(path.stem, shown, kind, interpreter, _str_table(doc, "packages", shown),
                         env, str(tc.get("description", "")),
                         limits, image, wheels, device, venv,
                         _wheels_source(tc, shown),
                         parse_resources(doc.get(RESOURCES, {}), shown, RESOURCES))


def _wheels_source(tc: dict[str, Any], shown: str) -> str:
    value = tc.get("wheels_source", "")
    if not isinstance(value, str):
        raise SpecError(shown, "toolchain.wheels_source", f"a string, got {value!r}")
    return value


def _venv(tc: dict[str, Any], shown: str, root: Path) -> dict[str, str]:
    """A second Python environment made by hefbuild: a base interpreter and a lock file of
    exact pins under toolchain/ (execute/venvs.py)."""
    python = tc.get("python", "python3")
    if not isinstance(python, str) or not python:
        raise SpecError(shown, "toolchain.python", "the base interpreter, e.g. 'python3'")
    lock = tc.get("requirements")
    if not isinstance(lock, str) or not lock:
        raise SpecError(shown, "toolchain.requirements",
                        "a lock file of exact pins, e.g. 'toolchain/<name>.requirements.txt'")
    check_project_file(lock, root, shown, "toolchain.requirements")
    for n, line in enumerate((root / lock).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-") and "==" not in line:
            raise SpecError(shown, "toolchain.requirements", f"{lock} line {n}: an exact pin "
                            f"'name==version', got {line!r}")
    return {"python": python, "requirements": lock}


DEVICE_KEYS = {
    "host": ParamDef(T.STR),
    "user": ParamDef(T.STR),
    "port": ParamDef(T.INT, 22, minimum=1, maximum=65535),
    "key_file": ParamDef(T.STR),
    "remote_dir": ParamDef(T.STR, ".cache/hefbuild-device"),
    # The device host's public key(s), `<type> <base64>` as in a known_hosts line without
    # the host name (a string or a list); else a known_hosts file (default ~/.ssh/known_hosts).
    "host_key": ParamDef(T.STR_LIST),
    "known_hosts": ParamDef(T.STR),
}
RETRY_KEYS = {
    "attempts": ParamDef(T.INT, 3, minimum=1, maximum=20),
    "backoff": ParamDef(T.DURATION, 2.0),
    "attempt_timeout": ParamDef(T.DURATION, 600.0),
}


def _device(doc: dict[str, Any], tc: dict[str, Any], shown: str, root: Path) -> dict[str, Any]:
    """Where the device is and what it must run: connection (with the host key it must
    present), pins, retry policy. Only the pins enter keys; the connection, the host key and
    the retry policy never do."""
    import base64
    import binascii

    given = {k: v for k, v in tc.items() if k in DEVICE_KEYS}
    if isinstance(given.get("host_key"), str):
        given["host_key"] = [given["host_key"]]
    device = check_params(given, DEVICE_KEYS, shown, "toolchain", root)
    key_types = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                 "ecdsa-sha2-nistp521", "ssh-rsa")
    pinned = []
    for text in device.get("host_key", []):
        kind, b64 = (text.split() + ["", ""])[:2]
        try:
            blob = base64.b64decode(b64, validate=True) if kind in key_types else b""
        except binascii.Error:
            blob = b""
        named = blob[4:4 + int.from_bytes(blob[:4], "big")]
        if not b64 or named != kind.encode():
            got = " ".join(text.split())
            raise SpecError(shown, "toolchain.host_key", "expected a public host key "
                            f"'<type> <base64>' with type one of {', '.join(key_types)}, "
                            f"got {got if len(got) <= 60 else got[:57] + '...'!r}")
        pinned.append(f"{kind} {b64}")
    if "host_key" in device:
        if not pinned:
            raise SpecError(shown, "toolchain.host_key", "expected at least one host key")
        if "known_hosts" in device:
            raise SpecError(shown, "toolchain.known_hosts",
                            "expected either host_key or known_hosts, not both")
    known = device.get("known_hosts")
    if known is not None and not known.startswith(("/", "~")):
        raise SpecError(shown, "toolchain.known_hosts",
                        f"expected an absolute path or one starting with ~, got {known!r}")
    # The declared key is this host's only: HEFBUILD_DEVICE naming another does not inherit it.
    declared_host = f"[{device.get('host')}]:{device['port']}" if tc["kind"] == "ssh" else "local"
    device.update(declared_host=declared_host, declared_in=shown)
    if pinned:
        device.update(host_key=pinned, host_key_for=declared_host)
    device["kind"] = tc["kind"]
    # What the device must run (runtime, firmware: the vendor's names); they enter keys.
    device["pins"] = _str_table(doc, "pins", shown)
    if not device["pins"]:
        raise SpecError(shown, "pins", "the versions the device must run, e.g. runtime and "
                        "firmware (they enter the check's key)")
    device["retry"] = check_params(_table(doc, "retry", shown, "retry"), RETRY_KEYS, shown,
                                   "retry", root)
    if tc["kind"] == "ssh" and not device.get("host"):
        raise SpecError(shown, "toolchain.host", "the device host name (or HEFBUILD_DEVICE)")
    return device


def _docker_image(tc: dict[str, Any], shown: str, root: Path, name: str) -> dict[str, Any]:
    """Either a build context under images/ (built by `doit image:<name>`), or a reference."""
    context, reference = tc.get("context"), tc.get("image")
    if (context is None) == (reference is None):
        raise SpecError(shown, "toolchain.context",
                        "either context (a folder under images/) or image (a reference)")
    if context is not None:
        if not isinstance(context, str) or not (root / context / "Dockerfile").is_file():
            raise SpecError(shown, "toolchain.context",
                            f"a folder holding a Dockerfile, got {context!r}")
        return {"context": context, "tag": str(tc.get("tag", f"hefbuild/{name}:local"))}
    if not isinstance(reference, str) or not reference:
        raise SpecError(shown, "toolchain.image", "an image reference (name@sha256:…)")
    return {"reference": reference}


def _str_table(doc: dict[str, Any], key: str, shown: str) -> dict[str, str]:
    table = _table(doc, key, shown, key)
    for name, value in table.items():
        if not isinstance(value, str):
            raise SpecError(shown, f"{key}.{name}", f"a string, got {type(value).__name__}")
    return dict(table)
