"""Incremental builds in CI, end to end with the real doit and the real rules: the main
branch builds tiny-llama and uploads signed results to nginx; a fresh clone with an empty
store runs `doit verify:tiny-llama` and executes no rule."""

from __future__ import annotations

import pytest
from e2e.conftest import copy_project, tiny_tasks

from hefbuild.remote.signing import generate

pytestmark = pytest.mark.e2e


def test_a_fresh_clone_with_an_empty_store_runs_no_rule_against_a_warm_remote(
        tmp_path, make_cache):
    server = make_cache()
    public = generate("ci-main", tmp_path / "ci.secret")
    ci = copy_project(tmp_path / "ci", tmp_path / "ci-store")
    ci_env = {"HEFBUILD_REMOTE_CACHE": server.url, "HEFBUILD_REMOTE_UPLOAD": "1",
              "HEFBUILD_SIGNING_KEY": str(tmp_path / "ci.secret")}
    first = ci.doit("verify:tiny-llama", env=ci_env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.outcomes() == {t: "built" for t in tiny_tasks()}
    assert "hefbuild: 5 built, 0 restored, 0 from remote, 0 up to date, 0 failed" in first.stdout

    # A pull request's runner: new clone, empty store, reads only signed entries.
    (tmp_path / "pr").mkdir()
    pr = copy_project(tmp_path / "pr" / "project", tmp_path / "pr" / "store")
    (pr.root / "hefbuild.toml").write_text(
        f'[cache]\nremote = "{server.url}"\ntrusted_keys = ["{public}"]\n')
    second = pr.doit("verify:tiny-llama")
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.outcomes() == {t: "remote" for t in tiny_tasks()}
    assert all(e["bytes"] > 0 for e in second.events)
    assert "5 from remote (" in second.stdout and " 0 built," in second.stdout
    assert "remote (" in second.stdout  # each task's line says where its result came from
    assert "WARNING" not in second.stderr
    assert "verify:tiny-llama: passed" in second.stdout
    assert pr.manifest("verify:tiny-llama")["outcome"] == "remote"
    puts_before = [r for r in server.requests() if r[0] == "PUT"]

    # Its own result is now local: again, and after `rm -rf build`, nothing remote.
    again = pr.doit("verify:tiny-llama")
    assert again.outcomes() == {t: "uptodate" for t in tiny_tasks()}
    assert [r for r in server.requests() if r[0] == "PUT"] == puts_before  # readers never write
