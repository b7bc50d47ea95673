"""Which models a command line needs: only those named, else all."""

from __future__ import annotations

import pytest

from hefbuild.cli.selection import left_out, models_named

MODELS = {"tiny-llama", "tiny-qwen2", "smollm2"}
TOOLCHAINS = {"host", "export"}


@pytest.mark.parametrize("argv, expected", [
    (["verify:tiny-llama"], {"tiny-llama"}),
    (["run", "verify:tiny-llama", "hef:smollm2"], {"tiny-llama", "smollm2"}),
    (["-n", "2", "-P", "thread", "verify:tiny-llama"], {"tiny-llama"}),
    (["-n2", "-a", "verify:tiny-llama"], {"tiny-llama"}),
    (["-an", "2", "verify:tiny-qwen2"], {"tiny-qwen2"}),
    (["--verbosity=2", "--reporter", "json", "export:tiny-llama"], {"tiny-llama"}),
    (["-v", "2", "verify:tiny-llama", "seed=3"], {"tiny-llama"}),
    (["image:export", "verify:tiny-llama"], {"tiny-llama"}),
])
def test_named_tasks_of_known_models_limit_loading(argv, expected):
    assert models_named(argv, MODELS, TOOLCHAINS) == expected


@pytest.mark.parametrize("argv", [
    [],  # default tasks
    ["verify"],  # a group: every model
    ["list", "--all"],
    ["explain", "verify:tiny-llama"],
    ["info", "verify:tiny-llama"],
    ["verify:no-such-model"],  # doit reports it, with every task to suggest from
    ["verify:tiny-llama", "verify"],
    ["-n"],  # an option without its value
    ["image:export"],  # no model named
])
def test_anything_else_loads_every_model(argv):
    assert models_named(argv, MODELS, TOOLCHAINS) is None


def test_the_environment_can_ask_for_everything(monkeypatch):
    monkeypatch.setenv("HEFBUILD_ALL_TASKS", "1")
    assert models_named(["verify:tiny-llama"], MODELS, TOOLCHAINS) is None


MANUAL = {"smollm2", "smollm2@low"}


@pytest.mark.parametrize("argv, out", [
    ([], MANUAL),  # doit's default tasks
    (["verify"], MANUAL),
    (["run", "-n", "2", "verify", "hef"], MANUAL),
    (["hef:smollm2"], {"smollm2@low"}),  # named: it runs (not its variant)
    (["verify", "verify:smollm2"], {"smollm2@low"}),  # named beside a group
    (["verify:smollm2@low"], {"smollm2"}),  # the variant named: it runs, not its base
    (["verify:tiny-llama"], MANUAL),
    (["list"], set()), (["status"], set()), (["explain", "verify:smollm2"], set()),
])
def test_a_run_of_groups_leaves_manual_models_out_unless_named(argv, out):
    assert left_out(argv, MANUAL) == out
