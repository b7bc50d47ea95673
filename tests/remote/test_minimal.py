"""Building without the bytes (`[cache] download = "minimal"`), through the engine against
a real nginx WebDAV cache on 127.0.0.1: a CI machine builds and uploads tiny-llama, a fresh
clone with an empty store decides from the recorded digests and moves only what it reads.
Rules are the FakeExecutor's (so what ran is exactly `fake.ran`, and a rule that ran on
missing inputs would write other bytes); what moved is counted from nginx's access log."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from engine.helpers import STAGES, edit, model_toml
from fakes.cache_server import NginxCache
from fakes.fake_executor import FakeExecutor

from hefbuild.declare.settings import load_settings
from hefbuild.errors import SpecError

from .helpers import MODEL, TASKS, cache_toml, engine, make_project, run_all

MINIMAL = 'download = "minimal"\n'


class Machine:
    def __init__(self, root: Path, store: Path) -> None:
        self.root, self.store, self.fake = root, store, FakeExecutor()

    def engine(self):  # noqa: ANN201
        return engine(self.root, self.store, self.fake)

    def stage(self, stage: str) -> Path:
        return self.root / "build" / MODEL / stage

    def manifest(self, stage: str) -> dict:
        return json.loads((self.stage(stage) / "manifest.json").read_text())


@pytest.fixture
def server(make_cache: Callable[..., NginxCache]) -> NginxCache:
    return make_cache()


@pytest.fixture
def machine(tmp_path: Path, server: NginxCache) -> Callable[..., Machine]:
    count = iter(range(100))

    def make(upload: bool = False, extra: str = MINIMAL) -> Machine:
        n = next(count)
        root = make_project(tmp_path / f"m{n}" / "proj", cache_toml(server.url, upload, extra))
        return Machine(root, tmp_path / f"m{n}" / "store")

    return make


@pytest.fixture
def ci(machine: Callable[..., Machine]) -> Machine:
    built = machine(upload=True, extra="")
    assert run_all(built.engine()) == ["built"] * len(TASKS)
    return built


def blobs_of(ci: Machine, *stages: str) -> dict[str, int]:
    """digest -> size of the stages' outputs and logs, as CI built them."""
    found = {}
    for stage in stages:
        manifest = ci.manifest(stage)
        found.update({o["digest"]: o["size"] for o in manifest["outputs"].values()})
        log = ci.stage(stage) / "log.txt"
        import hashlib

        found[hashlib.sha256(log.read_bytes()).hexdigest()] = log.stat().st_size
    return found


def got(server: NginxCache) -> list[str]:
    """The digests of the blobs the cache served (every GET of cas/ that found one)."""
    time.sleep(0.1)  # nginx logs a request just after its response
    return [path.removeprefix("/cas/") for method, path, status in server.requests()
            if method == "GET" and path.startswith("/cas/") and status == 200]


def outputs_got(server: NginxCache, ci: Machine) -> set[str]:
    return set(got(server)) & set(blobs_of(ci, *STAGES))


def test_a_fresh_clone_downloads_only_the_checks_own_outputs_and_runs_no_rule(
        ci, machine, server):
    before = len(got(server))
    dev = machine()
    outcomes = run_all(dev.engine())
    assert outcomes == ["remote"] * len(TASKS)
    assert dev.fake.ran == []
    moved = set(got(server)[before:]) & set(blobs_of(ci, *STAGES))
    assert moved == set(blobs_of(ci, "verify"))  # verify's report and log, nothing else
    for stage in STAGES[:-1]:
        assert sorted(p.name for p in dev.stage(stage).iterdir()) == ["manifest.json"]
        assert dev.manifest(stage)["outputs"] == ci.manifest(stage)["outputs"]
    assert (dev.stage("verify") / "report.json").read_bytes() == \
        (ci.stage("verify") / "report.json").read_bytes()
    # The decision needs no bytes: again, everything is up to date and nothing moves.
    requests = len(server.requests())
    assert run_all(dev.engine()) == ["uptodate"] * len(TASKS)
    assert len(server.requests()) == requests


