"""hefbuild at scale, as ratios against a baseline run side by side (machines are noisy).

    python benchmarks/scale.py [--runs N] [--big-mib M] [--sizes 5,50,250,1000,5000]
                               [--rows 1,2,3,4,5,6,7]

Run it on a quiet machine (`uptime` near 0 before and after; the figures of a loaded one
swing by half), with bytecode caches allowed, as users have them:
    env -u PYTHONDONTWRITEBYTECODE .venv/bin/python benchmarks/scale.py --rows 1,2
The table ends with the exact commands of each timed row and the folders they ran in.

(1) no-op `doit verify` with N stage tasks (N/5 byte-identical copies of tiny-llama, so
    one real build fills the store and every other model restores) vs bare doit with N
    trivial up-to-date tasks (one file_dep and one target each, json backend: doit's
    fastest here, and hefbuild's): goal
    <= 1.3x at 1000 tasks, <= 1.5x at 5000; and how many bytes build/events.jsonl grows
    per no-op at the largest size (goal: bounded, one line).
(2) no-op `doit verify:tiny-llama-0` with the largest size's models declared (1000 at
    5000 tasks) vs with 1 model declared (goal <= 1.1x).
(3) in-process, through the engine with a fake executor whose fetch writes an M MiB
    weights.bin (default 2 GiB): after `rm -rf build`, a new Engine restores it; time and
    bytes re-hashed vs a bare `os.link` of the object (goal <= 10 ms, 0 bytes); the same
    after another project sharing the store linked the same object; and the next no-op
    decide in a new Engine (goal 0 bytes).
(4) hashing a 1 GiB file (hot in the page cache for every contender): hefbuild's
    `sha256_file` and `StatCache.digest` vs `hashlib.file_digest` and `openssl dgst
    -sha256` (goal >= 0.95x their throughput).
(5) DVC side by side, when `import dvc` works in this interpreter: no-op and run-cache
    restore of a 5-stage dvc.yaml vs hefbuild's 5-stage tiny pipeline.
(6) `doit verify` with the largest size's models, each round after touching one model file
    (its mtime: the file is as good as edited) vs the same no-op with nothing touched: what
    an edit to one model costs the next run (the other models' verdicts stand).
(7) `doit verify` with the largest size's models, each round after the fast path's verdicts
    are removed (`.hefbuild/fastpath.bin`), so that every task is decided in full: keys
    computed, manifests read, as after an edit to a target or a toolchain vs the same no-op
    with its verdicts: what such an edit costs the next run.
Rows (1), (2), (4), (5), (6) and (7) alternate their contenders (the order changes every round)
after one untimed warm-up each; (3) repeats its scenario from `rm -rf build` on. Medians
of --runs rounds (default 9; of max(3, runs // 2) for (3)). Prints one table; asserts
nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))

from engine.helpers import make_tiny_project  # noqa: E402
from fakes.fake_executor import FakeExecutor  # noqa: E402
from run import DOIT, bare_doit_project, copy_project  # noqa: E402

from hefbuild.declare.project import load_project  # noqa: E402
from hefbuild.digest import sha256_file  # noqa: E402
from hefbuild.engine.engine import Engine  # noqa: E402
from hefbuild.store.statcache import StatCache  # noqa: E402

MODEL = "tiny-llama"
STAGES = 5  # a cpu-ort model: fetch, export, quantize, compile, verify
MIB = 1 << 20
HASH_MIB = 1024


@dataclass
class Row:
    name: str
    ours: float
    base: float
    unit: str
    goal: str

    @property
    def ratio(self) -> str:
        if self.base != self.base or self.ours != self.ours:  # nan: not measured
            return "-"
        if self.base == 0:
            return "-" if self.ours == 0 else "inf"
        return fmt(self.ours / self.base) + "x"


# -- running things ------------------------------------------------------------------


def doit_env(store: Path) -> dict[str, str]:
    """The environment of every doit subprocess: a private store, no other HEFBUILD_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEFBUILD_")}
    # Without bytecode caching every run recompiles hefbuild from source while doit's
    # installed .pyc files are used: a skew that no user has (see run.py).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["HEFBUILD_STORE"] = str(store)
    # This checkout's hefbuild, whatever the interpreter has installed.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "src")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
        raise RuntimeError(f"{' '.join(cmd)} in {cwd} exited {done.returncode}:\n"
                           + "\n".join(tail))
    return done


