"""Hub models: lock a branch to a commit + file digests, then a fixed-output fetch.

The hub is `tests/fakes/hub_server.py` on loopback; the client is the real
huggingface_hub, so the request paths and headers are the ones the real hub sees.
"""

from __future__ import annotations

import json

import pytest
from fakes.hub_server import FakeHub, FakeRepo

from .conftest import Project

pytestmark = pytest.mark.e2e

REPO_ID = "Mxode/TinyStories-LLaMA2-25M-256h-4l-GQA"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def fake_repo(project: Project) -> FakeRepo:
    """The repository's files are the tiny Llama's checkpoint (a real, loadable one)."""
    ckpt = project.root / "build/tiny-llama/fetch/checkpoint"
    files = {p.name: p.read_bytes() for p in sorted(ckpt.iterdir())}
    files["README.md"] = b"# not part of a checkpoint\n"
    return FakeRepo(REPO_ID, COMMIT, files, lfs={"model.safetensors"})


def hub_env(hub: FakeHub, project: Project) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(project.root / ".hf-home"),
            "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"}


def test_lock_then_fetch_pins_commit_and_checks_every_file(project: Project, fake_repo):
    with FakeHub(fake_repo) as hub:
        locked = project.doit("lock:tinystories", env=hub_env(hub, project))
        assert locked.returncode == 0, locked.stdout + locked.stderr
        lock = json.loads((project.root / "models/tinystories.lock.json").read_text())
        assert lock["revision"] == COMMIT and lock["requested_revision"] == "main"
        assert "README.md" not in lock["files"]
        assert set(lock["files"]) == set(fake_repo.files) - {"README.md"}

        fetched = project.doit("fetch:tinystories", env=hub_env(hub, project))
        assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert fetched.outcomes() == {"fetch:tinystories": "built"}
    out = project.root / "build/tinystories/fetch/checkpoint"
    assert (out / "model.safetensors").read_bytes() == fake_repo.files["model.safetensors"]
    desc = project.manifest("fetch:tinystories")["description"]
    assert desc["source"]["revision"] == COMMIT
    # every download named the commit, never the branch
    downloads = [r for r in fake_repo.requests if "/resolve/" in r]
    assert downloads and all(f"/resolve/{COMMIT}/" in r for r in downloads)


def test_fetch_refuses_a_file_whose_digest_changed(project: Project, fake_repo):
    # Another commit: the shared store must not already hold this fetch's result.
    fake_repo.commit = "fedcba9876543210fedcba9876543210fedcba98"
    with FakeHub(fake_repo) as hub:
        assert project.doit("lock:tinystories", env=hub_env(hub, project)).returncode == 0
        fake_repo.files["config.json"] = fake_repo.files["config.json"] + b" "
        # A machine whose hub cache is empty downloads the changed bytes.
        env = {**hub_env(hub, project), "HF_HOME": str(project.root / ".hf-home-2")}
        run = project.doit("fetch:tinystories", env=env)
    assert run.returncode == 1
    assert "sha256 mismatch for config.json" in run.stdout + run.stderr
    assert not (project.root / "build/tinystories/fetch").exists()


def test_a_stored_fetch_needs_no_network(project: Project, fake_repo):
    """Fixed-output: with the lock committed, a stored result restores with the hub gone."""
    with FakeHub(fake_repo) as hub:
        assert project.doit("lock:tinystories", env=hub_env(hub, project)).returncode == 0
        assert project.doit("fetch:tinystories", env=hub_env(hub, project)).returncode == 0
    import shutil

    shutil.rmtree(project.root / "build/tinystories")
    offline = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"}
    run = project.doit("fetch:tinystories", env=offline)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.outcomes() == {"fetch:tinystories": "restored"}


def test_no_token_in_key_manifest_or_log(project: Project, fake_repo):
    secret = "hf_SECRETtokenVALUE1234567890"
    with FakeHub(fake_repo) as hub:
        env = {**hub_env(hub, project), "HF_TOKEN": secret}
        assert project.doit("lock:tinystories", env=env).returncode == 0
        run = project.doit("fetch:tinystories", env=env)
    assert run.returncode == 0, run.stderr
    for path in (project.root / "build").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    for path in project.store.rglob("*"):
        if path.is_file() and path.stat().st_size < 10_000_000:
            assert secret.encode() not in path.read_bytes(), path


def test_a_cached_revision_locks_offline(project: Project, fake_repo):
    """With the revision in the Hugging Face cache (downloaded by its branch name, as
    `from_pretrained("org/name")` does), `doit lock` needs no hub: the same lock."""
    import os
    import subprocess
    import sys

    lock_file = project.root / "models/tinystories.lock.json"
    with FakeHub(fake_repo) as hub:
        assert project.doit("lock:tinystories", env=hub_env(hub, project)).returncode == 0
        online = json.loads(lock_file.read_text())
        fill = ("import sys\nfrom huggingface_hub import hf_hub_download\n"
                "for name in sys.argv[2:]:\n    hf_hub_download(sys.argv[1], name, "
                "revision='main')\n")
        filled = subprocess.run([sys.executable, "-c", fill, REPO_ID, *fake_repo.files],
                                env={**os.environ, **hub_env(hub, project)},
                                capture_output=True, text=True)
        assert filled.returncode == 0, filled.stderr
    lock_file.unlink()
    offline = {"HF_HOME": str(project.root / ".hf-home"), "HF_HUB_OFFLINE": "1",
               "HF_ENDPOINT": "http://127.0.0.1:9"}
    run = project.doit("lock:tinystories", env=offline)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(lock_file.read_text()) == online
    run = project.doit("fetch:tinystories", env=offline)  # and the cache serves the fetch
    assert run.returncode == 0, run.stdout + run.stderr


def test_an_uncached_revision_cannot_lock_offline(project: Project):
    offline = {"HF_HOME": str(project.root / ".hf-empty"), "HF_HUB_OFFLINE": "1",
               "HF_ENDPOINT": "http://127.0.0.1:9"}
    run = project.doit("lock:tinystories", env=offline)
    assert run.returncode != 0
    assert "locking needs network access (or that revision in the Hugging Face cache)" in \
        run.stdout + run.stderr
    assert not (project.root / "models/tinystories.lock.json").exists()
