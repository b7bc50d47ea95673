"""Results stored but not uploaded are never lost, and a corrupt local object is never sent.

A `kill -9` between storing a result and uploading it leaves the result queued in the
store; the next run with uploads on sends it (through the real doit, at the end of its run)
and `doit store` shows what is pending. A local object whose bytes no longer match its name
is refused at upload: the server never gets it, and the local store drops it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from e2e.test_toy_target import toy_project
from fakes.fake_executor import FakeExecutor

from hefbuild.remote.cache import RemoteCache

from .helpers import MODEL, TASKS, cache_toml, engine, make_project, run_all

REPO = Path(__file__).resolve().parents[2]
TOY_TASKS = ("make:toy-model", "check:toy-model")

# doit itself, with the process killed (SIGKILL: no finally, no atexit) right after the
# first result is stored and linked into build/, before its upload.
KILLED_DOIT = """
import os, signal, sys
import hefbuild.engine.share
hefbuild.engine.share.RemoteTier.upload = lambda self, record: os.kill(os.getpid(), signal.SIGKILL)
from doit.doit_cmd import DoitMain
sys.exit(DoitMain().run(sys.argv[1:]))
"""


@pytest.fixture(params=["http", "file"])
def remote(request: pytest.FixtureRequest, tmp_path: Path):  # noqa: ANN201
    """(url, data folder, server or None)."""
    if request.param == "file":
        (tmp_path / "shared").mkdir()
        return f"file://{tmp_path / 'shared'}", tmp_path / "shared", None
    server = request.getfixturevalue("make_cache")()
    return server.url, server.data, server


def doit(root: Path, store: Path, *args: str, script: str | None = None):  # noqa: ANN201
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEFBUILD_")}
    env["HEFBUILD_STORE"] = str(store)
    env.pop("PYTHONUNBUFFERED", None)  # as on a CI runner: a killed run's output is lost
    argv = [sys.executable, "-c", script, *args] if script else [sys.executable, "-m", "doit",
                                                                 *args]
    return subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=300, env=env)


def entries(data: Path) -> set[str]:
    return {p.name for p in (data / "ac").glob("*")} if (data / "ac").is_dir() else set()


def test_a_result_killed_before_its_upload_is_sent_by_the_next_run(tmp_path, remote):
    url, data, _ = remote
    root, store = toy_project(tmp_path / "proj"), tmp_path / "store"
    (root / "hefbuild.toml").write_text(cache_toml(url, upload=True))
    killed = doit(root, store, "check", script=KILLED_DOIT)
    assert killed.returncode == -9, killed.stderr
    make = json.loads((root / "build/toy-model/make/manifest.json").read_text())
    assert entries(data) == set()  # stored and in build/, never uploaded

    listed = doit(root, store, "store")
    assert listed.returncode == 0, listed.stderr
    assert f"pending uploads: 1 result to {url}" in listed.stdout

    again = doit(root, store, "check")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"uploaded 1 result of earlier runs to {url}" in again.stdout
    assert make["key"] in entries(data)  # the killed run's result, sent by this one
    assert len(entries(data)) == 2  # and check's, which this run built and uploaded
    assert "pending uploads" not in doit(root, store, "store").stdout

    reader = toy_project(tmp_path / "reader")
    (reader / "hefbuild.toml").write_text(cache_toml(url))
    read = doit(reader, tmp_path / "reader-store", "check")
    assert read.returncode == 0, read.stdout + read.stderr
    assert "0 built, 0 restored, 2 from remote" in read.stdout


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))


def test_a_corrupt_local_object_is_never_uploaded_and_leaves_the_store(tmp_path, remote):
    url, data, server = remote
    root = make_project(tmp_path / "ci" / "proj", cache_toml(url, upload=True))
    store = tmp_path / "ci" / "store"
    if server is not None:
        server.stop()  # the cache is down while CI builds: every result stays queued
    else:
        os.rename(data, data.with_name("away"))
    eng = engine(root, store, FakeExecutor())
    assert run_all(eng) == ["built"] * len(TASKS) and len(eng.warnings) == 1
    if server is not None:
        server.start()  # back, on the same port
    else:
        os.rename(data.with_name("away"), data)
    manifest = json.loads((root / "build" / MODEL / "export" / "manifest.json").read_text())
    digest = manifest["outputs"]["model.onnx"]["digest"]
    corrupt(store / "v1" / "objects" / digest[:2] / digest[2:])

    later = engine(root, store, FakeExecutor())
    assert later.flush_uploads() == len(TASKS) - 1  # every result but the corrupt one
    assert not (data / "cas" / digest).exists()
    assert manifest["key"] not in entries(data)
    if server is not None:
        puts = [p for m, p, status in server.requests() if m == "PUT" and digest in p]
        assert all(status >= 400 for m, p, status in server.requests()
                   if m == "PUT" and digest in p), puts  # begun, never completed
    assert len(later.warnings) == 1 and f"sha256:{digest}" in later.warnings[0]
    assert "corrupt" in later.warnings[0] and "not uploaded" in later.warnings[0]
    assert not (store / "v1" / "objects" / digest[:2] / digest[2:]).exists()
    assert later.store.get_record(manifest["key"]) is None
    assert later.flush_uploads() == 0  # nothing left queued


def test_the_upload_after_a_build_hashes_what_it_sends(tmp_path, remote):
    """The object changed between being stored and being sent (bit rot, a stray write): the
    upload notices while sending and the cache keeps nothing of it."""
    url, data, server = remote
    root = make_project(tmp_path / "ci" / "proj", cache_toml(url, upload=False))
    store = tmp_path / "ci" / "store"
    eng = engine(root, store, FakeExecutor())
    run_all(eng)
    manifest = json.loads((root / "build" / MODEL / "quantize" / "manifest.json").read_text())
    digest = manifest["outputs"]["model.int8.onnx"]["digest"]
    corrupt(store / "v1" / "objects" / digest[:2] / digest[2:])
    warnings: list[str] = []
    cache = replace(eng.project.settings.cache, upload=True)
    RemoteCache(cache, warnings.append).upload(eng.store.get_record(manifest["key"]), eng.store)
    assert not (data / "cas" / digest).exists() and manifest["key"] not in entries(data)
    assert len(warnings) == 1 and f"sha256:{digest}" in warnings[0]
    assert not (store / "v1" / "objects" / digest[:2] / digest[2:]).exists()