COMMANDS: list[str] = []  # every timed command line and its folder, printed at the end


def timer(cmd: list[str], cwd: Path, env: dict[str, str],
          before: Callable[[], None] | None = None) -> Callable[[], float]:
    """A callable that runs `cmd` once and returns its wall time (`before` is untimed)."""
    shown = " ".join(["python" if c == sys.executable else c for c in cmd])
    COMMANDS.append(f"(cd {cwd} && {shown})")

    def once() -> float:
        if before is not None:
            before()
        start = time.perf_counter()
        run(cmd, cwd, env)
        return time.perf_counter() - start

    return once


def interleaved(a: Callable[[], float], b: Callable[[], float], runs: int,
                warmup: bool = True) -> tuple[float, float]:
    """Medians of a and b, alternated (order flipped every round) so drift hits both."""
    if warmup:
        a(), b()
    ta, tb = [], []
    for i in range(runs):
        if i % 2:
            tb.append(b())
            ta.append(a())
        else:
            ta.append(a())
            tb.append(b())
    return statistics.median(ta), statistics.median(tb)


def summary_counts(text: str) -> dict[str, int]:
    """hefbuild's closing line (`hefbuild: 0 built, 3 restored, ... 5 up to date, ...`)."""
    lines = [line for line in text.splitlines() if line.startswith("hefbuild: ")]
    if not lines:
        return {}
    counts = lines[-1][len("hefbuild: "):]
    counts = re.sub(r" in [\d.]+ (?:ms|s|min|h)\b.*$", "", counts)  # the wall time
    return {what: int(n) for n, what in re.findall(r"(\d+) ([a-z][a-z ]*?)(?:,|$| \()", counts)}


def noop_note(done: subprocess.CompletedProcess, n_tasks: int) -> str:
    """'' when the run was a no-op of n_tasks tasks, else what it was (shown in the label)."""
    counts = summary_counts(done.stdout + done.stderr)
    up = counts.get("up to date", -1)
    others = sum(v for k, v in counts.items() if k != "up to date")
    return "" if up == n_tasks and others == 0 else f" [NOT a no-op: {counts}]"


# -- (1) and (2): many models --------------------------------------------------------


def many_models_project(dest: Path, n_models: int, env: dict[str, str]) -> Path:
    """A project copy whose models/ holds only tiny-llama-0 … tiny-llama-{n-1} (identical
    copies of tiny-llama.toml), every model built or restored (`doit -n 1 verify`)."""
    project = copy_project(dest)
    for path in (project / "models").iterdir():
        if path.name != f"{MODEL}.toml":
            path.unlink()
    template = project / "models" / f"{MODEL}.toml"
    for i in range(n_models):
        shutil.copyfile(template, project / "models" / f"{MODEL}-{i}.toml")
    template.unlink()  # exactly n models, so exactly 5n stage tasks
    run(DOIT + ["-n", "1", "verify"], project, env)
    return project


