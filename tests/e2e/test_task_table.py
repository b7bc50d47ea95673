"""The no-op's task table (cli/tasktable.py) through the real doit: a no-op loads no
declaration, says and does what loading them would, and never skips what loading checks."""

from __future__ import annotations

import re

from .conftest import Project, tiny_tasks

# Modules only loading the declarations imports (each defines declaration classes).
LOADERS = ("hefbuild.declare.specs", "hefbuild.declare.targets", "hefbuild.declare.settings",
           "hefbuild.plan.actions")
IMPORT_TIMES = {"PYTHONPROFILEIMPORTTIME": "1"}  # `python -X importtime`, to stderr


def imported(stderr: str) -> set[str]:
    return set(re.findall(r"^import time:.*\| +(\S+)$", stderr, re.MULTILINE))


def lines(run_stdout: str) -> list[str]:
    """What a run says, without its wall time."""
    return [re.sub(r" in [\d.]+ (ms|s)\b", "", line) for line in run_stdout.splitlines()]


def test_a_no_op_loads_no_declaration(project: Project) -> None:
    run = project.doit("verify:tiny-llama", env=IMPORT_TIMES)
    assert run.returncode == 0, run.stderr
    assert run.outcomes() == {t: "uptodate" for t in tiny_tasks()}
    assert not imported(run.stderr) & set(LOADERS)
    # The control: an edited model file is loaded again, and the table made anew.
    project.edit("models/tiny-llama.toml", "[stages.quantize]", "\n[stages.quantize]")
    edited = project.doit("verify:tiny-llama", env=IMPORT_TIMES)
    assert edited.returncode == 0, edited.stderr
    assert set(LOADERS) <= imported(edited.stderr)
    again = project.doit("verify:tiny-llama", env=IMPORT_TIMES)
    assert not imported(again.stderr) & set(LOADERS)


def test_the_table_says_what_the_declarations_say(project: Project) -> None:
    table = project.root / ".hefbuild" / "tasks.bin"
    # (`list -s` asks each image task whether its image is current: that loads its toolchain)
    for args in (["list", "--all", "--deps"], ["verify:tiny-llama"], ["list", "-s", "--all"]):
        table.unlink(missing_ok=True)
        loaded = project.doit(*args)
        assert table.is_file()
        from_table = project.doit(*args, env=IMPORT_TIMES)
        assert "-s" in args or not imported(from_table.stderr) & set(LOADERS), args
        assert (loaded.returncode, lines(loaded.stdout)) == \
            (from_table.returncode, lines(from_table.stdout)), args
    assert "compile:tiny-llama" in loaded.stdout


def test_a_bad_setting_is_refused_with_a_table_as_without(project: Project) -> None:
    assert (project.root / ".hefbuild" / "tasks.bin").is_file()
    run = project.doit("verify:tiny-llama", env={"HEFBUILD_REMOTE_TIMEOUT": "soon"})
    assert run.returncode == 3
    assert "cache.timeout (or HEFBUILD_REMOTE_TIMEOUT)" in run.stderr
    assert run.events == []  # nothing ran, nothing was recorded


def test_a_model_file_broken_after_the_table_is_said(project: Project) -> None:
    (project.root / "models" / "broken.toml").write_text("[model]\ntarget = 3\n")
    run = project.doit("verify:tiny-llama")
    assert run.returncode == 0, run.stderr
    assert "WARNING: models/broken.toml" in run.stderr
    named = project.doit("verify:broken")
    assert named.returncode == 3 and "ERROR: models/broken.toml" in named.stderr
