"""The suite's own scheduling (tests/scheduling.py): which tests share a worker, in what order."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from scheduling import SLOW, group_of, in_run_order, pytest_xdist_make_scheduler


@dataclass
class Item:
    nodeid: str


def test_a_file_is_a_group_and_a_shared_package_is_one():
    assert group_of("tests/store/test_gc.py::test_x[a::b]") == "tests/store/test_gc.py"
    assert group_of("tests/device/test_host_key.py::test_y") == "tests/device"
    assert group_of("tests/device/test_transport.py::T::test_z") == "tests/device"


def test_the_slow_groups_go_first_and_each_file_stays_together():
    ids = ["tests/store/test_gc.py::a", "tests/device/test_host_key.py::b",
           "tests/device/test_transport.py::c", "tests/store/test_gc.py::d",
           "tests/device/test_host_key.py::e", f"{SLOW[0]}/test_w.py::f"]
    order = [i.nodeid for i in in_run_order([Item(n) for n in ids])]
    assert order == [f"{SLOW[0]}/test_w.py::f", "tests/device/test_host_key.py::b",
                     "tests/device/test_host_key.py::e", "tests/device/test_transport.py::c",
                     "tests/store/test_gc.py::a", "tests/store/test_gc.py::d"]


def test_loadgroup_schedules_by_group_of_and_other_modes_are_xdists():
    option = SimpleNamespace(loadscopereorder=False, maxschedchunk=None, tx=[], numprocesses=2)
    config = SimpleNamespace(getvalue=lambda name: "loadgroup", option=option)
    sched = pytest_xdist_make_scheduler(config, None)
    assert sched._split_scope("tests/device/test_host_key.py::t") == "tests/device"
    assert sched._split_scope("tests/store/test_gc.py::t[x@y]") == "tests/store/test_gc.py"
    other = SimpleNamespace(getvalue=lambda name: "load", option=option)
    assert pytest_xdist_make_scheduler(other, None) is None
