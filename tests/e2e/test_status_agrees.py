"""`doit status`, `doit explain` and what a build then does agree, edit after edit; the
commands work from a sub-folder; doit's own commands mean what they say here."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from .conftest import TINY, Project, tiny_tasks

pytestmark = pytest.mark.e2e

MODEL = "tiny-llama"
TASKS = [f"{stage}:{MODEL}" for stage in TINY]  # in stage order

# `doit status` cell -> the verdict `doit explain` gives (parsed by `explain_kinds`).
EXPLAIN_OF_CELL = {"ok": "up to date", "restore": "restore", "BUILD": "build", "new": "build",
                   "after": "after upstream", "REFUSED": "refused"}
# `doit status` cell -> the outcomes the build may then record for that task. A task after
# an upstream that runs is rebuilt only if its inputs come out different (early cutoff).
OUTCOMES_OF_CELL = {"ok": {"uptodate"}, "restore": {"restored"}, "BUILD": {"built"},
                    "new": {"built"}, "after": {"built", "restored", "uptodate"}}


def status_cells(stdout: str, model: str = MODEL) -> dict[str, str]:
    """{task: cell} of one model's row in `doit status`'s grid (its target's header row
    names the stages)."""
    for block in stdout.split("\n\n"):
        lines = block.splitlines()
        if not lines or lines[0].startswith(" "):
            continue
        for row in lines[1:]:
            words = row.split()
            if words and words[0] == model:
                stages = lines[0].split()[1:]
                return {f"{s}:{model}": c for s, c in zip(stages, words[1:], strict=True)}
    raise AssertionError(f"no row for {model} in `doit status`:\n{stdout}")


def explain_blocks(stdout: str) -> dict[str, list[str]]:
    """{task: its lines} of `doit explain`: each block starts unindented with `task: `."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in stdout.splitlines():
        if not line.startswith(" "):
            task = line.split(": ", 1)[0]
            assert task not in blocks, f"{task} explained twice:\n{stdout}"
            current = blocks[task] = [line]
        else:
            assert current is not None, f"indented line first:\n{stdout}"
            current.append(line)
    return blocks


def explain_kind(lines: list[str]) -> str:
    """The verdict of one `doit explain` block; its headline and its detail must agree."""
    task, first = lines[0].split(": ", 1)
    later = "\n".join(lines[1:])
    if first.startswith("up to date"):
        return "up to date"
    if first.startswith("decided after upstream"):
        return "after upstream"
    if first.startswith("would fail"):
        return "refused"
    restore_said = "it would be restored, no rule run" in later
    build_said = bool(re.search(r"rules/\S+ would run", later))
    if first.startswith("would be restored from the store (") and restore_said \
            and not build_said:
        return "restore"
    if first.startswith(("would build (", "would build again (")) and build_said \
            and not restore_said:
        return "build"
    raise AssertionError(f"unparsed (or self-contradicting) explanation of {task}:\n"
                         + "\n".join(lines))


def explain_kinds(stdout: str) -> dict[str, str]:
    return {task: explain_kind(lines) for task, lines in explain_blocks(stdout).items()}


def list_marks(stdout: str) -> dict[str, str]:
    """{task: R|U|I} from `doit list --all --status`."""
    marks = {}
    for line in stdout.splitlines():
        match = re.match(r"^([RUI]) (\S+)", line)
        if match:
            marks[match.group(2)] = match.group(1)
    return marks


def append(project: Project, rel: str, text: str) -> None:
    path = project.root / rel
    path.write_text(path.read_text() + text)


@dataclass(frozen=True)
class Edit:
    name: str
    apply: Callable[[Project], None]
    cells: dict[str, str]  # what `doit status` must say of each stage after it
    outcomes: dict[str, str]  # what the build must then do (where early cutoff decides)


def _cells(**changed: str) -> dict[str, str]:
    return {t: changed.get(t.split(":")[0], "ok") for t in TASKS}


def _outcomes(**outcome: str) -> dict[str, str]:
    return {f"{s}:{MODEL}": o for s, o in outcome.items()}


TOML = f"models/{MODEL}.toml"

