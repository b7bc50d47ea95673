"""The package's layers, in the order data flows through them; no module imports from a layer
after its own, and only the doit adapter imports doit. `errors` and `digest` are the shared
foundations every layer may use. Each layer's `__init__.py` says what it owns.

The check parses every module's imports (at any depth: function-level lazy imports count),
so a shortcut taken "just inside a function" fails here too. Its negative control runs the
same check on a module written to break the rule.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
LAYERS = ("declare", "plan", "store", "remote", "execute", "engine", "report", "cli")
FOUNDATIONS = {"hefbuild", "hefbuild.errors", "hefbuild.digest"}
# The path a project's dodo.py imports (kept for projects written before the layers).
ADAPTER_ALIASES = {"hefbuild.doit_tasks": "cli"}
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """-1 for the foundations, else the index of its layer."""
    if module in FOUNDATIONS:
        return -1
    if module in ADAPTER_ALIASES:
        return LAYERS.index(ADAPTER_ALIASES[module])
    return LAYERS.index(module.split(".")[1])


def imports_of(path: Path, known: set[str] | None = None) -> list[tuple[int, str]]:
    """(line, absolute module) of every import of a hefbuild module or of doit; with
    `known` modules, `from pkg import mod` counts as an import of pkg.mod, not of pkg."""
    module, package = module_name(path), path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            subs = [f"{target}.{a.name}" for a in node.names
                    if known is not None and f"{target}.{a.name}" in known]
            found += [(node.lineno, t) for t in subs] if len(subs) == len(node.names) \
                else [(node.lineno, target)]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, t) for line, t in found if t.split(".")[0] in ("hefbuild", "doit")]


def cycles(paths: list[Path]) -> list[list[str]]:
    """The import cycles among `paths` (strongly connected groups of more than one)."""
    names = {module_name(p): p for p in paths}
    graph = {m: {t for _, t in imports_of(p, set(names)) if t in names and t != m}
             for m, p in names.items()}
    order: list[str] = []
    seen: set[str] = set()

    def visit(m: str, edges: dict[str, set[str]], out: list[str]) -> None:
        seen.add(m)
        for n in sorted(edges[m]):
            if n not in seen:
                visit(n, edges, out)
        out.append(m)

    for m in sorted(graph):
        if m not in seen:
            visit(m, graph, order)
    reverse = {m: {n for n in graph if m in graph[n]} for m in graph}
    seen.clear()
    groups = []
    for m in reversed(order):
        if m not in seen:
            group: list[str] = []
            visit(m, reverse, group)
            if len(group) > 1:
                groups.append(sorted(group))
    return groups


def violations(path: Path) -> list[str]:
    module = module_name(path)
    here = layer_of(module)
    out = []
    for line, target in imports_of(path):
        if target.split(".")[0] == "doit":
            if here != LAYERS.index("cli"):
                out.append(f"{module}:{line} imports {target}: only cli/ may import doit")
            continue
        top = ".".join(target.split(".")[:2])
        there = layer_of(top if top in FOUNDATIONS or top in ADAPTER_ALIASES else top)
        if there > here:
            out.append(f"{module}:{line} imports {target}: {LAYERS[there]} comes after "
                       f"{LAYERS[here] if here >= 0 else 'the foundations'}")
    return out


MODULES = sorted((SRC / "hefbuild").rglob("*.py"))


def test_every_module_is_in_a_layer_or_a_foundation() -> None:
    loose = [module_name(p) for p in MODULES if p.parent == SRC / "hefbuild"
             and module_name(p) not in FOUNDATIONS | set(ADAPTER_ALIASES)]
    assert loose == []
    assert {p.name for p in (SRC / "hefbuild").iterdir()
            if p.is_dir() and any(p.glob("*.py"))} == set(LAYERS)  # not a stale __pycache__


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_no_module_imports_from_a_later_layer(path: Path) -> None:
    assert violations(path) == []


def test_there_is_no_import_cycle() -> None:
    assert cycles(MODULES) == []


def test_the_cycle_check_finds_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "src" / "hefbuild" / "report"
    fake.mkdir(parents=True)
    (fake / "a.py").write_text("from .b import x\n")
    (fake / "b.py").write_text("def f():\n    from . import a\n")
    (fake / "c.py").write_text("from . import a\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path / "src")
    assert cycles(sorted(fake.glob("*.py"))) == [["hefbuild.report.a", "hefbuild.report.b"]]


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_says_what_it_owns_and_may_import(layer: str) -> None:
    doc = ast.get_docstring(ast.parse((SRC / "hefbuild" / layer / "__init__.py").read_text()))
    assert doc and "import" in doc.lower(), f"{layer}/__init__.py: say what it owns and imports"


RULES = sorted((SRC.parent / "rules").rglob("*.py"))


@pytest.mark.parametrize("path", MODULES + RULES,
                         ids=lambda p: p.relative_to(SRC.parent).as_posix())
def test_no_module_is_over_400_lines(path: Path) -> None:
    """The engine's modules and the stage programs alike: one concern each."""
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_the_check_finds_an_upward_import_and_a_stray_doit(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a store module that imports the engine, lazily, and doit."""
    fake = tmp_path / "src"
    (fake / "hefbuild" / "store").mkdir(parents=True)
    bad = fake / "hefbuild" / "store" / "bad.py"
    bad.write_text("def f():\n    from ..engine.engine import Engine\n    import doit\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", fake)
    found = violations(bad)
    assert len(found) == 2
    assert "engine comes after store" in found[0] and "only cli/ may import doit" in found[1]
