"""Negative controls: the oracle must catch a broken build, or it proves nothing."""

from __future__ import annotations

import os

from .helpers import MODEL
from .oracle import oracle_problems


def test_oracle_accepts_a_correct_build(built, root, store):
    assert oracle_problems(root, store) == []


def test_oracle_catches_an_edited_output(built, root, store):
    out = root / "build" / MODEL / "export" / "export_report.json"
    out.unlink()  # replace, not write through: the store's object stays intact
    out.write_text('{"edited": true}')
    problems = oracle_problems(root, store)
    assert f"export:{MODEL}: restored" in problems[0]
    assert f"build/{MODEL}/export/export_report.json: does not match its manifest" in problems


def test_oracle_catches_a_stale_stage(built, root, store):
    rule = root / "rules" / "cpu_ort" / "verify.py"
    rule.write_text(rule.read_text() + "# edited after the build\n")
    problems = oracle_problems(root, store)
    assert len(problems) == 1 and problems[0].startswith(f"verify:{MODEL}: built")


def test_oracle_catches_a_manifest_that_lies(built, root, store):
    manifest = root / "build" / MODEL / "verify" / "manifest.json"
    text = manifest.read_text()
    os.chmod(manifest, 0o644)
    digest = text.split('"digest": "')[1][:64]
    manifest.write_text(text.replace(digest, "0" * 64))
    assert any("report.json: does not match" in p for p in oracle_problems(root, store))