def bench_sizes(work: Path, env: dict[str, str], sizes: list[int], runs: int,
                projects: dict[int, Path]) -> list[Row]:
    rows = []
    growth: list[int] = []
    line_bytes = 0
    counts = sorted({max(1, round(size / STAGES)) for size in sizes})  # models per size
    for n_models in counts:
        n_tasks = n_models * STAGES
        project = many_models_project(work / f"scale-{n_models}", n_models, env)
        projects[n_models] = project
        bare = bare_doit_project(work / f"bare-{n_tasks}", n_tasks)
        events = project / "build" / "events.jsonl"
        note = noop_note(run(DOIT + ["verify"], project, env), n_tasks)
        ours_once = timer(DOIT + ["verify"], project, env)

        def ours(once: Callable[[], float] = ours_once, events: Path = events,
                 track: bool = n_models == counts[-1]) -> float:
            before = events.stat().st_size
            seconds = once()
            if track:
                growth.append(events.stat().st_size - before)
            return seconds

        hef, base = interleaved(ours, timer(DOIT, bare, env), runs)
        models = f"{n_models} model" + "s" * (n_models != 1)
        rows.append(Row(f"(1) no-op `doit verify`, {n_tasks} tasks ({models}){note} "
                        f"(B: bare doit, {n_tasks} trivial up-to-date tasks)",
                        hef, base, "s", "<= 1.3x" if n_tasks <= 1000 else "<= 1.5x"))
        last = events.read_bytes().rstrip(b"\n").rsplit(b"\n", 1)[-1]
        line_bytes = len(last) + 1  # of the largest size, the last one measured
    rows.append(Row(f"(1) build/events.jsonl growth per no-op, {counts[-1] * STAGES} tasks "
                    f"(B: one event line)", statistics.median(growth), line_bytes, "bytes",
                    "bounded: <= 1 line"))
    return rows


def bench_declared(work: Path, env: dict[str, str], runs: int,
                   projects: dict[int, Path]) -> Row:
    n = max((k for k in projects if k > 1), default=1000)
    many = projects.get(n) or many_models_project(work / f"scale-{n}", n, env)
    one = projects.get(1) or many_models_project(work / "scale-1", 1, env)
    cmd = DOIT + [f"verify:{MODEL}-0"]
    note = noop_note(run(cmd, many, env), STAGES) + noop_note(run(cmd, one, env), STAGES)
    hef, base = interleaved(timer(cmd, many, env), timer(cmd, one, env), runs)
    return Row(f"(2) no-op `doit verify:{MODEL}-0`, {n} models declared{note} "
               f"(B: the same, 1 model declared)", hef, base, "s", "<= 1.1x")


def bench_model_edit(work: Path, env: dict[str, str], runs: int,
                     projects: dict[int, Path]) -> Row:
    n = max((k for k in projects if k > 1), default=1000)
    project = projects.get(n) or many_models_project(work / f"scale-{n}", n, env)
    edited = project / "models" / f"{MODEL}-0.toml"
    cmd = DOIT + ["verify"]
    note = noop_note(run(cmd, project, env), n * STAGES)
    hef, base = interleaved(timer(cmd, project, env, before=lambda: os.utime(edited)),
                            timer(cmd, project, env), runs)
    return Row(f"(6) `doit verify` after one model file of {n} is touched{note} "
               f"(B: the same no-op, nothing touched)", hef, base, "s", "-")


def bench_full_path(work: Path, env: dict[str, str], runs: int,
                    projects: dict[int, Path]) -> Row:
    n = max((k for k in projects if k > 1), default=1000)
    project = projects.get(n) or many_models_project(work / f"scale-{n}", n, env)
    verdicts = project / ".hefbuild" / "fastpath.bin"
    cmd = DOIT + ["verify"]
    note = noop_note(run(cmd, project, env), n * STAGES)
    hef, base = interleaved(
        timer(cmd, project, env, before=lambda: verdicts.unlink(missing_ok=True)),
        timer(cmd, project, env), runs)
    return Row(f"(7) `doit verify` of {n} models with no verdicts kept (every task decided in "
               f"full){note} (B: the same no-op with them)", hef, base, "s", "-")


# -- (3): restoring a big output, in-process -----------------------------------------


@dataclass
class BigFetchExecutor(FakeExecutor):
    """The fake executor, whose fetch leaves a `checkpoint/weights.bin` of `mib` MiB."""

    mib: int = 1

    def _write_outputs(self, action: dict) -> None:
        super()._write_outputs(action)
        if action["stage"] == "fetch":
            write_big(Path(action["out"]) / "checkpoint" / "weights.bin", self.mib)


def write_big(path: Path, mib: int) -> None:
    """mib MiB fast: one random MiB written again and again, each chunk's index in its
    first 8 bytes so no two chunks are the same."""
    chunk = bytearray(os.urandom(MIB))
    with open(path, "wb") as f:
        for i in range(mib):
            chunk[:8] = struct.pack("<Q", i)
            f.write(chunk)


