"""A real stage of the tiny cpu-ort pipeline (export) in a container, byte for byte as on host.

The image: the test root filesystem (hefbuild-test/python3:bookworm, Debian's Python 3.11, no
pip) plus the exact versions of the CPU stack that the Python running these tests has, installed
on the host with `pip install --no-deps --target` (pip takes them from the local wheel folder or
PyPI; the image build itself has no network) and copied into /usr/local/lib/python3.11/
dist-packages. That stack layer is cached between sessions on this machine: the site folder
under /var/cache/hefbuild-test-wheels/<key> and the image as hefbuild-test/cpu-stack:<key>, the
key covering the package versions, the Python ABI, the machine and the base image.

The project: a copy of this one whose toolchain/export-test.toml (kind docker, the host
toolchain's env) builds FROM that stack image, pinned through `hefbuild.execute.images.build_image`;
`[stages.export] toolchain = "export-test"` for tiny-llama. fetch runs on host, export in the
container; a second copy runs export on host; the outputs must be byte-identical.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.conftest import Project, copy_project

from execute.containers.conftest import (
    PYTHON_IMAGE,
    SESSION,
    build_image,
    docker_host,
    run_container,
    unavailable,
)

REPO = Path(__file__).resolve().parents[3]
MODEL = "tiny-llama"
FETCH, EXPORT = f"fetch:{MODEL}", f"export:{MODEL}"
TOOLCHAIN = "export-test"
OUTPUTS = ("model.onnx", "export_report.json")
# What rules/fetch.py and rules/cpu_ort/export.py (with common/) import; their runtime
# dependencies are found from the installed metadata.
ROOTS = ("torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "onnx",
         "onnxruntime", "onnxscript", "numpy")
CACHE = Path(os.environ.get("HEFBUILD_TEST_WHEEL_CACHE", "/var/cache/hefbuild-test-wheels"))
SITE = "/usr/local/lib/python3.11/dist-packages"  # on Debian's sys.path, empty in the base
# A .pth line runs at every interpreter start in the image: the stage log then names the
# Python that ran the rule (stderr only; the outputs do not see it).
BANNER = ("import sys; sys.stderr.write('hefbuild-test image python %s at %s\\n' "
          "% (sys.version.split()[0], sys.executable))\n")


def stack_pins() -> dict[str, str]:
    """name -> version of ROOTS and their runtime dependencies, as installed here."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    todo = list(ROOTS)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in pins:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            unavailable(f"{name} is not installed here: the host half of the comparison "
                        "needs the CPU stack (pip install -e '.[test]')")
        pins[name] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return dict(sorted(pins.items()))


def stack_key(pins: dict[str, str], base_image: str) -> str:
    ident = {"pins": pins, "abi": f"cp{sys.version_info[0]}{sys.version_info[1]}",
             "machine": platform.machine(), "base": base_image}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def stack_context(pins: dict[str, str], key: str) -> Path:
    """CACHE/<key>: Dockerfile + site/ holding the pinned packages (made once per machine)."""
    final = CACHE / key
    if (final / ".complete").is_file():
        return final
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = CACHE / f"{key}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary=:all:",
         "--disable-pip-version-check", "--no-warn-script-location", "--quiet",
         "--target", str(partial / "site"), *(f"{n}=={v}" for n, v in pins.items())],
        capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        pytest.fail(f"pip install --target of the CPU stack failed:\n{done.stderr[-3000:]}")
    shutil.rmtree(partial / "site" / "bin", ignore_errors=True)  # host-shebang scripts
    (partial / "Dockerfile").write_text(f"FROM {PYTHON_IMAGE}\nCOPY site {SITE}\n")
    (partial / "pins.json").write_text(json.dumps(pins, indent=1) + "\n")
    (partial / ".complete").touch()
    try:
        partial.rename(final)
    except OSError:  # another session finished first: theirs is as good
        shutil.rmtree(partial, ignore_errors=True)
    return final


