"""Work done once: two builders of one key, a 1 GiB result through the remote with bounded
memory, and entries an independent REAPI parser reads."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes.fake_executor import FakeExecutor
from fakes.reapi_proto import compile_reapi_subset

from hefbuild.execute import ExecResult, StageRun

from .helpers import MODEL, TASKS, cache_toml, engine, make_project, run_all

REPO = Path(__file__).resolve().parents[2]


class SlowExecutor(FakeExecutor):
    """Takes long enough that a second builder surely arrives while the first works."""

    def run_stage(self, request: StageRun) -> ExecResult:
        time.sleep(0.4)
        return super().run_stage(request)


def _builder(root: str, store: str, start: float, out: str) -> None:
    while time.time() < start:
        time.sleep(0.005)
    fake = SlowExecutor()
    outcomes = run_all(engine(Path(root), Path(store), fake))
    Path(out).write_text(json.dumps({"outcomes": outcomes, "ran": fake.ran}))


def test_two_builders_of_one_key_build_it_once(tmp_path):
    """Two projects sharing a store (or two CI jobs on one runner): each key built once."""
    store = tmp_path / "store"
    roots = [make_project(tmp_path / f"p{i}", "") for i in range(2)]
    ctx = multiprocessing.get_context("fork")
    start = time.time() + 0.5
    procs = [ctx.Process(target=_builder, args=(str(r), str(store), start, str(r / "out.json")))
             for r in roots]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    results = [json.loads((r / "out.json").read_text()) for r in roots]
    ran = results[0]["ran"] + results[1]["ran"]
    assert sorted(ran) == sorted(TASKS), ran  # every stage ran exactly once in all
    for a, b in zip(results[0]["outcomes"], results[1]["outcomes"], strict=True):
        assert {a, b} == {"built", "restored"}


def test_entries_parse_with_protobuf_classes_compiled_from_the_reapi_proto(
        tmp_path, make_cache):
    pytest.importorskip("grpc_tools.protoc")
    pb = compile_reapi_subset(tmp_path / "pb")
    server = make_cache()
    root = make_project(tmp_path / "ci", cache_toml(server.url, upload=True))
    assert run_all(engine(root, tmp_path / "store", FakeExecutor())) == ["built"] * len(TASKS)
    for stage in ("fetch", "export", "verify"):
        manifest = json.loads((root / "build" / MODEL / stage / "manifest.json").read_text())
        result = pb.ActionResult()
        result.ParseFromString(server.ac_path(manifest["key"]).read_bytes())
        files = {f.path: (f.digest.hash, f.digest.size_bytes) for f in result.output_files}
        record = files.pop(".hefbuild/record.json")
        assert files == {rel: (o["digest"], o["size"]) for rel, o in manifest["outputs"].items()}
        assert server.blob_path(record[0]).stat().st_size == record[1]
        log = (root / "build" / MODEL / stage / "log.txt").read_bytes()
        assert result.stdout_digest.size_bytes == len(log)
        assert server.blob_path(result.stdout_digest.hash).read_bytes() == log
        meta = result.execution_metadata
        assert meta.worker
        assert meta.execution_completed_timestamp.seconds >= meta.execution_start_timestamp.seconds
        assert result.exit_code == 0


BIG_SCRIPT = r"""
import hashlib, json, os, resource, sys, time
from pathlib import Path
from hefbuild.remote.cache import RemoteCache
from hefbuild.declare.settings import CacheSettings
from hefbuild.store.statcache import StatCache
from hefbuild.store.store import Record, Store

url, work, mib = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
def rss(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
big = work / "big.bin"
h = hashlib.sha256()
with open(big, "wb") as f:
    chunk = os.urandom(1 << 20)
    for i in range(mib):
        block = chunk[i % 7:] + chunk[:i % 7]
        h.update(block); f.write(block)
a = Store(work / "a", StatCache(work / "a.sqlite3"))
b = Store(work / "b", StatCache(work / "b.sqlite3"))
out = a.put_file(big)
log = a.put_bytes(b"log\n")
key = "ab" * 32
record = Record(key, "compile", {"model.hef": out}, log.digest, {}, 1.0, 1.0)
a.put_record(record)
warnings = []
settings = CacheSettings(remote=url, upload=True, timeout_s=30)
base = rss()
sent = RemoteCache(settings, warnings.append).upload(record, a)
after_up = rss()
fetched = RemoteCache(settings, warnings.append).fetch(key, b, "compile:big")
after_down = rss()
print(json.dumps({"sent": sent, "bytes": fetched.bytes if fetched else None,
                  "digest": h.hexdigest(), "stored": out.digest, "warnings": warnings,
                  "base_mb": base, "up_mb": after_up, "down_mb": after_down,
                  "object": str(b.object_path(out.digest))}))
"""


def test_a_1_gib_output_round_trips_with_bounded_memory(tmp_path, make_cache):
    server = make_cache()
    mib = 1024
    done = subprocess.run([sys.executable, "-c", BIG_SCRIPT, server.url, str(tmp_path),
                           str(mib)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["warnings"] == []
    assert got["stored"] == got["digest"]
    assert got["sent"] >= mib << 20 and got["bytes"] >= mib << 20
    assert Path(got["object"]).stat().st_size == mib << 20
    rise = max(got["up_mb"], got["down_mb"]) - got["base_mb"]
    assert rise < 64, f"peak RSS rose {rise:.0f} MiB moving a {mib} MiB blob"
