"""build/trace.json: one invocation's event lines in the Chrome trace event format."""

from __future__ import annotations

import json

from hefbuild.report.trace import KEEP, lanes, span_of, trace_of, write_trace
from hefbuild.store.events import EventLog, Outcome

from .samples import T0, event, summary


def complete(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_each_task_line_is_a_complete_event_of_its_duration():
    lines = [event("fetch:m", 1, "built", 2.5, T0 + 2.5), event("export:m", 2, "built", 1.25,
                                                                 T0 + 4.0),
             summary(T0 + 4.1, ["compile:m"], built=2, uptodate=1)]
    trace = json.loads(json.dumps(trace_of(lines)))  # plain JSON
    spans = complete(trace)
    assert [e["name"] for e in spans] == ["fetch:m", "export:m"]
    assert [e["dur"] for e in spans] == [2_500_000, 1_250_000]
    assert [e["ts"] for e in spans] == [0, 2_750_000]  # from the first start, in µs
    assert {e["tid"] for e in spans} == {1}  # a chain: one lane
    assert spans[0]["args"]["outcome"] == "built" and spans[0]["args"]["peak_rss_mb"] == 50.0
    assert spans[0]["args"]["key"] == "01" * 32
    (done,) = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert done["args"]["tasks"] == ["compile:m"]
    assert trace["otherData"]["summary"]["built"] == 2


def test_tasks_running_at_once_get_their_own_lanes():
    # a and b overlap (doit -n 2); c starts when a has ended and takes a's lane again.
    lines = [event("b", 2, "built", 3.0, T0 + 3.5), event("a", 1, "built", 2.0, T0 + 2.0),
             event("c", 3, "built", 1.0, T0 + 3.0)]
    by_name = {e["name"]: e["tid"] for e in complete(trace_of(lines))}
    assert by_name["a"] != by_name["b"] and by_name["c"] == by_name["a"]
    names = [e["args"]["name"] for e in trace_of(lines)["traceEvents"] if e["ph"] == "M"]
    assert "lane 1" in names and "lane 2" in names


def test_lanes_never_hold_two_overlapping_spans():
    lines = [event(f"t{i}", i, "built", 1.0 + (i % 3), T0 + i * 0.7 + 1.0 + (i % 3))
             for i in range(12)]
    spans = [span_of(ln) for ln in lines]
    for lane in set(lanes(spans)):
        mine = sorted((s for s, n in zip(spans, lanes(spans), strict=True) if n == lane),
                      key=lambda s: s.start)
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:], strict=False))


def test_an_older_line_without_unix_is_placed_by_its_time():
    line = event("a", 1, "failed", 2.0, T0 + 10, error="boom")
    del line["unix"]
    span = span_of(line)
    assert span.start == T0 + 8 and span.args["error"] == "boom"


def test_heartbeats_become_memory_counters():
    beat = {"task": "a", "key": "k", "heartbeat": {"rss_mb": 812.0, "cpu_cores": 1.5},
            "unix": T0 + 1, "time": "x"}
    trace = trace_of([beat, event("a", 1, "built", 2.0, T0 + 2)])
    (counter,) = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert counter["args"] == {"rss_mb": 812.0, "cpu_cores": 1.5} and counter["ts"] == 1_000_000


def test_the_trace_of_the_lines_after_the_offset_is_written_and_kept(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.append("old:m", "k0", Outcome.BUILT, 1.0, 10.0)
    offset = path.stat().st_size
    log.append("new:m", "k1", Outcome.BUILT, 0.5, 10.0)
    log.summary({"built": 1}, [])
    out = write_trace(path, offset)
    assert out == tmp_path / "trace.json"
    assert [e["name"] for e in complete(json.loads(out.read_text()))] == ["new:m"]
    offset = path.stat().st_size  # the next invocation
    log.append("newer:m", "k2", Outcome.RESTORED, 0.1, 10.0)
    write_trace(path, offset)
    assert [e["name"] for e in complete(json.loads(out.read_text()))] == ["newer:m"]
    assert [names(t) for t in kept(tmp_path)] == [["new:m"], ["newer:m"]]  # oldest first


def names(path):
    return [e["name"] for e in complete(json.loads(path.read_text()))]


def kept(build):
    return sorted((build / "traces").glob("*.json"))


def test_a_no_op_keeps_the_last_trace_of_a_run_that_did_something(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.append("export:m", "k1", Outcome.BUILT, 0.5, 10.0)
    log.summary({"built": 1}, [])
    write_trace(path, 0)
    for _ in range(2):  # two no-ops: only their summary lines
        offset = path.stat().st_size
        log.summary({"uptodate": 1}, ["export:m"])
        assert write_trace(path, offset) is None
    assert names(tmp_path / "trace.json") == ["export:m"]
    assert [names(t) for t in kept(tmp_path)] == [["export:m"]]


def test_the_last_traces_of_runs_that_did_something_are_kept(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    for n in range(KEEP + 2):
        offset = path.stat().st_size if path.exists() else 0
        log.append(f"run{n}:m", f"k{n}", Outcome.BUILT, 0.5, 10.0)
        write_trace(path, offset)
    assert [names(t) for t in kept(tmp_path)] == [[f"run{n}:m"] for n in range(2, KEEP + 2)]
    assert names(tmp_path / "trace.json") == [f"run{KEEP + 1}:m"]


def test_a_venv_toolchains_creation_is_a_bar_before_its_stage():
    lines = [{"env": "ov", "task": "export:m", "key": "k", "seconds": 200.0, "created": True,
              "unix": T0 + 200, "time": "x"},
             event("export:m", 1, "built", 50.0, T0 + 250, env="ov", env_s=200.0)]
    env, stage = complete(trace_of(lines))
    assert (env["name"], env["cat"], env["dur"]) == ("venv toolchain ov for export:m", "env",
                                                     200_000_000)
    assert stage["ts"] == env["ts"] + env["dur"] and stage["args"]["env_s"] == 200.0
    assert env["tid"] == stage["tid"]


def test_a_trace_that_cannot_be_written_is_skipped(tmp_path):
    assert write_trace(tmp_path / "missing" / "events.jsonl", 0) is None


def test_event_lines_carry_the_moment_to_the_microsecond(tmp_path):
    path = tmp_path / "events.jsonl"
    EventLog(path).append("a", "k", Outcome.BUILT, 1.0, 10.0)
    (line,) = [json.loads(x) for x in path.read_text().splitlines()]
    assert isinstance(line["unix"], float) and "time" in line  # added, nothing replaced
