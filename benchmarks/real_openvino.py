"""The openvino chain on a real checkpoint, for benchmarks/real_model.py.

export -> compress -> compile -> verify, every stage real, each run as the engine runs it:
with the python of the `openvino` venv toolchain (toolchain/openvino.toml's lock), got
ready by hefbuild's own code (`ToolchainResolver.venv_env`: found in the store the engine
uses, HEFBUILD_STORE or the user's cache, or created there on first use, and held in use
meanwhile so `doit gc --venvs` leaves it), in a scratch cwd with an action JSON, and with
the environment the engine gives a stage (its passthrough variables, the toolchain's
[env], PYTHONPATH=rules). The fetch stage's output is the checkpoint. Parameters are
targets/openvino.toml's declared defaults (one a rule would not read with them, an int4
`group_size` under an int8 mode, is left out as the engine leaves it out), with the
caller's overrides: real_model.py gives verify cpu-ort's prompts and token count, so every
target is checked on the same prompts. Export runs once; compress -> compile -> verify per
compress mode (default: the declared one).

Per stage: seconds, peak RSS (ru_maxrss) and output size against the float32 checkpoint;
then each verify's figures per prompt; then its time against float32 transformers
`generate` (benchmarks/verify_figures.py), run right after it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verify_figures import print_prompt, print_verify_time, run_baseline

if TYPE_CHECKING:
    from hefbuild.declare.targets import StageDef
    from hefbuild.declare.toolchains import ToolchainSpec

REPO = Path(__file__).resolve().parents[1]
TARGET = "openvino"
MIB = 1 << 20
PER_MODE = ("compress", "compile", "verify")


def declared() -> dict[str, StageDef]:
    from hefbuild.declare.targets import stage_defs

    return stage_defs(REPO, TARGET)


def stage_params(defs: dict[str, StageDef], stage: str,
                 overrides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The declared defaults, a parameter inherited from another stage taking that stage's
    override, then this stage's overrides; minus what no rule reads with these values."""
    from hefbuild.declare.params import unread

    schema = defs[stage].params
    resolved = {k: p.default for k, p in schema.items() if p.type.name != "FILE"}
    resolved.update({k: overrides[p.inherit][k] for k, p in schema.items()
                     if p.inherit and k in overrides.get(p.inherit, {})})
    resolved.update(overrides.get(stage, {}))
    for key in unread(schema, resolved):
        resolved.pop(key)
    return resolved


def load_toolchain_spec(name: str) -> ToolchainSpec:
    from hefbuild.declare.toolchains import load_toolchain

    return load_toolchain(REPO / "toolchain" / f"{name}.toml", REPO)


@contextmanager
def toolchain_python(tc: ToolchainSpec, state: Path) -> Iterator[Path]:
    """The venv toolchain's python, its environment made first if the store lacks it, in
    use until the block ends. `state`: where the resolver caches the identity (the engine's
    is the project's .hefbuild/; the benchmark keeps its own)."""
    from hefbuild.declare.project import default_store_root
    from hefbuild.execute.toolchain import ToolchainResolver
    from hefbuild.store.store import STORE_FORMAT

    resolver = ToolchainResolver(state / "toolchains.json", REPO / "toolchain")
    venvs_root = default_store_root() / STORE_FORMAT / "venvs"
    with resolver.venv_env(tc, venvs_root, lambda m: print(f"[hefbuild] {m}", flush=True)) \
            as ready:
        made = "already in the store" if ready.seconds is None else \
            f"{'created' if ready.created else 'waited for'} in {ready.seconds:.0f} s"
        print(f"toolchain {tc.name}: {ready.python.parent.parent} ({made})")
        yield ready.python


def stage_env(tc: ToolchainSpec) -> dict[str, str]:
    """What hefbuild.execute.host.stage_env gives a stage run outside the sandbox."""
    from hefbuild.execute.host import PASSTHROUGH_ENV

    env = {k: os.environ[k] for k in (*PASSTHROUGH_ENV, "HOME") if k in os.environ}
    env.update(tc.env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "rules"),
                                                    tc.env.get("PYTHONPATH")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def tree_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) \
        if folder.is_dir() else 0