def bench_big_restore(work: Path, mib: int, runs: int) -> list[Row]:
    store = work / "big-store"
    root = make_tiny_project(work / "big-a")
    other = make_tiny_project(work / "big-b")
    fake = BigFetchExecutor(mib=mib)
    task = f"fetch:{MODEL}"

    def engine(at: Path) -> Engine:  # what a new doit invocation has: nothing in memory
        return Engine(load_project(at, store=store), executor=fake)

    first = engine(root)
    built = first.run(task)["outcome"]
    first.stats.close()
    manifest = json.loads((root / "build" / MODEL / "fetch" / "manifest.json").read_text())
    out = manifest["outputs"]["checkpoint/weights.bin"]
    obj = first.store.object_path(out["digest"])
    size_mib = out["size"] / MIB

    def restore(at: Path) -> tuple[float, int, str]:
        shutil.rmtree(at / "build")
        eng = engine(at)
        start = time.perf_counter()
        outcome = eng.run(task)["outcome"]
        seconds = time.perf_counter() - start
        eng.stats.close()
        return seconds, eng.stats.bytes_hashed, outcome

    def decide(at: Path) -> tuple[float, int, bool]:
        eng = engine(at)
        start = time.perf_counter()
        up = eng.is_uptodate(task)
        seconds = time.perf_counter() - start
        eng.stats.close()
        return seconds, eng.stats.bytes_hashed, up

    own, nexts, shared, others = [], [], [], set()
    for _ in range(runs):
        own.append(restore(root))
        nexts.append(decide(root))
    for _ in range(runs):
        shutil.rmtree(other / "build", ignore_errors=True)
        eng = engine(other)
        others.add(eng.run(task)["outcome"])  # links the same object from the same store
        eng.stats.close()
        shared.append(restore(root))

    # Baselines last, so they change no ctime the engine's restores could see.
    links, stats = [], []
    for i in range(max(21, runs)):
        dest = store / "v1" / "tmp" / f"bench-link-{i}"
        start = time.perf_counter()
        os.link(obj, dest)
        links.append(time.perf_counter() - start)
        dest.unlink()
        start = time.perf_counter()
        os.stat(root / "build" / MODEL / "fetch" / "checkpoint" / "weights.bin")
        stats.append(time.perf_counter() - start)
    link_ms = statistics.median(links) * 1e3
    stat_ms = statistics.median(stats) * 1e3

    def note(outcomes: set) -> str:
        return "" if outcomes == {"restored"} else f" [outcome {sorted(outcomes)}!]"

    note_built = "" if built == "built" else f" [first run: {built}!]"
    rows = []
    for label, got, extra in (("after rm -rf build", own, note_built),
                              ("after another project linked the same object", shared,
                               note(others) and f" [other project: {sorted(others)}]")):
        ms = statistics.median(t for t, _, _ in got) * 1e3
        hashed = statistics.median(b for _, b, _ in got) / MIB
        flag = note({o for _, _, o in got}) + extra
        rows.append(Row(f"(3) restore of a {size_mib:.0f} MiB output {label}, engine.run{flag} "
                        f"(B: os.link of the object alone)", ms, link_ms, "ms", "<= 10 ms"))
        rows.append(Row("(3)   MiB re-hashed by that restore (B: the output's size)",
                        hashed, size_mib, "MiB", "0"))
    ups = {u for _, _, u in nexts}
    flag = "" if ups == {True} else f" [is_uptodate: {sorted(ups)}!]"
    rows.append(Row(f"(3) next no-op decide (is_uptodate, new Engine){flag} "
                    f"(B: one os.stat of the output)",
                    statistics.median(t for t, _, _ in nexts) * 1e3, stat_ms, "ms", "-"))
    rows.append(Row("(3)   MiB re-hashed by that decide (B: the output's size)",
                    statistics.median(b for _, b, _ in nexts) / MIB, size_mib, "MiB", "0"))
    return rows


