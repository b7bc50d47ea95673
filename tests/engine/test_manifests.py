"""A manifest is parsed once while its file stays as it was, and read again as soon as it is
replaced, removed or made."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hefbuild.engine import manifests as manifests_module
from hefbuild.engine.manifests import ManifestReader


def publish(path: Path, value: dict) -> None:
    """As the engine publishes a manifest: a temp file renamed over it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def test_a_manifest_is_parsed_again_only_when_its_file_changed(tmp_path, monkeypatch):
    parsed: list[str] = []
    real = manifests_module.read_json
    monkeypatch.setattr(manifests_module, "read_json",
                        lambda p: parsed.append(p) or real(p))
    path = tmp_path / "manifest.json"
    reader = ManifestReader()
    assert reader.read(str(path)) is None  # none yet
    publish(path, {"key": "a"})
    assert reader.read(str(path)) == {"key": "a"}  # an absent file is never remembered
    assert reader.read(str(path)) == {"key": "a"}
    assert len(parsed) == 2
    publish(path, {"key": "b"})  # same size, a new inode
    assert reader.read(str(path)) == {"key": "b"}
    path.write_text('{"key": "cc"}')  # written in place: size and mtime move
    assert reader.read(str(path)) == {"key": "cc"}
    path.unlink()
    assert reader.read(str(path)) is None
    path.write_text("[1, 2]")  # not an object: no manifest
    assert reader.read(str(path)) is None
    assert len(parsed) == 6