def test_editing_a_check_parameter_fetches_exactly_the_inputs_it_reads(ci, machine, server):
    dev = machine()
    run_all(dev.engine())
    before = len(got(server))
    edit(model_toml(dev.root), "max_new_tokens = 16", "max_new_tokens = 24")
    assert run_all(dev.engine()) == ["uptodate"] * 4 + ["built"]
    assert dev.fake.ran == [f"verify:{MODEL}"]
    moved = set(got(server)[before:])
    outputs = {d for st in ("fetch", "compile") for d in
               (o["digest"] for o in ci.manifest(st)["outputs"].values())}
    assert moved == outputs  # verify reads fetch and compile: their outputs, not their logs
    assert sorted(p.name for p in dev.stage("export").iterdir()) == ["manifest.json"]
    # The rule read the same bytes CI's would have: its output is what CI builds.
    edit(model_toml(ci.root), "max_new_tokens = 16", "max_new_tokens = 24")
    ci.engine().run(f"verify:{MODEL}")
    assert (dev.stage("verify") / "report.json").read_bytes() == \
        (ci.stage("verify") / "report.json").read_bytes()


def test_a_blob_evicted_after_the_decision_builds_that_stage_here(ci, machine, server):
    dev = machine()
    run_all(dev.engine())
    compiled = ci.manifest("compile")["outputs"]["model.opt.onnx"]["digest"]
    server.blob_path(compiled).unlink()  # the server evicted it; its entry stays
    edit(model_toml(dev.root), "max_new_tokens = 16", "max_new_tokens = 24")
    eng = dev.engine()
    assert run_all(eng) == ["uptodate"] * 4 + ["built"]
    assert dev.fake.ran == [f"compile:{MODEL}", f"verify:{MODEL}"]  # quantize was fetched
    assert any("no longer to be had from the remote cache" in w for w in eng.warnings)
    assert (dev.stage("compile") / "model.opt.onnx").is_file()
    assert dev.manifest("compile")["outputs"] == ci.manifest("compile")["outputs"]
    events = [json.loads(line) for line in (dev.root / "build" / "events.jsonl").open()]
    assert [(e["task"], e["outcome"]) for e in events[-2:]] == [
        (f"compile:{MODEL}", "built"), (f"verify:{MODEL}", "built")]


def test_fetching_a_stage_brings_its_outputs_and_log_into_build(ci, machine, server):
    dev = machine()
    run_all(dev.engine())
    eng = dev.engine()
    moved = eng.fetch_outputs(f"export:{MODEL}", log=True)
    assert moved == sum(blobs_of(ci, "export").values())
    for path in ci.stage("export").iterdir():
        if path.name != "manifest.json":
            assert (dev.stage("export") / path.name).read_bytes() == path.read_bytes()
    assert "in_remote" not in dev.manifest("export")
    assert eng.fetch_outputs(f"export:{MODEL}", log=True) == 0
    assert run_all(dev.engine()) == ["uptodate"] * len(TASKS)


def test_an_output_a_person_asks_for_that_the_cache_lost_is_built_here(ci, machine, server):
    dev = machine()
    run_all(dev.engine())
    for digest in {o["digest"] for o in ci.manifest("quantize")["outputs"].values()}:
        server.blob_path(digest).unlink()
    eng = dev.engine()
    eng.fetch_outputs(f"quantize:{MODEL}")
    assert dev.fake.ran == [f"quantize:{MODEL}"]  # export and fetch fetched, not rebuilt
    assert (dev.stage("quantize") / "model.int8.onnx").is_file()
    assert (dev.stage("export") / "model.onnx").is_file()


def test_download_all_downloads_every_output(ci, machine, server):
    dev = machine(extra='download = "all"\n')
    assert run_all(dev.engine()) == ["remote"] * len(TASKS)
    assert outputs_got(server, ci) == set(blobs_of(ci, *STAGES))


def test_download_is_checked(tmp_path: Path) -> None:
    (tmp_path / "hefbuild.toml").write_text('[cache]\nremote = "http://127.0.0.1:1"\n'
                                            'download = "some"\n')
    with pytest.raises(SpecError, match=r'hefbuild.toml: cache\.download .*"minimal" or '
                       r'"all", got \'some\''):
        load_settings(tmp_path, env={})
    env = {"HEFBUILD_REMOTE_DOWNLOAD": "minimal"}
    assert load_settings(tmp_path, env=env).cache.download == "minimal"
    (tmp_path / "hefbuild.toml").write_text('[cache]\nremote = "http://127.0.0.1:1"\n')
    assert load_settings(tmp_path, env={}).cache.download == "all"


