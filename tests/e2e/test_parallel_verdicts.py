"""`doit -n N` runs stages in worker processes, while the main process checks what comes
after them and saves the verdicts: it must look at the files a worker wrote, not at what it
stat-ed before, and keep the verdicts the workers made."""

from __future__ import annotations

import re

from .conftest import Project, assert_consistent, tiny_tasks

# quantize's output changes (its model's doc string), its own key with it (the rule's code)
SAVE = "    size = save_inline(result.model, TARGET, result.base_dir)"
EDITED = "    result.model.doc_string = 'edited'\n" + SAVE


def imported(stderr: str) -> set[str]:
    return set(re.findall(r"^import time:.*\| +(\S+)$", stderr, re.MULTILINE))


def test_a_stage_after_one_a_worker_rebuilt_is_checked_on_the_new_files(project: Project):
    assert project.doit("verify:tiny-llama").outcomes() == \
        {t: "uptodate" for t in tiny_tasks()}  # every verdict kept, every file stat-ed
    project.edit("rules/cpu_ort/quantize.py", SAVE, EDITED)
    run = project.doit("-n", "2", "verify:tiny-llama")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.tasks("built") == {"quantize:tiny-llama", "compile:tiny-llama",
                                  "verify:tiny-llama"}, run.outcomes()
    assert_consistent(project)


def test_the_verdicts_workers_made_are_kept_for_the_next_no_op(project: Project):
    project.edit("rules/cpu_ort/quantize.py", SAVE, EDITED)
    run = project.doit("-n", "2", "verify:tiny-llama")
    # built, or restored when another test of this worker's store built the edit first:
    # either way the worker processes decided and ran them
    ran = run.tasks("built") | run.tasks("restored")
    assert ran == {"quantize:tiny-llama", "compile:tiny-llama", "verify:tiny-llama"}, \
        run.outcomes()
    noop = project.doit("verify:tiny-llama", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert noop.outcomes() == {t: "uptodate" for t in tiny_tasks()}
    # every task answered from a kept verdict: the engine was never needed
    assert "hefbuild.engine.engine" not in imported(noop.stderr)
