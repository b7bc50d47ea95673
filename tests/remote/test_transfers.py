"""Blobs move `[cache] transfers` at a time, each way, and stay safe doing so: a real HTTP
server on 127.0.0.1 (fakes/hostile_cache.py) that holds each `cas/` request 0.15 s counts how
many it answers at once; the entry is still uploaded after every blob it names."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine.helpers import edit, model_toml
from fakes.fake_executor import FakeExecutor
from fakes.hostile_cache import HostileCache

from hefbuild.declare.settings import load_settings
from hefbuild.errors import SpecError

from .helpers import TASKS, cache_toml, engine, make_project, run_all


@pytest.fixture
def slow(tmp_path: Path):  # noqa: ANN201
    with HostileCache(tmp_path / "slow") as server:
        server.delay_s = 0.15
        yield server


def machine(tmp_path: Path, name: str, url: str, transfers: int, upload: bool = False):  # noqa: ANN201
    extra = f"transfers = {transfers}\n"
    root = make_project(tmp_path / name / "proj", cache_toml(url, upload=upload, extra=extra))
    fake = FakeExecutor()
    return engine(root, tmp_path / name / "store", fake), fake


@pytest.mark.parametrize("transfers", [1, 4])
def test_blobs_move_up_to_transfers_at_once(tmp_path: Path, slow: HostileCache,
                                            transfers: int) -> None:
    ci, _ = machine(tmp_path, "ci", slow.url, transfers, upload=True)
    assert run_all(ci) == ["built"] * len(TASKS)
    puts = dict(slow.max_in_flight)
    slow.max_in_flight.clear()
    dev, fake = machine(tmp_path, "dev", slow.url, transfers)
    assert run_all(dev) == ["remote"] * len(TASKS) and fake.ran == []
    seen = (puts["HEAD"], puts["PUT"], slow.max_in_flight["HEAD"], slow.max_in_flight["GET"])
    if transfers == 1:
        assert seen == (1, 1, 1, 1)
    else:  # a record holds an output or more and the log: at least two move together
        assert all(2 <= n <= transfers for n in seen), seen


def test_the_entry_goes_up_after_every_blob_it_names(tmp_path: Path, slow: HostileCache) -> None:
    ci, _ = machine(tmp_path, "ci", slow.url, 4, upload=True)
    run_all(ci)
    order = [path for method, path in slow.requests if method == "PUT"]
    entries = [i for i, path in enumerate(order) if path.startswith("/ac/")]
    assert len(entries) == len(TASKS)
    start = 0
    for i in entries:  # between two entries: the blobs of the second, all before it
        assert all(p.startswith("/cas/") for p in order[start:i]) and i > start
        start = i + 1


def test_transfers_is_checked(tmp_path: Path) -> None:
    (tmp_path / "hefbuild.toml").write_text('[cache]\nremote = "http://127.0.0.1:1"\n'
                                            'transfers = 0\n')
    with pytest.raises(SpecError, match=r"cache\.transfers .*1 to 64, got 0"):
        load_settings(tmp_path, env={})
    assert load_settings(tmp_path, env={"HEFBUILD_REMOTE_TRANSFERS": "8"}).cache.transfers == 8
    (tmp_path / "hefbuild.toml").write_text('[cache]\nremote = "http://127.0.0.1:1"\n')
    assert load_settings(tmp_path, env={}).cache.transfers == 4


@pytest.mark.parametrize("transfers", [1, 4])
def test_a_stage_that_runs_fetches_its_inputs_up_to_transfers_at_once(
        tmp_path: Path, slow: HostileCache, transfers: int) -> None:
    """download = "minimal": verify reads fetch's two files, then compile's one."""
    ci, _ = machine(tmp_path, "ci", slow.url, transfers, upload=True)
    assert run_all(ci) == ["built"] * len(TASKS)
    root = make_project(tmp_path / "dev" / "proj", cache_toml(
        slow.url, extra=f'transfers = {transfers}\ndownload = "minimal"\n'))
    assert run_all(engine(root, tmp_path / "dev" / "store", FakeExecutor())) == \
        ["remote"] * len(TASKS)
    edit(model_toml(root), "max_new_tokens = 16", "max_new_tokens = 24")
    slow.max_in_flight.clear()
    fake = FakeExecutor()
    assert run_all(engine(root, tmp_path / "dev" / "store", fake)) == ["uptodate"] * 4 + \
        ["built"]
    assert fake.ran == [TASKS[-1]]
    assert slow.max_in_flight["GET"] == min(transfers, 2)  # one upstream stage at a time
