"""Which models a `doit` invocation needs: task creation limited to the named targets.

doit calls every task creator on every invocation and turns every task dict into a Task:
with 200 models declared, `doit verify:one` would create 1000 tasks to run 5. When the
command line runs tasks that are all named `<stage>:<model>` (or `image:<toolchain>`),
only those models' tasks are created: a model's tasks depend on nothing but each other.
Anything else (another command, a group such as `verify`, no task named, an option this
does not know) creates them all, as before.

The command line is read from `sys.argv`, which is what `doit` runs from. A program that
drives doit through its API with other arguments sets `HEFBUILD_ALL_TASKS=1`.
"""

from __future__ import annotations

import os
import re

_TASK = re.compile(r"^([a-z][a-z0-9_-]*):([A-Za-z0-9][A-Za-z0-9._@-]*)$")
_COMMANDS = {"run", "list", "info", "help", "forget", "ignore", "clean", "dumpdb", "strace",
             "tabcompletion", "auto", "reset-dep", "explain", "gc", "store", "cache-key",
             "status", "report"}


def _value_options() -> tuple[set[str], set[str]]:
    """Short and long option names of `doit run` that take a value (from doit itself)."""
    from doit.cmd_base import DodoTaskLoader, DoitCmdBase
    from doit.cmd_run import Run

    shorts, longs = set(), set()
    for opt in (*DoitCmdBase.base_options, *Run.cmd_options, *DodoTaskLoader.cmd_options):
        if opt.get("type") is bool:
            continue
        if opt.get("short"):
            shorts.add(opt["short"])
        if opt.get("long"):
            longs.add(opt["long"])
    return shorts, longs


def _positionals(argv: list[str]) -> list[str] | None:
    """The non-option words of a doit command line; None where unsure."""
    shorts, longs = _value_options()
    words, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token.startswith("--"):
            name = token[2:].split("=", 1)[0]
            skip = name in longs and "=" not in token
        elif token.startswith("-") and len(token) > 1:
            rest = token[1:]
            while rest and rest[0] not in shorts:
                rest = rest[1:]
            skip = rest[:1] in shorts and len(rest) == 1
        elif "=" not in token:  # `name=value` words are doit's command-line variables
            words.append(token)
    return None if skip else words


def _task_words(argv: list[str]) -> list[str] | None:
    """The task words of a `doit [run]` command line ([] when none, or unsure); None for
    another command (`list`, `status`, ...)."""
    words = _positionals(argv) or []
    if words and words[0] in _COMMANDS:
        if words[0] != "run":
            return None
        words = words[1:]
    return words


def models_named(argv: list[str], models: set[str], toolchains: set[str]) -> set[str] | None:
    """The models whose tasks this command line can need, or None for all of them."""
    if os.environ.get("HEFBUILD_ALL_TASKS"):
        return None
    words = _task_words(argv)
    if not words:
        return None
    named: set[str] = set()
    for word in words:
        match = _TASK.match(word)
        if match is None:
            return None
        base, name = match.groups()
        if base == "image" and name in toolchains:
            continue
        if name not in models:
            return None  # let doit say the task is unknown, with all tasks to suggest from
        named.add(name)
    return named or None


def left_out(argv: list[str], manual: set[str]) -> set[str]:
    """The `manual` models a run leaves out: all of them, unless a task word names one
    (`doit verify:smollm2`); none for a command that runs nothing (`list`, `status`)."""
    words = _task_words(argv)
    if words is None:
        return set()
    named = {m.group(2) for w in words if (m := _TASK.match(w))}
    return manual - named


def unknown_task(argv: list[str], known: set[str]) -> str | None:
    """The one-line error for a task name on a `doit [run]` command line that names no task,
    with the closest names; None when every word is known (or this is another command)."""
    for word in _task_words(argv) or []:
        if word in known:
            continue
        import difflib  # only for a word that names no task

        close = difflib.get_close_matches(word, sorted(known), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else "; `doit list` shows them"
        return f"no task '{word}'{hint}"
    return None