class OpenvinoRunner:
    """Runs the target's rules with one python and environment; each stage's output folder
    is the input of the stages after it."""

    def __init__(self, root: Path, model: str, checkpoint: Path, python: Path,
                 env: dict[str, str], overrides: dict[str, dict[str, Any]]) -> None:
        self.root, self.model, self.python, self.env = root, model, python, env
        self.defs, self.overrides = declared(), overrides
        self.dirs: dict[str, Path] = {"fetch": root / "fetch"}
        self.dirs["fetch"].mkdir(parents=True, exist_ok=True)
        link = self.dirs["fetch"] / "checkpoint"
        if not link.exists():
            link.symlink_to(checkpoint.resolve(), target_is_directory=True)

    def params(self, stage: str, given: dict[str, Any] | None = None) -> dict[str, Any]:
        """The stage's parameters with `given` (this run's) over the overrides."""
        mine = {**self.overrides.get(stage, {}), **(given or {})}
        return stage_params(self.defs, stage, {**self.overrides, stage: mine})

    def files(self, stage: str) -> dict[str, str]:
        return {k: str(REPO / p.default) for k, p in self.defs[stage].params.items()
                if p.type.name == "FILE" and p.when is None and p.default}

    def run(self, stage: str, tag: str = "",
            params: dict[str, Any] | None = None) -> dict[str, Any]:
        scratch = self.root / f"scratch-{stage}{'-' + tag if tag else ''}"
        shutil.rmtree(scratch, ignore_errors=True)
        (scratch / "work").mkdir(parents=True)
        defn = self.defs[stage]
        action = {"format": 1, "model": self.model, "stage": stage, "target": TARGET,
                  "params": self.params(stage, params), "source": {},
                  "inputs": {u: str(self.dirs[u]) for u in defn.inputs},
                  "files": self.files(stage), "out": str(scratch / "out"),
                  "outputs": list(defn.outputs)}
        (scratch / "action.json").write_text(json.dumps(action, sort_keys=True))
        start = time.perf_counter()
        with open(scratch / "log.txt", "wb") as log:
            proc = subprocess.Popen([str(self.python), str(REPO / "rules" / defn.rule),
                                     str(scratch / "action.json")], cwd=scratch / "work",
                                    env=self.env, stdout=log, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(proc.pid, 0)
        out = scratch / "out"
        self.dirs[stage] = out
        return {"rc": os.waitstatus_to_exitcode(status), "seconds": time.perf_counter() - start,
                "peak_rss_mib": usage.ru_maxrss / 1024, "out": out, "bytes": tree_bytes(out),
                "log": (scratch / "log.txt").read_text(errors="replace")}


Row = tuple[str, dict[str, Any], dict[str, dict[str, Any]]]  # mode, verify report, its runs


def bench_openvino(name: str, root: Path, checkpoint: Path, checkpoint_bytes: int,
                   overrides: dict[str, dict[str, Any]], modes: list[str] | None = None
                   ) -> list[Row]:
    """The chain per compress mode (default: the declared one) and its tables; a row per
    mode whose verify wrote a report (a failed gate included)."""
    defs = declared()
    tc = load_toolchain_spec(defs["export"].toolchain)
    work = root / TARGET
    work.mkdir(parents=True, exist_ok=True)
    print(f"\n-- {TARGET} (every stage real, in the venv toolchain {tc.name}: {tc.description})")
    with toolchain_python(tc, work) as python:
        runner = OpenvinoRunner(work, name, checkpoint, python, stage_env(tc), overrides)
        modes = modes or [runner.params("compress")["mode"]]
        export = runner.run("export")
        stages = [("export", "-", export)]
        rows = [] if failed(export, "export") else run_modes(runner, checkpoint, modes, stages)
    print_stages(stages, checkpoint_bytes, tc.limits.get("memory"))
    for mode, report, runs in rows:
        print_check(mode, report, runs, checkpoint_bytes)
    if rows:
        verify = runner.params("verify")
        print_verify_time(verify["prompts"], verify["max_new_tokens"], rows)
    return rows


def run_modes(runner: OpenvinoRunner, checkpoint: Path, modes: list[str],
              stages: list[tuple[str, str, dict[str, Any]]]) -> list[Row]:
    """compress -> compile -> verify per mode, then the generate baseline right after
    verify; `stages` gets every run."""
    rows = []
    verify = runner.params("verify")
    for mode in modes:
        runs = {}
        for stage in PER_MODE:
            runs[stage] = runner.run(stage, mode, {"mode": mode} if stage == "compress" else None)
            stages.append((stage, mode, runs[stage]))
            if stage != "verify" and failed(runs[stage], f"{mode}: {stage}"):
                break
        report_path = runs["verify"]["out"] / "report.json" if "verify" in runs else None
        if report_path is None or not report_path.is_file():
            if "verify" in runs:
                print(f"{mode}: verify wrote no report:\n{runs['verify']['log'][-1500:]}")
            continue
        runs["generate"] = run_baseline(checkpoint, verify["prompts"], verify["max_new_tokens"])
        rows.append((mode, json.loads(report_path.read_text()), runs))
    return rows


def failed(run: dict[str, Any], what: str) -> bool:
    """Whether the stage failed; if so, its failure line (a rule's last) is printed."""
    if run["rc"] == 0:
        return False
    last = (run["log"].strip().splitlines() or ["(no output)"])[-1]
    cut = f" ... ({len(last)} characters; see {run['out'].parent / 'log.txt'})" \
        if len(last) > 1500 else ""
    print(f"{what} failed (exit {run['rc']}): {last[:1500]}{cut}")
    return True


def print_stages(stages: list[tuple[str, str, dict[str, Any]]], checkpoint_bytes: int,
                 memory_limit: int | None) -> None:
    """The table; a stage whose peak RSS passed the toolchain's [limits] memory is marked:
    the engine would have stopped it."""
    limit = f"{memory_limit / MIB:.0f} MiB" if memory_limit else "none"
    print(f"\nper stage process: wall time, peak RSS (ru_maxrss) and output folder vs the float32 "
          f"checkpoint ({checkpoint_bytes / MIB:.1f} MiB); the toolchain's memory limit: {limit}")
    print("stage     mode       seconds  peak RSS MiB  x checkpoint  output MiB  x checkpoint  rc")
    for stage, mode, run in stages:
        over = memory_limit and run["peak_rss_mib"] * MIB > memory_limit
        print(f"{stage:<9} {mode:<10} {run['seconds']:<8.1f} {run['peak_rss_mib']:<13.0f} "
              f"{run['peak_rss_mib'] * MIB / checkpoint_bytes:<13.2f} {run['bytes'] / MIB:<11.1f} "
              f"{run['bytes'] / checkpoint_bytes:<13.3f} {run['rc']}"
              f"{'  OVER the memory limit' if over else ''}")


def print_check(mode: str, report: dict[str, Any], runs: dict[str, dict[str, Any]],
                checkpoint_bytes: int) -> None:
    blob = runs["compile"]["out"] / "model.blob"
    size = blob.stat().st_size
    print(f"\n== {mode}: gate {'PASSED' if report['passed'] else 'FAILED'} "
          f"({report['gate']}, min teacher-forced {report['min_teacher_forced']}, min cosine "
          f"{report['min_logit_cosine']}); model.blob {size / MIB:.1f} MiB = "
          f"{size / checkpoint_bytes:.3f} x checkpoint; device {report['openvino_device']}, "
          f"compression {report['compression']}")
    print(f"  mean: teacher-forced {report['mean_teacher_forced_agreement']:.3f}  cosine "
          f"{report['mean_logit_cosine']:.5f}  free-running {report['mean_agreement']:.3f}")
    for p in report["prompts"]:
        print_prompt(p)
        if not p["passed"]:
            print(f"    failed: {p['reason']}")
