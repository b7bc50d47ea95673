"""Incremental builds in CI, end to end with the real doit and the real rules: the main
branch builds tiny-llama and uploads signed results to nginx; a fresh clone with an empty
store runs `doit verify:tiny-llama` and executes no rule."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e.conftest import DoitRun, Project, copy_project, tiny_tasks
from fakes.cache_server import NginxCache

from hefbuild.remote.signing import generate

from .conftest import require_nginx

pytestmark = pytest.mark.e2e


@dataclass
class WarmRemote:
    server: NginxCache
    ci: Project
    first: DoitRun
    public: str


# One main-branch build (about 40 s: the whole tiny chain) uploads for every test here; each
# test then reads it from a new clone with an empty store, and uploads nothing.
@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmRemote]:
    require_nginx()
    base = tmp_path_factory.mktemp("warm-remote")
    server = NginxCache(root=base / "nginx").start()
    try:
        public = generate("ci-main", base / "ci.secret")
        ci = copy_project(base / "ci", base / "ci-store")
        first = ci.doit("verify:tiny-llama", env={
            "HEFBUILD_REMOTE_CACHE": server.url, "HEFBUILD_REMOTE_UPLOAD": "1",
            "HEFBUILD_SIGNING_KEY": str(base / "ci.secret")})
        assert first.returncode == 0, first.stdout + first.stderr
        yield WarmRemote(server, ci, first, public)
    finally:
        server.stop()


def reader(tmp_path: Path, settings: str) -> Project:
    """A pull request's runner: a new clone and an empty store, `settings` its hefbuild.toml."""
    (tmp_path / "pr").mkdir()
    pr = copy_project(tmp_path / "pr" / "project", tmp_path / "pr" / "store")
    (pr.root / "hefbuild.toml").write_text(settings)
    return pr


def test_a_fresh_clone_with_an_empty_store_runs_no_rule_against_a_warm_remote(
        tmp_path: Path, warm: WarmRemote) -> None:
    first = warm.first
    assert first.outcomes() == {t: "built" for t in tiny_tasks()}
    assert "hefbuild: 5 built, 0 restored, 0 from remote, 0 up to date, 0 failed" in first.stdout

    # Reads only signed entries.
    pr = reader(tmp_path, f'[cache]\nremote = "{warm.server.url}"\n'
                          f'trusted_keys = ["{warm.public}"]\n')
    before = len(warm.server.requests())
    second = pr.doit("verify:tiny-llama")
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.outcomes() == {t: "remote" for t in tiny_tasks()}
    assert all(e["bytes"] > 0 for e in second.events)
    assert "5 from remote (" in second.stdout and " 0 built," in second.stdout
    assert "remote (" in second.stdout  # each task's line says where its result came from
    assert "WARNING" not in second.stderr
    assert "verify:tiny-llama: passed" in second.stdout
    assert pr.manifest("verify:tiny-llama")["outcome"] == "remote"

    # Its own result is now local: again, nothing remote.
    again = pr.doit("verify:tiny-llama")
    assert again.outcomes() == {t: "uptodate" for t in tiny_tasks()}
    assert [r for r in warm.server.requests()[before:] if r[0] == "PUT"] == []  # never writes


def test_minimal_download_moves_only_the_checks_outputs_then_what_a_rerun_reads(
        tmp_path: Path, warm: WarmRemote) -> None:
    """Issue 24: a warm remote, a fresh clone and an empty store, `download = "minimal"`."""
    server, ci = warm.server, warm.ci
    sizes = {t.split(":")[0]: sum(o["size"] for o in ci.manifest(t)["outputs"].values())
             for t in tiny_tasks()}
    chain = sum(sizes.values())

    pr = reader(tmp_path, f'[cache]\nremote = "{server.url}"\ndownload = "minimal"\n')
    before = settled(server)
    run = pr.doit("verify:tiny-llama")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.outcomes() == {t: "remote" for t in tiny_tasks()}  # no rule ran
    moved = settled(server) - before  # entries, records and verify's report and log
    assert moved <= 0.1 * chain, (moved, chain)
    assert "verify:tiny-llama: passed" in run.stdout
    assert "4 left in the remote cache" in run.stdout
    export = pr.root / "build" / "tiny-llama" / "export"
    assert sorted(p.name for p in export.iterdir()) == ["manifest.json"]

    status = pr.doit("status", "tiny-llama")
    assert "export:tiny-llama: up to date, in the remote cache" in status.stdout
    assert "5 up to date (4 in the remote cache)" in status.stdout
    explain = pr.doit("explain", "compile:tiny-llama")
    assert "in the remote cache, not in build/: model.opt.onnx, log.txt" in explain.stdout

    # A check parameter changes: verify alone runs, on exactly the inputs it reads.
    pr.edit("models/tiny-llama.toml", "max_new_tokens = 16", "max_new_tokens = 12")
    before = settled(server, "/cas/")
    rerun = pr.doit("verify:tiny-llama")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert rerun.tasks("built") == {"verify:tiny-llama"}
    assert settled(server, "/cas/") - before == sizes["fetch"] + sizes["compile"]
    assert sorted(p.name for p in export.iterdir()) == ["manifest.json"]

    # A person asks for a stage: its outputs and log come into build/, byte for byte.
    fetched = pr.doit("fetch", "export:tiny-llama")
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    for path in (ci.root / "build" / "tiny-llama" / "export").iterdir():
        if path.name != "manifest.json":
            assert (export / path.name).read_bytes() == path.read_bytes()
    assert pr.doit("verify:tiny-llama").outcomes() == {t: "uptodate" for t in tiny_tasks()}


def settled(server, prefix: str = "/") -> int:  # noqa: ANN001 - NginxCache
    """Bytes the cache served so far, once its access log stops growing (nginx logs a
    request just after answering it)."""
    import time

    last = -1
    while True:
        now = server.sent_bytes("GET", prefix)
        if now == last:
            return now
        last = now
        time.sleep(0.2)