EDITS = [
    # A parameter of the default method (weight_only_int8): new quantized bytes, so compile
    # and verify are decided after it and run too. (No other e2e test builds block 16.)
    Edit("(a) quantize parameter",
         lambda p: p.edit(TOML, "block_size = 32", "block_size = 16"),
         _cells(quantize="BUILD", compile="after", verify="after"),
         _outcomes(quantize="built", compile="built", verify="built")),
    Edit("(c) back to the original file after (a) was built",
         lambda p: p.edit(TOML, "block_size = 16", "block_size = 32"),  # the original bytes
         _cells(quantize="restore", compile="after", verify="after"),
         _outcomes(quantize="restored", compile="restored", verify="restored")),
    # A comment changes compile's key (its code digest), not its output: verify is cut off.
    # The comment is this file's own, so no other test can have stored that key.
    Edit("(b) rule code change",
         lambda p: append(p, "rules/cpu_ort/compile.py",
                          "\n# test_status_agrees: the code digest changes, the output not\n"),
         _cells(compile="BUILD", verify="after"),
         _outcomes(compile="built", verify="uptodate")),
    Edit("(d) rm -rf build/<model>/verify",
         lambda p: shutil.rmtree(p.root / "build" / MODEL / "verify"),
         _cells(verify="restore"),
         _outcomes(verify="restored")),
    # Not 12: test_incremental builds max_new_tokens = 12 into the store all e2e tests
    # share, after which this would be a restore, not a build.
    Edit("(e) verify parameter",
         lambda p: p.edit(TOML, "max_new_tokens = 16", "max_new_tokens = 14"),
         _cells(verify="BUILD"),
         _outcomes(verify="built")),
]


def test_status_explain_and_the_build_agree_after_each_kind_of_edit(project: Project):
    original = (project.root / TOML).read_text()
    for edit in EDITS:
        edit.apply(project)
        if edit.name.startswith("(c)"):
            assert (project.root / TOML).read_text() == original

        status = project.doit("status", MODEL)
        assert status.returncode == 0, f"{edit.name}: {status.stderr}"
        cells = status_cells(status.stdout)
        assert cells == edit.cells, f"{edit.name}: doit status says\n{status.stdout}"

        explained = project.doit("explain", *TASKS)
        assert explained.returncode == 0, f"{edit.name}: {explained.stderr}"
        kinds = explain_kinds(explained.stdout)
        assert kinds == {t: EXPLAIN_OF_CELL[c] for t, c in cells.items()}, (
            f"{edit.name}: doit status\n{status.stdout}\ndisagrees with doit explain\n"
            f"{explained.stdout}")
        for task, cell in cells.items():  # the status's detail line gives the same reason
            if cell in ("BUILD", "restore"):
                assert f"   {task}: would " in status.stdout, f"{edit.name}: {status.stdout}"

        listed = project.doit("list", "--all", "--status")
        assert listed.returncode == 0, f"{edit.name}: {listed.stderr}"
        marks = list_marks(listed.stdout)
        assert {t: marks.get(t) for t in TASKS} == {
            t: "U" if c == "ok" else "R" for t, c in cells.items()}, (
            f"{edit.name}: doit status\n{status.stdout}\ndisagrees with doit list --status\n"
            f"{listed.stdout}")

        run = project.doit(f"verify:{MODEL}")
        assert run.returncode == 0, f"{edit.name}: {run.stdout}{run.stderr}"
        outcomes = run.outcomes()
        for task, cell in cells.items():
            outcome = outcomes.get(task, "uptodate")  # not in the events: nothing happened
            assert outcome in OUTCOMES_OF_CELL[cell], (
                f"{edit.name}: status said {cell} of {task}, the build did {outcome}\n"
                f"{run.stdout}")
        assert {t: outcomes.get(t, "uptodate") for t in edit.outcomes} == edit.outcomes, (
            f"{edit.name}: {run.stdout}")

    again = project.doit("status", MODEL)  # and after the last build, nothing is left to do
    assert status_cells(again.stdout) == _cells(), again.stdout


def doit_in(project: Project, sub: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "doit", *args], cwd=project.root / sub,
                          capture_output=True, text=True, timeout=600, env=project.env(None))


