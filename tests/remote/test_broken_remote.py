"""A broken cache never breaks a build: one warning saying which and why, then local work.

Real nginx on 127.0.0.1 in each failure mode (stopped, 5xx, 401, full), and a listener that
accepts and never answers; plus what must never leak: the token, in any file or message.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fakes.cache_server import SilentServer
from fakes.fake_executor import FakeExecutor

from .helpers import TASKS, cache_toml, engine, make_project, run_all


def build_with(tmp_path: Path, url: str, upload: bool = False, name: str = "p"):  # noqa: ANN201
    root = make_project(tmp_path / name / "proj", cache_toml(url, upload=upload))
    fake = FakeExecutor()
    eng = engine(root, tmp_path / name / "store", fake)
    outcomes = run_all(eng)
    return eng, fake, outcomes


def assert_one_warning(eng, *words: str) -> None:  # noqa: ANN001
    assert len(eng.warnings) == 1, eng.warnings
    for word in words:
        assert word in eng.warnings[0], eng.warnings[0]


def test_a_stopped_server_is_one_warning_then_a_local_build(tmp_path, make_cache):
    server = make_cache()
    url = server.url
    server.stop()
    eng, fake, outcomes = build_with(tmp_path, url, upload=True)
    assert outcomes == ["built"] * len(TASKS) and len(fake.ran) == len(TASKS)
    assert_one_warning(eng, "cannot be reached", url, "building locally")


@pytest.mark.parametrize("status", [500, 503])
def test_a_server_error_is_one_warning_then_a_local_build(tmp_path, make_cache, status):
    server = make_cache(status=status)
    eng, _, outcomes = build_with(tmp_path, server.url, upload=True)
    assert outcomes == ["built"] * len(TASKS)
    assert_one_warning(eng, "server error", f"HTTP {status}")


@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_say_not_authorized(tmp_path, make_cache, status):
    server = make_cache(status=status)
    eng, _, outcomes = build_with(tmp_path, server.url)
    assert outcomes == ["built"] * len(TASKS)
    assert_one_warning(eng, "not authorized")
    assert "cannot be reached" not in eng.warnings[0]


@pytest.mark.parametrize("status", [507, 413])
def test_a_full_cache_turns_uploads_off_and_reads_go_on(tmp_path, make_cache, status):
    server = make_cache(put_status=status)
    eng, _, outcomes = build_with(tmp_path, server.url, upload=True)
    assert outcomes == ["built"] * len(TASKS)
    assert_one_warning(eng, "full", "uploads are off")
    puts = [r for r in server.requests() if r[0] == "PUT"]
    # The first refusal stops every later upload: only the first record's blobs, sent
    # together (`transfers`, default 4, at once), were asked; never an entry.
    assert 1 <= len(puts) <= 4 and all(p[1].startswith("/cas/") for p in puts), puts


def test_a_read_only_cache_refuses_uploads_with_not_authorized(tmp_path, make_cache):
    server = make_cache(auth="ci-token", auth_scope="write")
    eng, _, outcomes = build_with(tmp_path, server.url, upload=True)
    assert outcomes == ["built"] * len(TASKS)
    assert_one_warning(eng, "not authorized", "uploads are off")


def test_a_server_that_never_answers_costs_one_timeout(tmp_path):
    with SilentServer() as silent:
        start = time.monotonic()
        eng, fake, outcomes = build_with(tmp_path, silent.url)
        elapsed = time.monotonic() - start
        accepted = silent.accepted
    assert outcomes == ["built"] * len(TASKS) and len(fake.ran) == len(TASKS)
    assert_one_warning(eng, "did not answer in time", "3 s")
    assert accepted == 1  # switched off after the first timeout: no second wait
    assert elapsed < 30, f"a 3 s idle timeout took {elapsed:.0f} s in all"


def test_a_missing_shared_folder_is_one_warning(tmp_path):
    eng, _, outcomes = build_with(tmp_path, f"file://{tmp_path / 'no-such-mount'}", upload=True)
    assert outcomes == ["built"] * len(TASKS)
    assert_one_warning(eng, "cannot be reached")


TOKEN = "s3cr3t-T0ken-4-hefbuild"
PASSWORD = "pa55-w0rd-4-hefbuild"


def test_the_token_and_password_appear_nowhere(tmp_path, make_cache, monkeypatch):
    server = make_cache(auth=TOKEN, auth_scope="all")
    monkeypatch.setenv("HEFBUILD_REMOTE_TOKEN", TOKEN)
    ci, _, outcomes = build_with(tmp_path, server.url, upload=True, name="ci")
    assert outcomes == ["built"] * len(TASKS) and ci.warnings == []
    dev, fake, outcomes = build_with(tmp_path, server.url, name="dev")
    assert outcomes == ["remote"] * len(TASKS) and fake.ran == []
    monkeypatch.setenv("HEFBUILD_REMOTE_TOKEN", "wrong-" + TOKEN)
    refused, _, _ = build_with(tmp_path, server.url, name="refused")
    assert_one_warning(refused, "not authorized")
    monkeypatch.delenv("HEFBUILD_REMOTE_TOKEN")

    basic = make_cache(basic=("ci", PASSWORD))
    url = basic.url.replace("http://", f"http://ci:{PASSWORD}@")
    monkeypatch.setenv("HEFBUILD_REMOTE_CACHE", url)  # a CI secret; hefbuild.toml holds none
    eng, _, outcomes = build_with(tmp_path, basic.url, upload=True, name="basic")
    assert eng.warnings == [] and any(p[0] == "PUT" for p in basic.requests())
    monkeypatch.setenv("HEFBUILD_REMOTE_CACHE", url.replace(PASSWORD, PASSWORD + "x"))
    wrong, _, _ = build_with(tmp_path, basic.url, name="basic-wrong")
    assert_one_warning(wrong, "not authorized")
    assert PASSWORD not in wrong.warnings[0]

    # Everything hefbuild wrote (projects, build/, stores, events, logs) and what the servers
    # logged and stored; not the servers' own config, which holds the secret by design.
    servers = (server.root, basic.root)
    searched = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()
                and not any(p.is_relative_to(r) for r in servers)]
    for root in servers:
        searched += [p for sub in ("logs", "data") for p in (root / sub).rglob("*") if p.is_file()]
    assert any(p.name == "events.jsonl" for p in searched)
    assert any(p.name == "access.log" for p in searched)
    for path in searched:
        data = path.read_bytes()
        assert TOKEN.encode() not in data and PASSWORD.encode() not in data, path
    messages = ci.warnings + dev.warnings + refused.warnings + eng.warnings + wrong.warnings
    assert not any(TOKEN in m or PASSWORD in m for m in messages)