@pytest.fixture(scope="module")
def stack_image(docker_client: Any, python_image: str) -> dict[str, Any]:
    """The cached stack image's tag, plus how long getting it took and what it cost."""
    import docker.errors

    start = time.monotonic()
    pins = stack_pins()
    key = stack_key(pins, python_image)
    tag = f"hefbuild-test/cpu-stack:{key}"
    made = "warm"
    try:
        docker_client.images.get(tag)
    except docker.errors.ImageNotFound:
        made = "image built from a cached context" if (CACHE / key).is_dir() else "cold"
        build_image(docker_client, stack_context(pins, key), tag)
    return {"tag": tag, "pins": pins, "made": made, "seconds": time.monotonic() - start}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def engine_run(project: Project, task: str) -> str:
    from hefbuild.declare.project import load_project
    from hefbuild.engine.engine import Engine

    return Engine(load_project(project.root, store=project.store)).run(task)["outcome"]


# About 30 s, once per file: the tiny checkpoint is trained, then exported twice, in the
# container and on the host, which is the comparison the file is about.
@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, docker_client: Any,
         stack_image: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """export:tiny-llama built in the container (one copy) and on host (another copy)."""
    from hefbuild.declare.project import load_project
    from hefbuild.declare.toolchains import load_toolchain
    from hefbuild.execute.images import build_image as pin_image

    base = tmp_path_factory.mktemp("export-in-container")
    store = base / "store"
    tag = f"hefbuild-test/{TOOLCHAIN}:{SESSION}"
    try:
        with pytest.MonkeyPatch.context() as env_patch:
            env_patch.setenv("HEFBUILD_BUILD_NETWORK", "none")
            if docker_host():  # the engine's own connect() reads DOCKER_HOST
                env_patch.setenv("DOCKER_HOST", docker_host())
            boxed = copy_project(base / "in-container", store)
            context = boxed.root / "images" / TOOLCHAIN
            context.mkdir()
            (context / "Dockerfile").write_text(
                f"FROM {stack_image['tag']}\nCOPY hefbuild-banner.pth {SITE}/\n")
            (context / "hefbuild-banner.pth").write_text(BANNER)
            env = load_toolchain(REPO / "toolchain" / "host.toml", REPO).env
            (boxed.root / "toolchain" / f"{TOOLCHAIN}.toml").write_text(
                f'[toolchain]\nkind = "docker"\ncontext = "images/{TOOLCHAIN}"\ntag = "{tag}"\n'
                'interpreter = "python3"\n\n[env]\n'
                + "".join(f"{k} = {json.dumps(v)}\n" for k, v in env.items()))
            model_toml = boxed.root / "models" / f"{MODEL}.toml"
            model_toml.write_text(model_toml.read_text()
                                  + f'\n[stages.export]\ntoolchain = "{TOOLCHAIN}"\n')
            start = time.monotonic()
            image_id = pin_image(load_project(boxed.root, store=store), TOOLCHAIN)["image_id"]
            pin_seconds = time.monotonic() - start

            hosted = copy_project(base / "on-host", store)
            outcomes = {"container fetch": engine_run(boxed, FETCH)}
            since = int(time.time()) - 1
            start = time.monotonic()
            outcomes["container export"] = engine_run(boxed, EXPORT)
            container_seconds = time.monotonic() - start
            events = list(docker_client.events(
                since=since, until=int(time.time()) + 1, decode=True,
                filters={"type": "container", "label": f"hefbuild.task={EXPORT}"}))
            outcomes["host fetch"] = engine_run(hosted, FETCH)
            start = time.monotonic()
            outcomes["host export"] = engine_run(hosted, EXPORT)
            host_seconds = time.monotonic() - start
        yield {"boxed": boxed, "hosted": hosted, "image_id": image_id, "outcomes": outcomes,
               "events": events, "seconds": {"stack": round(stack_image["seconds"], 1),
                                             "pin": round(pin_seconds, 1),
                                             "container export": round(container_seconds, 1),
                                             "host export": round(host_seconds, 1)}}
    finally:
        with contextlib.suppress(Exception):  # the stack image stays: it is the cache
            docker_client.images.remove(tag, force=True)


