"""docs/parameters.md is what the declarations say, and every parameter is explained."""

from __future__ import annotations

from pathlib import Path

from hefbuild.report.paramdoc import reference, undocumented

REPO = Path(__file__).resolve().parents[2]


def test_the_reference_is_generated_from_the_declarations() -> None:
    on_disk = (REPO / "docs" / "parameters.md").read_text(encoding="utf-8")
    assert on_disk == reference(REPO / "rules"), \
        "docs/parameters.md is stale: python -m hefbuild.report.paramdoc > docs/parameters.md"


def test_every_declared_parameter_has_a_meaning_and_none_is_stale() -> None:
    assert undocumented() == []