# -- (4): hashing --------------------------------------------------------------------


def bench_hash(work: Path, runs: int) -> list[Row]:
    big = work / "hash.bin"
    write_big(big, HASH_MIB)
    caches = iter(range(10**6))

    def ours_file() -> None:
        sha256_file(big)

    def ours_cache() -> None:
        StatCache(work / f"hash-digests-{next(caches)}.sqlite3").digest(big)

    def file_digest() -> None:
        with open(big, "rb") as f:
            hashlib.file_digest(f, "sha256")

    def openssl() -> None:
        subprocess.run(["openssl", "dgst", "-sha256", str(big)], check=True,
                       capture_output=True)

    contenders = {"sha256_file": ours_file, "StatCache.digest": ours_cache,
                  "file_digest": file_digest, "openssl": openssl}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for fn in contenders.values():
        fn()  # warm-up: the file is in the page cache for everyone from here on
    names = list(contenders)
    for i in range(runs):
        for name in names[i % len(names):] + names[:i % len(names)]:  # rotate the order
            start = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - start)
    mbps = {name: HASH_MIB * MIB / 1e6 / statistics.median(t) for name, t in times.items()}
    rows = []
    for ours, label in (("sha256_file", "hefbuild.digest.sha256_file"),
                        ("StatCache.digest", "StatCache.digest (fresh cache)")):
        rows.append(Row(f"(4) hash {HASH_MIB} MiB, hot page cache: {label} "
                        f"(B: hashlib.file_digest; throughput, higher is better)",
                        mbps[ours], mbps["file_digest"], "MB/s", ">= 0.95x"))
        rows.append(Row(f"(4) hash {HASH_MIB} MiB, hot page cache: {label} "
                        f"(B: `openssl dgst -sha256` incl. its process start; throughput)",
                        mbps[ours], mbps["openssl"], "MB/s", ">= 0.95x"))
    return rows


# -- (5): DVC ------------------------------------------------------------------------


DVC_STAGES = 5


def dvc_project(dest: Path, env: dict[str, str]) -> Path:
    """A 5-stage dvc.yaml chain, each stage copying the previous stage's output."""
    dest.mkdir(parents=True)
    (dest / "in.txt").write_text("hello\n")
    lines = ["stages:"]
    prev = "in.txt"
    for i in range(1, DVC_STAGES + 1):
        lines += [f"  s{i}:", f"    cmd: cp {prev} o{i}.txt", f"    deps: [{prev}]",
                  f"    outs: [o{i}.txt]"]
        prev = f"o{i}.txt"
    (dest / "dvc.yaml").write_text("\n".join(lines) + "\n")
    dvc = [sys.executable, "-m", "dvc"]
    run(dvc + ["init", "--no-scm", "-q"], dest, env)
    run(dvc + ["config", "core.analytics", "false"], dest, env)
    run(dvc + ["config", "core.check_update", "false"], dest, env)
    run(dvc + ["repro"], dest, env)
    return dest


