"""Stages in containers, through the engine, on the real Docker engine."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest

from hefbuild.declare.project import load_project
from hefbuild.engine.engine import Engine
from hefbuild.errors import HefbuildError, RuleFailed, StageError
from hefbuild.execute.images import build_image
from hefbuild.store.events import Outcome

REPO = Path(__file__).resolve().parents[3]
MODEL = "tiny-llama"
FETCH, EXPORT = f"fetch:{MODEL}", f"export:{MODEL}"

TOOLCHAIN = """\
[toolchain]
kind = "docker"
context = "images/box"
tag = "hefbuild-test/box:{tag}"
interpreter = "python3"

[env]
PROBE_VAR = "declared"
"""

# A stdlib-only rule: records what the container lets it see and do, then writes outputs.
PROBE = r'''
import json, os, pathlib, sys
action = json.loads(pathlib.Path(sys.argv[1]).read_text())
out = pathlib.Path(action["out"])

def can_write(path):
    try:
        pathlib.Path(path).write_text("x")
        return True
    except OSError as exc:
        return exc.strerror

seen = {
    "interfaces": sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]),
    "env": {k: os.environ.get(k) for k in ("PROBE_VAR", "CUDA_VISIBLE_DEVICES", "HOST_ONLY")},
    "uid": os.getuid(),
    "write_root": can_write("/probe.txt"),
    "write_inputs": [can_write(pathlib.Path(p) / "probe.txt") for p in action["inputs"].values()],
    "write_files": [can_write(p) for p in action["files"].values()],
    "marker": pathlib.Path("/marker.txt").read_text().strip(),
}
print("probe done", flush=True)
for decl in action["outputs"]:
    path = out / decl.rstrip("/")
    if decl.endswith("/"):
        path.mkdir(parents=True)
        path = path / "seen.json"
    path.write_text(json.dumps(seen, sort_keys=True))
'''


@pytest.fixture
def box(tmp_path: Path, docker_client, python_image, monkeypatch) -> Path:
    """A project whose every stage runs in a small image built from the test python rootfs."""
    monkeypatch.setenv("HEFBUILD_BUILD_NETWORK", "none")
    monkeypatch.setenv("HOST_ONLY", "must-not-leak")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    root = tmp_path / "proj"
    (root / "models").mkdir(parents=True)
    model = (REPO / "models" / f"{MODEL}.toml").read_text()
    (root / "models" / f"{MODEL}.toml").write_text(
        model.replace('target = "cpu-ort"', 'target = "cpu-ort"\ntoolchain = "box"'))
    (root / "toolchain").mkdir()
    (root / "toolchain" / "host.toml").write_text('[toolchain]\nkind = "host"\n')
    (root / "toolchain" / "box.toml").write_text(TOOLCHAIN.format(tag=tmp_path.name.lower()))
    context = root / "images" / "box"
    context.mkdir(parents=True)
    # The label gives each test its own image ID: with equal layers, one test's forced removal
    # collided with another worker's running container of the very same image.
    (context / "Dockerfile").write_text("FROM hefbuild-test/python3:bookworm\n"
                                        f"LABEL hefbuild.test={tmp_path.name.lower()}\n"
                                        "COPY marker.txt /marker.txt\n")
    (context / "marker.txt").write_text("one\n")
    shutil.copytree(REPO / "data", root / "data")
    for rule in ("fetch.py", "cpu_ort/export.py", "cpu_ort/quantize.py", "cpu_ort/compile.py",
                 "cpu_ort/verify.py"):
        (root / "rules" / rule).parent.mkdir(parents=True, exist_ok=True)
        (root / "rules" / rule).write_text(PROBE)
    yield root
    with contextlib.suppress(Exception):  # already gone
        docker_client.images.remove(f"hefbuild-test/box:{tmp_path.name.lower()}", force=True)


def engine(root: Path, **kw) -> Engine:
    return Engine(load_project(root, store=root.parent / "store"), **kw)


def pin(root: Path) -> str:
    return build_image(load_project(root, store=root.parent / "store"), "box")["image_id"]


def seen(root: Path, stage: str, rel: str) -> dict:
    return json.loads((root / "build" / MODEL / stage / rel).read_text())


def test_container_sees_only_what_it_should(box: Path, docker_client):
    pin(box)
    e = engine(box)
    assert e.run(FETCH)["outcome"] == "built"
    assert e.run(EXPORT)["outcome"] == "built"
    probe = seen(box, "export", "model.onnx")
    assert probe["interfaces"] == ["lo"]  # network really off
    assert probe["env"] == {"PROBE_VAR": "declared", "CUDA_VISIBLE_DEVICES": "0",
                            "HOST_ONLY": None}
    assert probe["uid"] == os.getuid()
    assert probe["write_root"] == "Read-only file system"
    assert probe["write_inputs"] == ["Read-only file system"]  # the upstream stage
    fetch_probe = seen(box, "fetch", "checkpoint/seen.json")
    assert fetch_probe["write_files"] == ["Read-only file system"]  # the corpus file
    assert probe["marker"] == "one"
    out = box / "build" / MODEL / "export" / "model.onnx"
    assert out.stat().st_uid == os.getuid()
    assert "probe done" in (out.parent / "log.txt").read_text()
    left = docker_client.containers.list(all=True, filters={"label": "hefbuild.task"})
    assert left == []  # every container removed


def test_image_id_is_in_the_key(box: Path):
    first = pin(box)
    assert engine(box).run(FETCH)["outcome"] == "built"
    assert pin(box) == first  # an identical rebuild: same ID, nothing to re-run
    assert engine(box).decide(engine(box).actions[FETCH]).outcome is Outcome.UPTODATE
    (box / "images/box/marker.txt").write_text("two\n")
    assert pin(box) != first
    e = engine(box)
    assert e.decide(e.actions[FETCH]).outcome is Outcome.BUILT
    assert e.run(FETCH)["outcome"] == "built"
    assert seen(box, "fetch", "checkpoint/seen.json")["marker"] == "two"
    lock = json.loads((box / "toolchain/box.lock.json").read_text())
    assert e.key_of(e.actions[FETCH]).description["toolchain"]["image_id"] == lock["image_id"]


def test_memory_hog_is_killed_at_its_cap(box: Path):
    pin(box)
    (box / "rules/fetch.py").write_text("blob = bytearray(400 * 2**20)\n"
                                        "for i in range(0, len(blob), 4096):\n    blob[i] = 1\n")
    toml = box / f"models/{MODEL}.toml"
    toml.write_text(toml.read_text() + '\n[stages.fetch]\nmemory = "96m"\n')
    with pytest.raises(RuleFailed) as err:
        engine(box).run(FETCH)
    assert "killed at its memory cap of 96 MiB" in str(err.value)
    assert not (box / "build" / MODEL / "fetch").exists()


def test_sleeping_stage_is_killed_at_its_timeout_with_heartbeats(box: Path, monkeypatch):
    pin(box)
    monkeypatch.setenv("HEFBUILD_HEARTBEAT_S", "0.5")
    monkeypatch.setenv("HEFBUILD_SILENCE_S", "1")
    (box / "rules/fetch.py").write_text("import time\nprint('waiting', flush=True)\n"
                                        "time.sleep(60)\n")
    toml = box / f"models/{MODEL}.toml"
    toml.write_text(toml.read_text() + '\n[stages.fetch]\ntimeout = "4s"\n')
    said: list[str] = []
    with pytest.raises(RuleFailed) as err:
        engine(box, progress=said.append).run(FETCH)
    assert f"{FETCH}: killed at its timeout of 4 s" in str(err.value)
    assert any("no output for" in line and line.endswith(": waiting") for line in said), said


def test_missing_image_says_how_to_get_it(box: Path, docker_client):
    image_id = pin(box)
    e = engine(box)
    docker_client.images.remove(image_id, force=True)
    with pytest.raises(StageError) as err:
        e.run(FETCH)
    assert "is not in the local Docker engine; build it with `doit image:" in str(err.value)


def test_unpinned_toolchain_says_how_to_pin_it(box: Path):
    with pytest.raises(StageError) as err:
        engine(box).run(FETCH)
    assert "toolchain/box.toml: no pinned image" in str(err.value)
    assert "`doit image:box`" in str(err.value)


def test_missing_or_wrong_wheel_is_refused_before_building(box: Path):
    sha = "ab" * 32
    tc = box / "toolchain/box.toml"
    source = "Hailo's Developer Zone (hailo.ai, an account is needed)"
    head = f'[toolchain]\nwheels_source = "{source}"\n'
    tc.write_text(tc.read_text().replace("[toolchain]\n", head)
                  + f'\n[wheels]\n"dfc-5.3.0.whl" = "{sha}"\n')
    with pytest.raises(HefbuildError) as err:
        pin(box)
    assert "wheels.dfc-5.3.0.whl: images/box/dfc-5.3.0.whl is missing" in str(err.value)
    assert f"download it from {source} and put it there" in str(err.value)
    assert sha in str(err.value)
    (box / "images/box/dfc-5.3.0.whl").write_bytes(b"not the wheel")
    with pytest.raises(HefbuildError) as err:
        pin(box)
    assert f"expected {sha}" in str(err.value)
    assert not (box / "toolchain/box.lock.json").exists()
