"""The remote tier through the engine: a CI machine builds and uploads, another reads.

Every test runs against both remotes hefbuild speaks: a real nginx WebDAV server on
127.0.0.1 (Bazel's HTTP cache protocol) and a shared folder (`file://`). Rules are the
FakeExecutor's, so what ran is exactly `fake.ran`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fakes.cache_server import NginxCache
from fakes.fake_executor import FakeExecutor

from hefbuild.remote.reapi import decode_action_result
from hefbuild.remote.signing import generate

from .helpers import MODEL, TASKS, cache_toml, engine, make_project, run_all


@dataclass
class Remote:
    url: str
    data: Path  # where the blobs and entries lie on disk
    server: NginxCache | None = None

    def blob(self, digest: str) -> Path:
        return self.data / "cas" / digest

    def entry(self, key: str) -> Path:
        return self.data / "ac" / key

    def puts(self) -> list[str]:
        if self.server is None:
            return []
        return [path for method, path, _ in self.server.requests() if method == "PUT"]


@pytest.fixture(params=["http", "file"])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Remote]:
    if request.param == "file":
        (tmp_path / "shared").mkdir()
        yield Remote(f"file://{tmp_path / 'shared'}", tmp_path / "shared")
        return
    make_cache = request.getfixturevalue("make_cache")
    server = make_cache()
    yield Remote(server.url, server.data, server)


@dataclass
class Machine:
    root: Path
    store: Path
    fake: FakeExecutor

    def engine(self):  # noqa: ANN201
        return engine(self.root, self.store, self.fake)


@pytest.fixture
def machine(tmp_path: Path) -> Callable[..., Machine]:
    count = iter(range(100))

    def make(settings: str) -> Machine:
        n = next(count)
        root = make_project(tmp_path / f"m{n}" / "proj", settings)
        return Machine(root, tmp_path / f"m{n}" / "store", FakeExecutor())

    return make


def build_on_ci(machine: Callable[..., Machine], remote: Remote, extra: str = "") -> Machine:
    ci = machine(cache_toml(remote.url, upload=True, extra=extra))
    assert run_all(ci.engine()) == ["built"] * len(TASKS)
    return ci


def test_fresh_machine_restores_everything_from_a_warm_remote(machine, remote):
    ci = build_on_ci(machine, remote)
    dev = machine(cache_toml(remote.url))
    eng = dev.engine()
    results = [eng.run(task) for task in TASKS]
    assert [r["outcome"] for r in results] == ["remote"] * len(TASKS)
    assert dev.fake.ran == []
    assert all(r["bytes"] > 0 for r in results)
    for task in TASKS:  # byte-identical to what CI built
        stage = task.split(":")[0]
        for path in (ci.root / "build" / MODEL / stage).rglob("*"):
            if path.is_file() and path.name != "manifest.json":
                twin = dev.root / "build" / MODEL / stage / path.relative_to(
                    ci.root / "build" / MODEL / stage)
                assert twin.read_bytes() == path.read_bytes()
    # Inserted into the local store: the next restore is local and reads nothing remote.
    os.system(f"rm -rf {dev.root / 'build'}")
    assert run_all(dev.engine()) == ["restored"] * len(TASKS)


def test_a_second_upload_of_the_same_results_sends_nothing(machine, remote):
    build_on_ci(machine, remote)
    again = machine(cache_toml(remote.url, upload=True))
    eng = again.engine()
    for task in TASKS:
        eng.run(task, force=True)  # built again on another CI runner, same bytes
    assert len(again.fake.ran) == len(TASKS)
    assert eng.remote.sent == 0


def test_upload_false_sends_nothing(machine, remote):
    dev = machine(cache_toml(remote.url, upload=False))
    assert run_all(dev.engine()) == ["built"] * len(TASKS)
    assert not any((remote.data / "ac").glob("*")) if (remote.data / "ac").exists() else True
    assert remote.puts() == []


def test_an_evicted_blob_is_a_miss_then_rebuilt_and_uploaded_again(machine, remote):
    ci = build_on_ci(machine, remote)
    manifest = (ci.root / "build" / MODEL / "compile" / "manifest.json").read_text()
    digest = json.loads(manifest)["outputs"]["model.opt.onnx"]["digest"]
    remote.blob(digest).unlink()  # the server evicted it; the AC entry stays
    reader = machine(cache_toml(remote.url, upload=True))
    outcomes = run_all(reader.engine())
    assert outcomes == ["remote", "remote", "remote", "built", "remote"]
    assert reader.fake.ran == [f"compile:{MODEL}"]
    assert remote.blob(digest).is_file()  # put back by the rebuild's upload
    assert hashlib.sha256(remote.blob(digest).read_bytes()).hexdigest() == digest


def test_flipped_bytes_in_a_blob_are_a_miss_with_one_warning_and_never_in_build(
        machine, remote):
    ci = build_on_ci(machine, remote)
    manifest = json.loads((ci.root / "build" / MODEL / "export" / "manifest.json").read_text())
    digest = manifest["outputs"]["model.onnx"]["digest"]
    blob = remote.blob(digest)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    os.chmod(blob, 0o644)
    blob.write_bytes(bytes(data))
    dev = machine(cache_toml(remote.url))
    eng = dev.engine()
    outcomes = run_all(eng)
    assert outcomes[1] == "built" and dev.fake.ran == [f"export:{MODEL}"]
    wrong = [w for w in eng.warnings if "wrong bytes" in w]
    assert len(wrong) == 1 and digest in wrong[0] and remote.url in wrong[0]
    built = dev.root / "build" / MODEL / "export" / "model.onnx"
    assert hashlib.sha256(built.read_bytes()).hexdigest() == digest
    assert not any(hashlib.sha256(p.read_bytes()).digest() == hashlib.sha256(data).digest()
                   for p in dev.store.rglob("*") if p.is_file())


def test_entries_are_reapi_action_results_naming_outputs_log_and_record(machine, remote):
    ci = build_on_ci(machine, remote)
    manifest = json.loads((ci.root / "build" / MODEL / "quantize" / "manifest.json").read_text())
    entry = decode_action_result(remote.entry(manifest["key"]).read_bytes())
    paths = {o.path: o.blob.hash for o in entry.output_files}
    assert paths.pop(".hefbuild/record.json")
    assert paths == {rel: o["digest"] for rel, o in manifest["outputs"].items()}
    assert entry.stdout is not None and remote.blob(entry.stdout.hash).is_file()
    assert entry.execution_start is not None and entry.execution_completed is not None
    assert entry.execution_completed >= entry.execution_start
    assert entry.worker


class EvilExecutor(FakeExecutor):
    """A writer of the cache whose outputs are not what the rules make (a poisoned runner)."""

    def _write_outputs(self, action):  # noqa: ANN001, ANN202
        super()._write_outputs(action)
        for path in Path(action["out"]).rglob("*"):
            if path.is_file():
                path.write_bytes(path.read_bytes() + b" EVIL")


def test_signed_entries_pass_and_entries_put_without_the_key_are_rejected(
        machine, remote, tmp_path):
    public = generate("ci-1", tmp_path / "ci.secret")
    build_on_ci(machine, remote, extra=f'signing_key = "{tmp_path / "ci.secret"}"\n')
    trusting = f'trusted_keys = ["{public}"]\n'
    dev = machine(cache_toml(remote.url, extra=trusting))
    assert run_all(dev.engine()) == ["remote"] * len(TASKS)

    # Anyone who can PUT (nginx takes any PUT) maps every key to other bytes, unsigned.
    intruder = machine(cache_toml(remote.url, upload=True))
    intruder.fake = EvilExecutor()
    poisoner = intruder.engine()
    for task in TASKS:
        poisoner.run(task, force=True)
    assert poisoner.remote.sent > 0

    # fetch's key now maps to poison; the intruder's later stages have other keys (their
    # inputs differ), so CI's signed entries for the real keys are still there.
    reader = machine(cache_toml(remote.url, extra=trusting))
    eng = reader.engine()
    assert run_all(eng) == ["built"] + ["remote"] * (len(TASKS) - 1)
    assert reader.fake.ran == [f"fetch:{MODEL}"]
    assert sum("unsigned" in w for w in eng.warnings) == 1
    for path in (reader.root / "build").rglob("*"):
        assert not (path.is_file() and path.read_bytes().endswith(b" EVIL"))

    # The negative control: a reader that trusts no key takes the poison. Signing is what
    # stands between a writable cache and a wrong HEF.
    naive = machine(cache_toml(remote.url))
    naive_engine = naive.engine()
    assert naive_engine.run(TASKS[0])["outcome"] == "remote"
    fetched = next((naive.root / "build" / MODEL / "fetch").rglob("weights.bin"))
    assert fetched.read_bytes().endswith(b" EVIL")


def test_a_forged_signature_is_rejected(machine, remote, tmp_path):
    real = generate("ci", tmp_path / "real.secret")
    generate("ci", tmp_path / "forged.secret")
    build_on_ci(machine, remote, extra=f'signing_key = "{tmp_path / "forged.secret"}"\n')
    reader = machine(cache_toml(remote.url, extra=f'trusted_keys = ["{real}"]\n'))
    eng = reader.engine()
    assert run_all(eng) == ["built"] * len(TASKS)
    assert any("not by a trusted key" in w for w in eng.warnings)


def test_an_entry_for_another_key_is_not_used(machine, remote):
    ci = build_on_ci(machine, remote)
    keys = [json.loads((ci.root / "build" / MODEL / s / "manifest.json").read_text())["key"]
            for s in ("export", "quantize")]
    os.replace(remote.entry(keys[0]), remote.entry(keys[1]))  # quantize's key -> export's
    dev = machine(cache_toml(remote.url))
    eng = dev.engine()
    outcomes = run_all(eng)
    assert outcomes[1:3] == ["built", "built"]
    assert any("another key" in w for w in eng.warnings)
