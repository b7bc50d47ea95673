"""How the suite spreads over pytest-xdist workers (`pytest -n auto --dist loadgroup`).

Every test belongs to a group, and a group runs on one worker:
- a test file is a group, so its module- and class-scoped fixtures are built once;
- the packages in SHARED_PACKAGES are one group each: their tests share one expensive
  session- or package-scoped fixture (a Ray cluster in its own network namespace, the
  loopback sshd of the device host, the normal user's pip cache, the Docker session whose
  leftovers the orphan tests count), which must not be made twice or be seen by two workers.
Other session fixtures (the e2e store holding one tiny build) are cheap enough to be built
once per worker.

Groups are handed out slowest first (longest-processing-time first keeps every worker busy
to the end instead of leaving one 4-minute file for last). SLOW lists the groups that took
over ~30 s in a `--durations=0` run on the 2-core CI machine, slowest first; the rest keep
their collection order. A stale list only costs balance, never correctness.
"""

from __future__ import annotations

import pytest

SHARED_PACKAGES = ("tests/ci", "tests/device", "tests/execute/cluster",
                   "tests/execute/containers")

SLOW = (
    "tests/ci",
    "tests/e2e/test_hardening.py",
    "tests/e2e/test_openvino.py",
    "tests/execute/cluster",
    "tests/e2e/test_bad_input.py",
    "tests/rules/test_cpu_ort_methods.py",
    "tests/e2e/test_hailo_chain.py",
    "tests/rules/test_hailo_export.py",
    "tests/execute/containers",
    "tests/e2e/test_incremental.py",
    "tests/e2e/test_variants.py",
)


def group_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    for package in SHARED_PACKAGES:
        if path.startswith(package + "/"):
            return package
    return path


def _rank(group: str) -> int:
    return SLOW.index(group) if group in SLOW else len(SLOW)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group_of(item.nodeid)))
    # A stable sort: within a group (and among the unlisted groups) collection order stays.
    items.sort(key=lambda item: _rank(group_of(item.nodeid)))
