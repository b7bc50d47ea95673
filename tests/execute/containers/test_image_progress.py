"""`doit image:<toolchain>` shows the build as it happens, and a failing step in one line."""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path

import docker.errors
import pytest

from hefbuild.declare.project import load_project
from hefbuild.errors import HefbuildError
from hefbuild.execute.images import BuildOutput, build_image

from .conftest import BUSYBOX_IMAGE, LABEL, SESSION

TOOLCHAIN = """\
[toolchain]
kind = "docker"
context = "images/box"
tag = "{tag}"
interpreter = "sh"
"""


@pytest.fixture
def project(tmp_path: Path, docker_client, busybox_image, monkeypatch):
    """A project with one docker toolchain, `box`, whose Dockerfile the test writes."""
    monkeypatch.setenv("HEFBUILD_BUILD_NETWORK", "none")
    tag = f"hefbuild-test/progress:{SESSION}-{tmp_path.name.lower()}"
    root = tmp_path / "proj"
    (root / "toolchain").mkdir(parents=True)
    (root / "models").mkdir()
    (root / "toolchain/host.toml").write_text('[toolchain]\nkind = "host"\n')
    (root / "toolchain/box.toml").write_text(TOOLCHAIN.format(tag=tag))
    (root / "images/box").mkdir(parents=True)
    yield root
    with contextlib.suppress(Exception):  # never built
        docker_client.images.remove(tag, force=True)
    remove_built(docker_client, marker_of(root))


def marker_of(root: Path) -> str:
    return f"marker-{SESSION}-{root.parent.name}"


def dockerfile(root: Path, *steps: str) -> str:
    """Write the Dockerfile; a test-unique marker keeps its RUN steps out of the cache, and
    labels every image it makes (intermediate ones too) for remove_built."""
    marker = marker_of(root)
    lines = [f"FROM {BUSYBOX_IMAGE}", f"LABEL {LABEL}={marker}", *steps]
    (root / "images/box/Dockerfile").write_text("\n".join(lines).format(marker=marker) + "\n")
    return marker


def remove_built(client, marker: str) -> None:
    """Every image of the marker: untagged by a later build, or left by a failed one."""
    for _ in range(5):  # a parent goes once its children have
        images = client.images.list(all=True, filters={"label": f"{LABEL}={marker}"})
        if not images:
            return
        for image in sorted(images, key=lambda i: i.attrs["Created"], reverse=True):
            with contextlib.suppress(Exception):  # a child still there, or gone already
                client.images.remove(image.id, force=True)


def load(root: Path):
    return load_project(root, store=root.parent / "store")


def test_build_lines_reach_the_terminal_as_they_come(project: Path, capfd):
    marker = dockerfile(project, "RUN echo {marker}-one && sleep 2", "RUN echo {marker}-two")
    build_image(load(project), "box")  # the default: the terminal
    lines = capfd.readouterr().err.splitlines()
    assert all(line.startswith("[image:box] ") for line in lines), lines
    image_id = json.loads((project / "toolchain/box.lock.json").read_text())["image_id"]
    assert lines[-1] == f"[image:box] pinned {image_id} in toolchain/box.lock.json"
    order = [next(i for i, ln in enumerate(lines) if ln.endswith(text))
             for text in (f"Step 1/4 : FROM {BUSYBOX_IMAGE}", f"{marker}-one",
                          f"{marker}-two", f"pinned {image_id} in toolchain/box.lock.json")]
    assert order == sorted(order), lines

    heard: list[tuple[float, str]] = []  # and as they come, not at the end: a changed step
    marker = dockerfile(project, "RUN echo {marker}-three && sleep 2", "RUN echo {marker}-four")
    build_image(load(project), "box", progress=lambda ln: heard.append((time.monotonic(), ln)))
    done = time.monotonic()
    first = next(t for t, ln in heard if ln.endswith(f"{marker}-three"))
    assert done - first > 1.5, heard  # told while the `sleep 2` still ran


def test_failing_step_is_one_line_naming_it(project: Path, docker_client):
    dockerfile(project, "RUN echo {marker}", "RUN false")
    heard: list[str] = []
    with pytest.raises(HefbuildError) as err:
        build_image(load(project), "box", progress=heard.append)
    message = str(err.value)
    assert "\n" not in message
    assert message == ("image:box: docker build of images/box failed at Step 4/4 : RUN false: "
                       "The command '/bin/sh -c false' returned a non-zero code: 1")
    assert not (project / "toolchain/box.lock.json").exists()
    assert "[image:box] Step 4/4 : RUN false" in heard
    last = heard[heard.index("[image:box] Step 4/4 : RUN false"):]
    running = [m.group(1) for ln in last if (m := re.search(r"Running in ([0-9a-f]+)$", ln))]
    assert running, heard  # the failed step's container, told as the build went...
    with pytest.raises(docker.errors.NotFound):  # ...and removed after it failed
        docker_client.containers.get(running[0])


def test_build_output_joins_chunks_into_lines():
    said: list[str] = []
    out = BuildOutput(said.append)
    out.follow([{"stream": "Step 1/2 : FROM x"}, {"stream": "\n"}, {"stream": " ---> ab\n"},
                {"status": "Pulling fs layer", "id": "c0ffee"},
                {"status": "Downloading", "id": "c0ffee", "progress": "[=>  ] 1MB/9MB"},
                {"stream": "Step 2/2 : RUN make\n"}, {"stream": "half a line, "},
                {"stream": "then the rest\n\nlast"},
                {"aux": {"ID": "sha256:" + "e" * 64}}])
    assert said == ["Step 1/2 : FROM x", " ---> ab", "c0ffee: Pulling fs layer",
                    "Step 2/2 : RUN make", "half a line, then the rest", "last"]
    assert (out.image_id, out.error, out.where()) == ("sha256:" + "e" * 64, None,
                                                      " at Step 2/2 : RUN make")
    silent = BuildOutput(said.append)
    silent.follow([{"errorDetail": {"message": "no space left\nmore"}, "error": "x"}])
    assert (silent.error, silent.where()) == ("no space left", "")
