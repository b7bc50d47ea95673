"""hefbuild benchmarks, as ratios against a baseline run side by side (machines are noisy).

    python benchmarks/run.py [--runs N] [--hash-mib M]

(a) no-op `doit` on all shipped models vs bare doit with the same number of trivial
    up-to-date tasks (goal <= 1.5x); also `doit list --all` vs bare `doit list --all`.
(b) restoring the tiny pipeline from the store vs rebuilding it (goal >= 20x faster).
(c) hashing a 1 GiB file with hefbuild vs `sha256sum` (goal >= 0.9x its throughput), and
    bytes re-hashed on no-ops after `touch`: hefbuild's stat cache vs doit's MD5 checker.
Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from hefbuild.statcache import StatCache  # noqa: E402

PARTS = ("dodo.py", "pyproject.toml", "models", "toolchain", "rules", "data", "images",
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
    """n trivial python-action tasks, each with one file_dep and one target, up to date."""
    dest.mkdir(parents=True)
    (dest / "inputs").mkdir()
    for i in range(n_tasks):
        (dest / "inputs" / f"{i}.txt").write_text(str(i))
    (dest / "dodo.py").write_text(
        "import shutil\n"
        "DOIT_CONFIG = {'dep_file': '.doit.sqlite3', 'backend': 'sqlite3'}\n"
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
        (f"(a) no-op build, {n_stage_tasks} stage tasks up to date", noop_h, noop_b, "<= 1.5x"),
        (f"(a) `doit list --all`, {len(listed)} tasks (all 5 models)", list_h, list_b,
         "<= 1.5x"),
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
    return ("(b) tiny-llama pipeline: rebuild / restore from store",
            statistics.median(rebuild), statistics.median(restore), ">= 20x")


def bench_hash(work: Path, mib: int) -> list[tuple[str, float, float, str]]:
    big = work / "big.bin"
    with open(big, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
    sums = [timed(["sha256sum", str(big)], work) for _ in range(3)]
    ours = []
    for i in range(3):
        cache = StatCache(work / f"digests-{i}.sqlite3")
        start = time.perf_counter()
        cache.digest(big)
        ours.append(time.perf_counter() - start)
    rows = [(f"(c) hash {mib} MiB: sha256sum / hefbuild (throughput ratio)",
             statistics.median(sums), statistics.median(ours), ">= 0.9x")]
    cache = StatCache(work / "digests-touch.sqlite3")
    cache.digest(big)
    os.utime(big)
    first = StatCache(work / "digests-touch.sqlite3")
    first.digest(big)
    later = StatCache(work / "digests-touch.sqlite3")
    later.digest(big)
    rows.append((f"(c) bytes re-hashed after touch: 1st no-op / 2nd no-op "
                 f"(doit MD5: {mib} MiB every run)", first.bytes_hashed / 2**20,
                 later.bytes_hashed / 2**20, "2nd = 0"))
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
        rows += bench_hash(work, args.hash_mib)
    print(f"{'benchmark':<70} {'hefbuild/A':>11} {'baseline/B':>11} {'ratio':>8}  goal")
    for name, a, b, goal in rows:
        ratio = a / b if b else float("inf")
        print(f"{name:<70} {a:>11.4f} {b:>11.4f} {ratio:>7.2f}x  {goal}")


if __name__ == "__main__":
    main()
