"""`hefbuild --download all|minimal …`: the run's `[cache] download`, off doit's command line."""

from __future__ import annotations

import os

import pytest

from hefbuild.cli.main import download_option


@pytest.mark.parametrize("args", [["--download", "all", "verify:x"],
                                  ["verify:x", "--download=all"]])
def test_the_option_leaves_the_command_line_as_the_settings_override(
        args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEFBUILD_REMOTE_DOWNLOAD", raising=False)
    assert download_option(args) == ["verify:x"]
    assert os.environ["HEFBUILD_REMOTE_DOWNLOAD"] == "all"


def test_without_the_option_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEFBUILD_REMOTE_DOWNLOAD", raising=False)
    assert download_option(["-n", "2", "verify"]) == ["-n", "2", "verify"]
    assert "HEFBUILD_REMOTE_DOWNLOAD" not in os.environ
