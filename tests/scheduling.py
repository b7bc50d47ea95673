"""How the suite spreads over pytest-xdist workers (`pytest -n auto --dist loadgroup`).

Every test belongs to a group, and a group runs on one worker:
- a test file is a group, so its module- and class-scoped fixtures are built once;
- the packages in SHARED_PACKAGES are one group each: their tests share one expensive
  session- or package-scoped fixture (a Ray cluster in its own network namespace, the
  loopback sshd of the device host, the normal user's pip cache, the Docker session whose
  leftovers the orphan tests count), which must not be made twice or be seen by two workers.
What several files read is made once for every worker of the session
(tests/session_once.py): the e2e store holding one tiny-llama build, the tiny hailo chain up
to its HEF (tests/hailo_chain.py), the cpu-ort rules' fetch and export of each tiny model;
so the files reading them may run anywhere.

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
    "tests/device",
    "tests/execute/containers",
    "tests/execute/cluster",
    "tests/rules/test_cpu_ort_methods.py",
    "tests/e2e/test_incremental.py",
    "tests/rules/test_hailo_export.py",
    "tests/rules/test_cpu_ort_tied.py",
    "tests/e2e/test_openvino.py",
    "tests/rules/test_cpu_ort_chain.py",
    "tests/e2e/test_variants.py",
    "tests/rules/test_device_check.py",
    "tests/e2e/test_hardening.py",
    "tests/e2e/test_hailo_chain.py",
    "tests/rules/test_hailo_fidelity.py",
    "tests/e2e/test_preflight.py",
    "tests/e2e/test_bad_input.py",
)


def group_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    for package in SHARED_PACKAGES:
        if path.startswith(package + "/"):
            return package
    return path


def _rank(group: str) -> int:
    return SLOW.index(group) if group in SLOW else len(SLOW)


# optionalhook: the suite also runs without xdist (`-p no:xdist`), where the hook is unknown.
@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadgroup` with the groups of group_of().

    xdist's own loadgroup reads `xdist_group` marks into a `@group` suffix it writes to
    `item._nodeid`, which pytest 9 no longer reads: every test became a group of its own,
    so module fixtures were built on both workers and the shared packages' session
    fixtures twice. This scheduler asks group_of() for each node id instead."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture parameters
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items[:] = in_run_order(items)


def in_run_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """Slowest groups first, and each test file's tests together.

    pytest groups tests by the parameters of their wider-scoped fixtures, which can
    interleave the files of a package (tests/device ran host_key, transport, host_key, ...):
    each return to a file then set up its module-scoped fixtures again, a whole tiny chain
    each time. A stable sort keeps pytest's order inside a file (its parameter groups)."""
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(item.nodeid.split("::", 1)[0], index)
    return sorted(items, key=lambda item: (_rank(group_of(item.nodeid)),
                                           first_seen[item.nodeid.split("::", 1)[0]]))