def test_explain_and_status_from_a_sub_folder(project: Project):
    project.edit(TOML, "max_new_tokens = 16", "max_new_tokens = 15")  # something to explain
    for args in (("explain", f"verify:{MODEL}"), ("status",)):
        root = project.doit(*args)
        sub = doit_in(project, "models", *args)
        assert root.returncode == 0 and sub.returncode == 0, root.stderr + sub.stderr
        assert sub.stdout == root.stdout, f"doit {' '.join(args)} from models/ differs"
    assert "params.max_new_tokens: 16 -> 15" in root.stdout  # status names the change too

    hef = project.doit("explain", "hef:smollm2")
    assert hef.returncode == 0, hef.stderr
    assert hef.stdout.startswith("compile:smollm2: would fail"), hef.stdout
    assert "doit lock:smollm2" in hef.stdout.splitlines()[0], hef.stdout

    group = project.doit("explain", "verify")
    assert group.returncode == 0, group.stderr
    models = [p.stem for p in sorted((project.root / "models").glob("*.toml"))]  # file order
    assert list(explain_blocks(group.stdout)) == [f"verify:{m}" for m in models], group.stdout


def test_doit_clean_dumpdb_forget_help_and_a_misspelt_task(project: Project):
    cleaned = project.doit("clean", f"verify:{MODEL}")
    assert cleaned.returncode == 0, cleaned.stderr
    assert not (project.root / "build" / MODEL / "verify").exists()
    assert (project.root / "build" / MODEL / "compile").is_dir()  # only that stage goes
    run = project.doit(f"verify:{MODEL}")
    assert run.returncode == 0, run.stderr
    assert run.outcomes() == {**{t: "uptodate" for t in tiny_tasks()},
                              f"verify:{MODEL}": "restored"}  # no rule ran
    assert (project.root / "build" / MODEL / "verify" / "report.json").is_file()

    dump = project.doit("dumpdb")
    assert dump.returncode == 0, dump.stderr
    comment, _, body = dump.stdout.partition("\n")
    assert comment.startswith("# "), dump.stdout
    assert isinstance(json.loads(body), dict), dump.stdout

    forget = project.doit("forget", f"verify:{MODEL}")
    assert forget.returncode == 0, forget.stderr
    after_forget = project.doit(f"verify:{MODEL}")
    assert after_forget.returncode == 0, after_forget.stderr
    assert after_forget.outcomes() == {t: "uptodate" for t in tiny_tasks()}

    for command in ("explain", "status"):
        shown = project.doit("help", command)
        assert shown.returncode == 0, shown.stderr
        text = shown.stdout + shown.stderr
        assert command in text
        assert "dbm" not in text and ".doit.db" not in text, text

    typo = project.doit(f"verfy:{MODEL}")
    assert typo.returncode == 3, typo.stdout + typo.stderr
    assert f"ERROR: no task 'verfy:{MODEL}'; did you mean verify:{MODEL}" in typo.stderr
    assert typo.events == []


def rule_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("   | ")]


def test_verbose_2_streams_the_rules_output(project: Project):
    # Asymmetric blocks (of 32, then 16): no other e2e test builds these into the store.
    project.edit(TOML, "block_size = 32", "block_size = 32\nsymmetric = false")
    loud = project.doit("-v", "2", f"verify:{MODEL}")
    assert loud.returncode == 0, loud.stderr
    assert f"quantize:{MODEL}" in loud.tasks("built")
    streamed = rule_lines(loud.stderr)
    assert any("MatMulNBits" in line for line in streamed), loud.stderr
    assert re.search(rf"^\[\d/5\] built      quantize:{MODEL}  .*, peak \d+ MiB — "
                     rf"params.symmetric True → False$", loud.stdout, re.MULTILINE), loud.stdout
    assert f"[1/5] up to date fetch:{MODEL}\n" in loud.stdout, loud.stdout

    project.edit(TOML, "block_size = 32", "block_size = 16")
    quiet = project.doit(f"verify:{MODEL}")
    assert quiet.returncode == 0, quiet.stderr
    assert f"quantize:{MODEL}" in quiet.tasks("built")  # the rule ran, and said nothing
    assert rule_lines(quiet.stderr) == [] and rule_lines(quiet.stdout) == [], quiet.stderr
    assert "MatMulNBits" not in quiet.stdout + quiet.stderr