def bench_dvc(work: Path, env: dict[str, str], runs: int) -> list[Row]:
    if importlib.util.find_spec("dvc") is None:
        return [Row("(5) DVC side by side: skipped, dvc not installed in this interpreter",
                    float("nan"), float("nan"), "-", "-")]
    dvc_env = dict(env, DVC_NO_ANALYTICS="1", DVC_SITE_CACHE_DIR=str(work / "dvc-site"),
                   DVC_GLOBAL_CONFIG_DIR=str(work / "dvc-global"),
                   DVC_SYSTEM_CONFIG_DIR=str(work / "dvc-system"))
    dvc_dir = dvc_project(work / "dvc", dvc_env)
    project = copy_project(work / "dvc-hefbuild")
    hef_cmd = DOIT + [f"verify:{MODEL}"]
    run(hef_cmd, project, env)
    dvc = [sys.executable, "-m", "dvc", "repro"]
    note = noop_note(run(hef_cmd, project, env), STAGES)
    if "up to date" not in run(dvc, dvc_dir, dvc_env).stdout:
        note += " [dvc: NOT a no-op!]"
    noop = interleaved(timer(hef_cmd, project, env), timer(dvc, dvc_dir, dvc_env), runs)

    def rm_outs() -> None:
        for i in range(1, DVC_STAGES + 1):
            (dvc_dir / f"o{i}.txt").unlink()

    def rm_build() -> None:
        shutil.rmtree(project / "build")

    rm_build()  # once untimed, to check that both really restore every stage
    done = run(hef_cmd, project, env)
    restored = summary_counts(done.stdout + done.stderr).get("restored", 0)
    note_restored = "" if restored == STAGES else f" [{restored} restored!]"
    rm_outs()
    cached = run(dvc, dvc_dir, dvc_env).stdout.count("is cached - skipping run")
    if cached != DVC_STAGES:
        note_restored += f" [dvc: {cached} from its run cache!]"
    restore = interleaved(timer(hef_cmd, project, env, before=rm_build),
                          timer(dvc, dvc_dir, dvc_env, before=rm_outs), runs)
    return [
        Row(f"(5) no-op `doit verify:{MODEL}`{note} (B: no-op `dvc repro`, 5-stage dvc.yaml, "
            f"trivial `cp` stages)", *noop, "s", "-"),
        Row(f"(5) `rm -rf build` + `doit verify:{MODEL}`, all restored{note_restored} "
            f"(B: rm outputs + `dvc repro` from its run cache)", *restore, "s", "-"),
    ]


# -- main ----------------------------------------------------------------------------


def fmt(value: float) -> str:
    if value != value:  # nan: not measured
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--big-mib", type=int, default=2048)
    parser.add_argument("--sizes", default="5,50,250,1000,5000",
                        help="numbers of stage tasks (5 per model), comma-separated")
    parser.add_argument("--rows", default="1,2,3,4,5,6,7", help="which rows, comma-separated")
    args = parser.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    wanted = {int(r) for r in args.rows.split(",") if r.strip()}
    for name in [k for k in os.environ if k.startswith("HEFBUILD_")]:
        del os.environ[name]  # the in-process engine must not see a remote cache either
    started = time.perf_counter()
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="hefbuild-scale-") as tmp:
        work = Path(tmp)
        env = doit_env(work / "store")
        projects: dict[int, Path] = {}
        rows = bench_sizes(work, env, sizes, args.runs, projects) if 1 in wanted else []
        if 2 in wanted:
            rows.append(bench_declared(work, env, args.runs, projects))
        if 6 in wanted:
            rows.append(bench_model_edit(work, env, args.runs, projects))
        if 7 in wanted:
            rows.append(bench_full_path(work, env, args.runs, projects))
        for path in projects.values():
            shutil.rmtree(path, ignore_errors=True)
        if 3 in wanted:
            rows += bench_big_restore(work, args.big_mib, max(3, args.runs // 2))
            for part in ("big-a", "big-b", "big-store"):
                shutil.rmtree(work / part)
        if 4 in wanted:
            rows += bench_hash(work, args.runs)
            (work / "hash.bin").unlink()
        if 5 in wanted:
            rows += bench_dvc(work, env, args.runs)
    width = max(len(r.name) for r in rows)
    print(f"{'benchmark (B: the baseline)':<{width}} {'hefbuild':>10} {'baseline':>10} "
          f"{'unit':<5} {'ratio':>10}  goal")
    for r in rows:
        print(f"{r.name:<{width}} {fmt(r.ours):>10} {fmt(r.base):>10} {r.unit:<5} "
              f"{r.ratio:>10}  {r.goal}")
    print(f"ratio = hefbuild / baseline; medians of {args.runs} interleaved rounds; "
          f"wall time {time.perf_counter() - started:.0f} s; load average before/after "
          f"{load_before} / {load_average()}")
    print("timed commands (in the order of the rows, each contender's; `python` is "
          f"{sys.executable}, its environment without PYTHONDONTWRITEBYTECODE):")
    for line in COMMANDS:
        print(f"  {line}")


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "-"


if __name__ == "__main__":
    main()
