"""`hefbuild`, the console script: doit with the project's dodo.py, from any folder of it.

`doit` looks for dodo.py in the folder it is started in only, so `doit list` in `models/`
fails; `hefbuild` finds the project root (the nearest folder up with dodo.py and models/),
changes into it and runs doit's main there, as doit does itself once it found the file.
`hefbuild --help` and `hefbuild <command or task> --help` are `hefbuild help [...]`.
Everything else is doit's: `doit …` keeps working where it did.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from doit.cmd_help import Help
from doit.doit_cmd import DoitMain

from ..errors import HefbuildError
from .command import HELP_WORDS, wants_help

# The commands that need no project: they print and exit.
_ANYWHERE = ("help", "--version")


class _Help(Help):
    """`hefbuild help`: hefbuild's name and how to ask further, then every command."""

    name = "help"

    def print_usage(self, cmds: dict[str, Any]) -> None:
        print("hefbuild -- builds of language models for edge NPUs, on doit "
              "(run from any folder of a project)\n")
        print(f"  {self.bin_name} [TASK ...]          build the tasks (every model's check "
              f"without TASK); `{self.bin_name} list` names them")
        print("\nCommands")
        for name in sorted(cmds):
            print(f"  {self.bin_name} {name:16s}  {cmds[name].doc_purpose}")
        print(f"\n  {self.bin_name} help <command>   (or `{self.bin_name} <command> --help`) "
              f"that command's usage and options")
        print(f"  {self.bin_name} help <task>      what a task does")


class HefbuildMain(DoitMain):
    BIN_NAME = "hefbuild"
    DOIT_CMDS = tuple(_Help if cmd is Help else cmd for cmd in DoitMain.DOIT_CMDS)


def help_words(args: list[str]) -> list[str]:
    """`--help` anywhere asks for help: on the command or task named first, if any."""
    if not wants_help(args):
        return args
    first = next((a for a in args if a not in HELP_WORDS), None)
    return ["help", first] if first and not first.startswith("-") else ["help"]


def download_option(args: list[str]) -> list[str]:
    """`--download all|minimal` (or `--download=…`) anywhere: the run's `[cache] download`
    (doit's parser knows no such option, so it leaves the command line as the setting's
    environment override, which the settings check like the file's value)."""
    out, i = [], 0
    while i < len(args):
        word = args[i]
        if word == "--download" and i + 1 < len(args):
            os.environ["HEFBUILD_REMOTE_DOWNLOAD"] = args[i + 1]
            i += 2
            continue
        if word.startswith("--download="):
            os.environ["HEFBUILD_REMOTE_DOWNLOAD"] = word.partition("=")[2]
        else:
            out.append(word)
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    from ..declare.project import find_root

    args = help_words(download_option(list(sys.argv[1:] if argv is None else argv)))
    sys.argv[1:] = args  # the task loader and the reporter read the command line too
    try:
        os.chdir(find_root(Path.cwd()))
    except HefbuildError as exc:
        if args[:1] and args[0] in _ANYWHERE:
            return HefbuildMain().run(args)
        print(f"ERROR: {exc}", file=sys.stderr)
        return 3
    return HefbuildMain().run(args)


if __name__ == "__main__":
    raise SystemExit(main())
