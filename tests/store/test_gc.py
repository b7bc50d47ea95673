"""The gc policy on tiny literals, and the size and age options."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from hefbuild.declare.bounds import parse_age, parse_size
from hefbuild.errors import HefbuildError, SpecError
from hefbuild.store.gc import (
    GcPolicy,
    RecordInfo,
    collect_node,
    loose_records,
    plan_gc,
)
from hefbuild.store.storelock import StoreLock

DAY = 86400.0
NOW = 100 * DAY


def rec(key: str, days_ago: float, *objects: str, readable: bool = True) -> RecordInfo:
    return RecordInfo(key, 0, NOW - days_ago * DAY, frozenset(objects), readable=readable)


def policy(max_bytes: int | None = None, max_age_days: float | None = None) -> GcPolicy:
    return GcPolicy(max_bytes, None if max_age_days is None else max_age_days * DAY, NOW)


def plan(records, sizes, pol, pinned_records=(), pinned_objects=()):
    return plan_gc(records, sizes, set(pinned_records), set(pinned_objects), pol)


SIZES = {"a": 10, "b": 20, "c": 30, "log": 1}
RECORDS = [rec("old", 40, "a", "log"), rec("mid", 10, "b", "log"), rec("new", 1, "c", "log")]


def test_no_limit_keeps_every_record_and_drops_only_orphans():
    got = plan(RECORDS, SIZES | {"orphan": 5}, policy())
    assert got.drop_records == [] and got.drop_objects == ["orphan"]
    assert (got.freed_bytes, got.kept_bytes) == (5, 61)


def test_age_limit_drops_records_not_used_since():
    got = plan(RECORDS, SIZES, policy(max_age_days=30))
    assert got.drop_records == ["old"]
    assert got.drop_objects == ["a"]  # the log is shared with records still kept
    assert (got.freed_bytes, got.kept_bytes) == (10, 51)


def test_size_limit_drops_least_recently_used_first_until_it_fits():
    got = plan(RECORDS, SIZES, policy(max_bytes=35))
    assert got.drop_records == ["old", "mid"]
    assert got.drop_objects == ["a", "b"]
    assert got.kept_bytes == 31


def test_size_limit_already_met_drops_nothing():
    assert plan(RECORDS, SIZES, policy(max_bytes=61)).drop_records == []


def test_size_zero_drops_every_unpinned_record_and_object():
    got = plan(RECORDS, SIZES, policy(max_bytes=0))
    assert got.drop_records == ["old", "mid", "new"]
    assert got.drop_objects == ["a", "b", "c", "log"]
    assert (got.freed_bytes, got.kept_bytes) == (61, 0)


def test_pinned_record_survives_both_limits():
    got = plan(RECORDS, SIZES, policy(max_bytes=0, max_age_days=1), pinned_records={"old"})
    assert "old" not in got.drop_records
    assert got.drop_objects == ["b", "c"]
    assert got.pinned_records == 1


def test_pinned_object_survives_its_records_and_counts_as_kept():
    got = plan(RECORDS, SIZES, policy(max_bytes=0), pinned_objects={"c"})
    assert got.drop_records == ["old", "mid", "new"]
    assert "c" not in got.drop_objects
    assert got.kept_bytes == 30 and got.pinned_objects == 1


def test_pinned_objects_count_towards_the_size_limit():
    # "c" (30) is pinned: keeping the rest would need 61 > 40, so "old" and "mid" go.
    got = plan(RECORDS, SIZES, policy(max_bytes=40), pinned_objects={"c"})
    assert got.drop_records == ["old", "mid"]


def test_shared_object_is_counted_once_and_kept_while_any_kept_record_uses_it():
    records = [rec("r1", 3, "big"), rec("r2", 2, "big", "small"), rec("r3", 1, "small")]
    got = plan(records, {"big": 100, "small": 1}, policy(max_bytes=100))
    # 101 bytes in all; dropping r1 frees nothing (r2 uses big), dropping r2 frees big.
    assert got.drop_records == ["r1", "r2"]
    assert got.drop_objects == ["big"] and got.kept_bytes == 1


def test_orphans_are_dropped_even_with_generous_limits():
    got = plan([rec("r", 1, "a")], {"a": 1, "z": 2, "y": 3}, policy(max_bytes=10**9))
    assert got.drop_objects == ["y", "z"]


def test_objects_a_record_names_but_the_store_lacks_count_for_nothing():
    got = plan([rec("r", 1, "a", "missing")], {"a": 7}, policy(max_bytes=7))
    assert got.drop_records == [] and got.kept_bytes == 7


def test_unreadable_record_is_garbage_whatever_the_limits():
    records = [rec("bad", 0, readable=False), rec("good", 0, "a")]
    assert plan(records, {"a": 1}, policy()).drop_records == ["bad"]
    assert plan(records, {"a": 1}, policy(), pinned_records={"bad"}).drop_records == []


def test_ties_in_last_use_are_broken_by_key():
    records = [rec(k, 5, k) for k in ("k3", "k1", "k2")]
    got = plan(records, {"k1": 1, "k2": 1, "k3": 1}, policy(max_bytes=1))
    assert got.drop_records == ["k1", "k2"]
    assert plan(list(reversed(records)), {"k1": 1, "k2": 1, "k3": 1},
                policy(max_bytes=1)) == got


@pytest.mark.parametrize(("text", "expected"), [
    ("0", 0), ("1500", 1500), ("500M", 500 * 2**20), ("10G", 10 * 2**30),
    ("2.5GiB", int(2.5 * 2**30)), ("10GB", 10 * 10**9), ("64k", 64 * 1024),
    ("1 TiB", 2**40), ("12b", 12),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "ten", "-1G", "10X", "1.2.3G", "G", "10 G B"])
def test_parse_size_rejects_with_one_line_naming_the_option(text):
    with pytest.raises(SpecError) as err:
        parse_size(text)
    message = str(err.value)
    assert message.startswith("--max-size: a size such as 10G") and "\n" not in message
    assert isinstance(err.value, HefbuildError) and err.value.exit_code == 3


@pytest.mark.parametrize(("text", "expected"), [
    ("30d", 30 * DAY), ("12h", 12 * 3600.0), ("90m", 5400.0), ("45s", 45.0),
    ("2w", 14 * DAY), ("1.5d", 1.5 * DAY), ("0", 0.0),
])
def test_parse_age(text, expected):
    assert parse_age(text) == expected


@pytest.mark.parametrize("text", ["", "30", "30x", "d", "-1d", "thirty days"])
def test_parse_age_rejects_with_one_line_naming_the_option(text):
    with pytest.raises(SpecError, match=r"^--max-age: an age such as 30d, 12h"):
        parse_age(text, "--max-age")


# -- a cluster node's store: loose objects, least recently linked first ------------------

def obj(v1: Path, body: bytes) -> Path:
    digest = hashlib.sha256(body).hexdigest()
    path = v1 / "objects" / digest[:2] / digest[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    return path


def test_loose_objects_are_planned_as_records_of_their_own() -> None:
    named = [rec("r", 1, "a", "log")]
    loose = loose_records(named, SIZES | {"x": 7}, {"x": NOW - DAY})
    assert loose == [RecordInfo("object:b", 20, 0.0, frozenset({"b"}), "object"),
                     RecordInfo("object:c", 30, 0.0, frozenset({"c"}), "object"),
                     RecordInfo("object:x", 7, NOW - DAY, frozenset({"x"}), "object")]


def test_a_node_store_under_its_bounds_keeps_what_it_fetched(tmp_path: Path) -> None:
    v1 = tmp_path / "v1"
    kept = [obj(v1, b"input %d" % i) for i in range(3)]
    plan = collect_node(v1, GcPolicy(1 << 20, None, time.time()))
    assert plan is not None and plan.drop_objects == []
    assert all(p.exists() for p in kept)  # `doit gc` drops such orphans; a node keeps them


def test_over_its_bound_a_node_drops_the_least_recently_linked_first() -> None:
    sizes = {"a": 600, "b": 600, "c": 600}
    linked = {"a": NOW - 3 * DAY, "b": NOW - 1 * DAY, "c": NOW - 2 * DAY}
    got = plan(loose_records([], sizes, linked), sizes, policy(max_bytes=1300))
    assert got.drop_objects == ["a"] and got.kept_bytes == 1200
    got = plan(loose_records([], sizes, linked), sizes, policy(max_age_days=1.5))
    assert got.drop_objects == ["a", "c"]


def test_a_node_store_over_its_bound_is_brought_under_it_on_disk(tmp_path: Path) -> None:
    v1 = tmp_path / "v1"
    fetched = [obj(v1, b"%d" % i * 600) for i in range(2)]
    in_use = obj(v1, b"u" * 600)
    os.link(in_use, tmp_path / "linked-into-a-running-stage")  # pinned by its second link
    plan = collect_node(v1, GcPolicy(700, None, time.time()))
    assert plan is not None and plan.kept_bytes == 600
    assert in_use.exists() and not any(p.exists() for p in fetched)


def test_a_node_store_in_use_is_left_to_the_next_stage(tmp_path: Path) -> None:
    v1 = tmp_path / "v1"
    junk = obj(v1, b"j" * 100)
    with StoreLock(v1).shared():
        assert collect_node(v1, GcPolicy(0, None, time.time())) is None
    assert junk.exists()
    assert collect_node(v1, GcPolicy(0, None, time.time())) is not None
    assert not junk.exists()
