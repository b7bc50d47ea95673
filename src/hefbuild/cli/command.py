"""What every hefbuild command adds to doit's: `--help` (or `-h`) after its name prints its
usage, as `doit help <command>` does. doit's command parser knows no such option, and its
error dumps the parser's whole option list."""

from __future__ import annotations

from typing import Any

from doit.cmd_base import Command, DoitCmdBase

HELP_WORDS = ("--help", "-h")


def wants_help(args: list[str]) -> bool:
    """`--help` or `-h` among a command's own words (not after a `--`)."""
    words = args[: args.index("--")] if "--" in args else args
    return any(w in HELP_WORDS for w in words)


class _HelpOption:
    def parse_execute(self, in_args: list[str]) -> Any:
        if wants_help(in_args):
            print(self.help())  # type: ignore[attr-defined]
            return 0
        return super().parse_execute(in_args)  # type: ignore[misc]


class HelpfulCommand(_HelpOption, Command):
    """A command that needs no tasks loaded (`explain`, `status`)."""


class HelpfulDoitCmd(_HelpOption, DoitCmdBase):
    """A command that runs after doit loaded the dodo file (`report`, `gc`)."""
