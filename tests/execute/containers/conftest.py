"""Container tests against the real Docker engine that `.ci/docker-up` installs and starts.

The engine: found as the code finds it (`docker_endpoint`: DOCKER_HOST, else the current
docker context, which `.ci/docker-up` sets). No engine, SDK or base image means
a skip on a developer machine and a failure when CI=true: CI must never skip these silently.

The folder is not called `docker`: tests/conftest.py puts tests/ on sys.path, and a package
of that name would shadow the docker SDK.
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

BUSYBOX_IMAGE = "hefbuild-test/busybox:1"
PYTHON_IMAGE = "hefbuild-test/python3:bookworm"
# Every container and image the tests create carries this session's label or tag prefix.
SESSION = uuid.uuid4().hex[:12]
LABEL = "hefbuild-test-session"


def unavailable(reason: str) -> NoReturn:
    """Skip, or fail when CI=true."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: container tests must not be skipped; "
                    "run `eval \"$(.ci/docker-up)\"` first)", pytrace=False)
    pytest.skip(reason)


def docker_host() -> str | None:
    """The engine exactly as the code finds it (DOCKER_HOST, the current docker context that
    `.ci/docker-up` selects, or the SDK's default socket)."""
    from hefbuild.execute.docker import docker_endpoint

    return docker_endpoint()


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    try:
        import docker
    except ImportError:
        unavailable("the docker SDK is not installed (pip install docker==7.1.0)")
    if not hasattr(docker, "from_env"):  # a namespace package, not the SDK
        unavailable(f"`import docker` does not find the docker SDK: {docker!r}")
    environment = dict(os.environ)
    host = docker_host()
    if host:
        environment["DOCKER_HOST"] = host
    where = host or "the default socket"
    try:
        client = docker.from_env(environment=environment, timeout=30)
        client.ping()
    except Exception as exc:  # docker, requests and urllib3 errors alike
        unavailable(f"no Docker engine answers at {where}: {str(exc)[:200]}")
    yield client
    client.close()


def _image_id(client: Any, name: str) -> str:
    import docker.errors

    try:
        return client.images.get(name).id
    except docker.errors.ImageNotFound:
        unavailable(f"base image {name} is missing (.ci/docker-up builds it)")


@pytest.fixture(scope="session")
def busybox_image(docker_client: Any) -> str:
    return _image_id(docker_client, BUSYBOX_IMAGE)


@pytest.fixture(scope="session")
def python_image(docker_client: Any) -> str:
    return _image_id(docker_client, PYTHON_IMAGE)


def build_image(client: Any, context_dir: Path | str, tag: str) -> str:
    """Build a context with the legacy builder, no network, and return the image ID."""
    image, _log = client.images.build(path=str(context_dir), tag=tag, rm=True,
                                      network_mode="none")
    return image.id


@pytest.fixture
def built_images(docker_client: Any) -> Iterator[Callable[[Path, str], str]]:
    """`build(context_dir, name)`: build_image under a session-unique tag. Every image built
    (also those a later build moved the tag away from) is deleted at teardown."""
    built: list[str] = []

    def build(context_dir: Path, name: str) -> str:
        tag = f"hefbuild-test/{name}:{SESSION}"
        built.append(tag)
        image_id = build_image(docker_client, context_dir, tag)
        built.append(image_id)
        return image_id

    yield build
    for ref in dict.fromkeys(built):
        with contextlib.suppress(Exception):  # gone already with its tag
            docker_client.images.remove(ref)


@dataclass
class Ran:
    exit_code: int
    stdout: str
    stderr: str
    state: dict[str, Any]


def run_container(client: Any, image: str, command: list[str], *, timeout: float = 60,
                  **kwargs: Any) -> Ran:
    """Run to completion with no network (unless kwargs say otherwise); the container is
    removed whatever happens, after its state has been read."""
    kwargs.setdefault("network_mode", "none")
    labels = {**kwargs.pop("labels", {}), LABEL: SESSION}
    container = client.containers.create(image, command, labels=labels, **kwargs)
    try:
        container.start()
        status = container.wait(timeout=timeout)
        container.reload()
        return Ran(exit_code=status["StatusCode"],
                   stdout=container.logs(stdout=True, stderr=False).decode(),
                   stderr=container.logs(stdout=False, stderr=True).decode(),
                   state=container.attrs["State"])
    finally:
        container.remove(force=True)


@pytest.fixture(scope="session")
def session_label() -> str:
    """The `key=value` label of every container this session's `run` creates."""
    return f"{LABEL}={SESSION}"


@pytest.fixture(scope="session")
def run(docker_client: Any) -> Callable[..., Ran]:
    """`run(image, command, **create_kwargs) -> Ran`: run_container on the session's engine."""
    return functools.partial(run_container, docker_client)
