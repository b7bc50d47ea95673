"""hefbuild benchmarks, as ratios against a baseline run side by side (machines are noisy).

    python benchmarks/run.py [--runs N] [--hash-mib M]

Every row: the hefbuild figure, then the baseline's (named in the row), then their ratio
(hefbuild / baseline).
(a) no-op `doit` on all shipped models vs bare doit with the same number of trivial
    up-to-date tasks (goal <= 1.5x); also `doit list --all` vs bare `doit list --all`.
(b) restoring the tiny pipeline from the store vs rebuilding it (goal <= 0.05x: >= 20x
    faster).
(c) hashing a 1 GiB file (hot in the page cache) with hefbuild vs `hashlib.file_digest`
    and vs `openssl dgst -sha256`, as throughputs (goal >= 0.9x theirs), and MiB re-hashed
    on no-ops after `touch`: hefbuild's stat cache vs doit's MD5 checker.
Prints a table; asserts nothing. `benchmarks/scale.py` has the same at scale.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from hefbuild.store.statcache import StatCache  # noqa: E402

MIB = 1 << 20

PARTS = ("dodo.py", "pyproject.toml", "models", "toolchain", "targets", "rules", "data", "images",
         "placements")
DOIT = [sys.executable, "-m", "doit"]


def timed(cmd: list[str], cwd: Path, env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def median_pair(a: list[str], a_cwd: Path, b: list[str], b_cwd: Path, runs: int,
                env: dict) -> tuple[float, float]:
    """Interleave the two commands so drift in machine load hits both alike."""
    ta, tb = [], []
    for _ in range(runs):
        ta.append(timed(a, a_cwd, env))
        tb.append(timed(b, b_cwd, env))
    return statistics.median(ta), statistics.median(tb)


def copy_project(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for part in PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / part)
    return dest


def bare_doit_project(dest: Path, n_tasks: int) -> Path:
    """n trivial python-action tasks, each with one file_dep and one target, up to date;
    doit's json backend, its fastest here (and the one hefbuild's tasks use)."""
    dest.mkdir(parents=True)
    (dest / "inputs").mkdir()
    for i in range(n_tasks):
        (dest / "inputs" / f"{i}.txt").write_text(str(i))
    (dest / "dodo.py").write_text(
        "import shutil\n"
        "DOIT_CONFIG = {'dep_file': '.doit.json', 'backend': 'json'}\n"
        "def task_t():\n"
        f"    for i in range({n_tasks}):\n"
        "        yield {'name': str(i), 'file_dep': [f'inputs/{i}.txt'],\n"
        "               'targets': [f'out/{i}.txt'],\n"
        "               'actions': [(lambda i=i: shutil.copy(f'inputs/{i}.txt', "
        "f'out/{i}.txt') or True)]}\n"
    )
    (dest / "out").mkdir()
    subprocess.run(DOIT, cwd=dest, check=True, capture_output=True,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    return dest


def bench_noop(work: Path, env: dict, runs: int) -> list[tuple[str, float, float, str]]:
    project = copy_project(work / "noop")
    cpu_tasks = ["verify:tiny-llama", "verify:tiny-qwen2"]
    subprocess.run(DOIT + cpu_tasks, cwd=project, env=env, check=True, capture_output=True)
    listed = subprocess.run(DOIT + ["list", "--all", "-q"], cwd=project, env=env, check=True,
                            capture_output=True, text=True).stdout.split()
    n_stage_tasks = 10
    bare = bare_doit_project(work / "bare", n_stage_tasks)
    noop_h, noop_b = median_pair(DOIT + cpu_tasks, project, DOIT, bare, runs, env)
    bare_list = bare_doit_project(work / "bare-list", len(listed))
    list_h, list_b = median_pair(DOIT + ["list", "--all"], project,
                                 DOIT + ["list", "--all"], bare_list, runs, env)
    return [
        (f"(a) no-op build, s: `doit {' '.join(cpu_tasks)}`, {n_stage_tasks} stage tasks up "
         f"to date (B: bare doit, {n_stage_tasks} trivial up-to-date tasks)", noop_h, noop_b,
         "<= 1.5x"),
        (f"(a) `doit list --all`, s: {len(listed)} tasks, all 5 models (B: bare doit, "
         f"{len(listed)} trivial tasks)", list_h, list_b, "<= 1.5x"),
    ]


def bench_restore(work: Path, env: dict, runs: int) -> tuple[str, float, float, str]:
    project = copy_project(work / "restore")
    rebuild, restore = [], []
    for i in range(runs):
        fresh = dict(env, HEFBUILD_STORE=str(work / f"store-{i}"))
        shutil.rmtree(project / "build", ignore_errors=True)
        rebuild.append(timed(DOIT + ["verify:tiny-llama"], project, fresh))
        shutil.rmtree(project / "build")
        restore.append(timed(DOIT + ["verify:tiny-llama"], project, fresh))
    return ("(b) tiny-llama pipeline, s: restore from the store (B: rebuild, empty store)",
            statistics.median(restore), statistics.median(rebuild), "<= 0.05x")


def bench_hash(work: Path, mib: int, runs: int) -> list[tuple[str, float, float, str]]:
    big = work / "big.bin"
    with open(big, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(MIB))
    caches = iter(range(10**6))

    def ours() -> None:
        StatCache(work / f"digests-{next(caches)}.sqlite3").digest(big)

    def file_digest() -> None:
        with open(big, "rb") as f:
            hashlib.file_digest(f, "sha256")

    def openssl() -> None:
        subprocess.run(["openssl", "dgst", "-sha256", str(big)], check=True,
                       capture_output=True)

    contenders = [ours, file_digest, openssl]
    times: dict[Callable[[], None], list[float]] = {fn: [] for fn in contenders}
    for fn in contenders:
        fn()  # warm-up: from here on the file is in the page cache for every contender
    for i in range(runs):
        for fn in contenders[i % 3:] + contenders[:i % 3]:  # rotate the order
            start = time.perf_counter()
            fn()
            times[fn].append(time.perf_counter() - start)
    mbps = {fn: mib * MIB / 1e6 / statistics.median(t) for fn, t in times.items()}
    what = f"(c) hash {mib} MiB (hot page cache), MB/s, higher is better: StatCache.digest"
    rows = [(f"{what} (B: hashlib.file_digest)", mbps[ours], mbps[file_digest], ">= 0.9x"),
            (f"{what} (B: `openssl dgst -sha256`, a subprocess, start-up included)",
             mbps[ours], mbps[openssl], ">= 0.9x")]
    cache = StatCache(work / "digests-touch.sqlite3")
    cache.digest(big)
    os.utime(big)
    first = StatCache(work / "digests-touch.sqlite3")
    first.digest(big)
    later = StatCache(work / "digests-touch.sqlite3")
    later.digest(big)
    doit_md5 = f"(B: doit's MD5 checker: all {mib} MiB on every run; by its code, unmeasured)"
    rows.append((f"(c) MiB re-hashed, 1st no-op after touch {doit_md5}",
                 first.bytes_hashed / MIB, mib, "<= 1x (once)"))
    rows.append((f"(c) MiB re-hashed, 2nd no-op after touch {doit_md5}",
                 later.bytes_hashed / MIB, mib, "0"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--hash-mib", type=int, default=1024)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hefbuild-bench-") as tmp:
        work = Path(tmp)
        env = dict(os.environ, HEFBUILD_STORE=str(work / "store"))
        # Without bytecode caching every run recompiles hefbuild from source while doit's
        # installed .pyc files are used: a skew that no user has.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        rows = bench_noop(work, env, args.runs)
        rows.append(bench_restore(work, env, max(3, args.runs // 2)))
        rows += bench_hash(work, args.hash_mib, 3)
    width = max(len(name) for name, *_ in rows)
    print(f"{'benchmark (B: the baseline)':<{width}} {'hefbuild':>11} {'baseline':>11} "
          f"{'ratio':>8}  goal")
    for name, ours, base, goal in rows:
        ratio = ours / base if base else float("inf")
        print(f"{name:<{width}} {ours:>11.4f} {base:>11.4f} {ratio:>7.3g}x  {goal}")
    print("ratio = hefbuild / baseline")


if __name__ == "__main__":
    main()