def outputs(project: Project) -> dict[str, str]:
    stage = project.root / "build" / MODEL / "export"
    return {name: sha256(stage / name) for name in OUTPUTS}


def test_export_in_container_is_byte_identical_to_host(runs: dict[str, Any],
                                                       stack_image: dict[str, Any]) -> None:
    print(f"\nstack image {stack_image['tag']} ({stack_image['made']}), "
          f"seconds {runs['seconds']}")
    assert runs["outcomes"] == {"container fetch": "built", "container export": "built",
                                "host fetch": "restored", "host export": "built"}
    boxed, hosted = outputs(runs["boxed"]), outputs(runs["hosted"])
    print(f"container {boxed}\nhost      {hosted}")
    assert boxed == hosted
    for project in (runs["boxed"], runs["hosted"]):  # and both are what the store recorded
        manifest = project.manifest(EXPORT)["outputs"]
        assert {n: manifest[n]["digest"] for n in OUTPUTS} == outputs(project)
    report = json.loads((runs["boxed"].root / "build" / MODEL / "export"
                         / "export_report.json").read_text())
    assert report["passed"] is True
    assert report["onnx_sha256"] == boxed["model.onnx"]


def test_the_container_export_really_ran_in_the_pinned_image(runs: dict[str, Any]) -> None:
    boxed, hosted = runs["boxed"], runs["hosted"]
    identity = boxed.manifest(EXPORT)["description"]["toolchain"]
    assert identity == {"kind": "docker", "image_id": runs["image_id"], "interpreter": "python3"}
    lock = json.loads((boxed.root / "toolchain" / f"{TOOLCHAIN}.lock.json").read_text())
    assert lock["image_id"] == runs["image_id"]
    assert hosted.manifest(EXPORT)["description"]["toolchain"]["kind"] == "host"
    assert boxed.manifest(FETCH)["description"]["toolchain"]["kind"] == "host"
    # The keys differ only because the toolchain does: same inputs, parameters and rule.
    box_desc = boxed.manifest(EXPORT)["description"]
    host_desc = hosted.manifest(EXPORT)["description"]
    assert boxed.manifest(EXPORT)["key"] != hosted.manifest(EXPORT)["key"]
    assert {k: v for k, v in box_desc.items() if k != "toolchain"} == \
        {k: v for k, v in host_desc.items() if k != "toolchain"}
    # The engine saw one container of the task, from the pinned image, exit 0.
    died = [e for e in runs["events"] if e.get("Action") == "die"]
    assert len(died) == 1, runs["events"]
    assert died[0]["Actor"]["Attributes"]["exitCode"] == "0"
    image = died[0]["Actor"]["Attributes"]["image"]
    assert image == runs["image_id"] or runs["image_id"].startswith(f"sha256:{image}"), image
    # The rule's Python was the image's (Debian's /usr/bin/python3), not the host's.
    log = (boxed.root / "build" / MODEL / "export" / "log.txt").read_text()
    assert "hefbuild-test image python 3.11" in log and "at /usr/bin/python3" in log, log
    assert "exporting tiny-llama at opset 17" in log
    host_log = (hosted.root / "build" / MODEL / "export" / "log.txt").read_text()
    assert "hefbuild-test image python" not in host_log


def test_stack_image_holds_the_host_versions_and_no_pip(docker_client: Any,
                                                        stack_image: dict[str, Any]) -> None:
    names = json.dumps(sorted(stack_image["pins"]))
    probe = ("import importlib.metadata as m, importlib.util as u, json; print(json.dumps("
             "{'versions': {n: m.version(n) for n in " + names + "}, "
             "'pip': u.find_spec('pip') is not None}))")
    ran = run_container(docker_client, stack_image["tag"], ["python3", "-c", probe],
                        read_only=True)
    assert ran.exit_code == 0, ran.stderr
    seen = json.loads(ran.stdout)
    assert seen["versions"] == stack_image["pins"]
    assert seen["pip"] is False  # the packages came in as files, not by a pip in the image