def test_an_artifact_alias_or_keep_task_brings_its_file_into_build(
        ci, machine, server, monkeypatch):
    from hefbuild.cli.tasks import fetch_output, keep_output

    dev = machine()
    run_all(dev.engine())
    monkeypatch.setenv("HEFBUILD_STORE", str(dev.store))
    assert fetch_output(str(dev.root), f"compile:{MODEL}", "model.opt.onnx") is None
    assert (dev.stage("compile") / "model.opt.onnx").read_bytes() == \
        (ci.stage("compile") / "model.opt.onnx").read_bytes()
    assert not (dev.stage("compile") / "log.txt").exists()  # asked for one file: that one
    kept = keep_output(str(dev.root), MODEL, "keep", "export", "export_report.json",
                       "kept/{model}.json")
    assert kept == {"keep": f"kept/{MODEL}.json"}
    assert (dev.root / "kept" / f"{MODEL}.json").read_bytes() == \
        (ci.stage("export") / "export_report.json").read_bytes()
    assert not (dev.stage("export") / "model.onnx").exists()


def test_status_explain_and_the_report_say_what_is_in_the_remote_cache(ci, machine):
    from hefbuild.report.explain import explain_task, status_of
    from hefbuild.report.status import details, totals
    from hefbuild.report.write import write_report

    dev = machine()
    run_all(dev.engine())
    eng = dev.engine()
    statuses = [status_of(eng, t) for t in TASKS]
    assert [s.in_remote for s in statuses][-2:] == [("model.opt.onnx", "log.txt"), ()]
    assert totals(statuses) == "5 up to date (4 in the remote cache)"
    assert f"   export:{MODEL}: up to date, in the remote cache (not in build/: " \
        f"export_report.json, model.onnx, log.txt; `doit fetch export:{MODEL}` brings them)" \
        in details(statuses, {})
    assert f"  in the remote cache, not in build/: model.opt.onnx, log.txt (`doit fetch " \
        f"compile:{MODEL}` brings them)" in explain_task(eng, f"compile:{MODEL}")
    page = write_report(dev.root)
    summary = (page.parent / "summary.md").read_text()
    assert "export remote (in the remote cache)" in summary
    assert "verify remote," not in summary and "verify remote (in" not in summary
    assert page.read_text().count("in the remote cache, not in build/") == 4


def test_wrong_bytes_served_for_an_input_are_never_used_the_stage_builds_here(
        ci, machine, server):
    dev = machine()
    run_all(dev.engine())
    compiled = ci.manifest("compile")["outputs"]["model.opt.onnx"]
    blob = server.blob_path(compiled["digest"])
    blob.write_bytes(b"x" * compiled["size"])  # same size, other bytes
    edit(model_toml(dev.root), "max_new_tokens = 16", "max_new_tokens = 24")
    eng = dev.engine()
    assert run_all(eng) == ["uptodate"] * 4 + ["built"]
    assert dev.fake.ran == [f"compile:{MODEL}", f"verify:{MODEL}"]
    assert any("hashes to" in w for w in eng.warnings)
    assert (dev.stage("compile") / "model.opt.onnx").read_bytes() == \
        (ci.stage("compile") / "model.opt.onnx").read_bytes()


def test_a_half_written_file_where_the_manifest_says_remote_is_not_trusted(ci, machine):
    dev = machine()
    run_all(dev.engine())
    (dev.stage("export") / "model.onnx").write_bytes(b"half")  # a crash mid-copy, say
    eng = dev.engine()
    decision = eng.decide(eng.actions[f"export:{MODEL}"])
    assert decision.outcome.value != "uptodate"
    assert "model.onnx in build/ was changed or removed" in decision.reason
    assert eng.run(f"export:{MODEL}")["outcome"] == "remote"
    assert not (dev.stage("export") / "model.onnx").exists()
    assert run_all(dev.engine()) == ["uptodate"] * len(TASKS)


def test_a_stray_file_where_an_input_is_fetched_is_replaced_by_the_right_bytes(ci, machine):
    dev = machine()
    run_all(dev.engine())
    (dev.stage("compile") / "model.opt.onnx").write_bytes(b"stray")
    eng = dev.engine()
    assert eng.fetch_outputs(f"compile:{MODEL}") > 0
    assert (dev.stage("compile") / "model.opt.onnx").read_bytes() == \
        (ci.stage("compile") / "model.opt.onnx").read_bytes()
    assert dev.fake.ran == []
