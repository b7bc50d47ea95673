"""Where a project keeps things: names every layer needs, without loading a declaration
(a no-op imports this, not the loaders)."""

from __future__ import annotations

from pathlib import Path

SETTINGS_FILE = "hefbuild.toml"  # the settings (declare/settings.py reads it)
STATE_DIR = ".hefbuild"  # hefbuild's own files in a project (caches, lock, verdicts)
TARGETS_DIR = "targets"
# hefbuild's own declarations: in the source tree next to src/, like the project's folders.
BUILTIN_TARGETS = Path(__file__).resolve().parents[3] / TARGETS_DIR
VARIANT_SEP = "@"  # `<model>@<variant>`
