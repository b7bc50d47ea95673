"""The engine names no vendor, no target and no stage: those live in targets/ (and the
toolchain and rule files), so a new NPU or stage is a declaration, not an engine change.

Scans src/hefbuild/**/*.py for vendor and target words (code and comments alike) and for
string literals equal to a name targets/ declares (a stage, an artifact alias, a keep task).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "hefbuild"
WORDS = re.compile(r"hailo|\bhef\b|cpu-ort|cpu_ort|openvino", re.I)

# (file, word or literal) -> why it is generic, not a target's.
EXCEPTIONS = {
    ("hub.py", "openvino"): "a folder name of Hugging Face repositories (another format's "
                            "copy of the model, left out of a download), not a target",
    ("toolchains.py", "reference"): "a docker image reference (toolchain.image), not the stage",
    ("resources.py", "resources"): "the declaration key of a stage's resources, not the stage",
    ("ray.py", "resources"): "Ray's task option for custom resources, not the stage",
    ("fetch.py", "fetch"): "the name of the `doit fetch TASK` command (issue 24), not the "
                           "stage",
}

# Modules that still name a target's reports or a vendor's tools (none left of issue 13).
# Each is expected to fail (strict): clean one and the test says to drop it from here.
PENDING: dict[str, str] = {}


def declared_names() -> set[str]:
    names: set[str] = set()
    for path in (REPO / "targets").glob("*.toml"):
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
        names |= {s["name"] for s in doc.get("stages", [])}
        names |= {k["name"] for k in doc.get("keep", [])}
        alias = doc.get("target", {}).get("artifact", {}).get("alias")
        names |= {alias} if alias else set()
    return names


def findings(path: Path, names: set[str], src: Path = SRC) -> list[str]:
    rel = path.relative_to(src).as_posix()
    text = path.read_text(encoding="utf-8")
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for word in {m.group(0).lower() for m in WORDS.finditer(line)}:
            if (path.name, word) not in EXCEPTIONS:
                found.append(f"{rel}:{n}: {word!r} in {line.strip()[:80]}")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and node.value in names \
                and (path.name, node.value) not in EXCEPTIONS:
            found.append(f"{rel}:{node.lineno}: the literal {node.value!r}")
    return found


MODULES = sorted(SRC.rglob("*.py"))


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=PENDING[rel]))
    if (rel := p.relative_to(SRC).as_posix()) in PENDING else p
    for p in MODULES], ids=lambda p: p.relative_to(SRC).as_posix())
def test_the_module_names_no_vendor_target_or_stage(path: Path) -> None:
    assert findings(path, declared_names()) == []


def test_the_names_are_found_at_all(tmp_path: Path) -> None:
    """A negative control: the scan sees what it looks for, a word in a comment and a
    declared name as a literal, and nothing in a module that has neither."""
    names = declared_names()
    assert {"fetch", "verify", "compile", "placement", "hef"} <= names
    probe = tmp_path / "src" / "hefbuild" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text('# made for the OpenVINO target\nSTAGE = "verify"\nOTHER = "build"\n',
                     encoding="utf-8")
    found = findings(probe, names, probe.parent)
    assert [f.split(":", 2)[1] for f in found] == ["1", "2"], found
    probe.write_text('STAGE = "build"\n', encoding="utf-8")
    assert findings(probe, names, probe.parent) == []


@pytest.mark.parametrize("exception", sorted(EXCEPTIONS))
def test_every_exception_is_still_needed(exception: tuple[str, str]) -> None:
    file, what = exception
    path = next(p for p in MODULES if p.name == file)
    text = path.read_text(encoding="utf-8")
    assert re.search(rf"\b{re.escape(what)}\b", text, re.I), f"{file} no longer has {what!r}"
