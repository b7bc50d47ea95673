"""The command-line words hefbuild reads itself: `--help` after a command, and `-n N`."""

from __future__ import annotations

from hefbuild.cli.command import wants_help
from hefbuild.cli.main import help_words
from hefbuild.cli.session import processes


def test_help_after_a_command_or_a_task_is_help_on_it():
    assert wants_help(["--help"]) and wants_help(["--max-size", "1G", "-h"])
    assert not wants_help(["verify:m"]) and not wants_help(["--", "--help"])
    assert help_words(["gc", "--help"]) == ["help", "gc"]
    assert help_words(["verify:m", "-h"]) == ["help", "verify:m"]
    assert help_words(["--help"]) == ["help"] and help_words(["-n", "2", "--help"]) == ["help"]
    assert help_words(["-n", "2", "verify"]) == ["-n", "2", "verify"]


def test_the_number_of_processes_is_read_as_doit_reads_it():
    assert processes(["-n", "4", "verify"]) == 4
    assert processes(["-n2"]) == 2 and processes(["--process=3"]) == 3
    assert processes(["--process", "5"]) == 5
    assert processes(["verify"]) == 0 and processes(["-v", "2"]) == 0
