"""Both ends of the lifeline on this host, without a container: the wrapper runs the rule,
passes its exit code on, and kills it once the process holding the FIFO is gone (a doit
killed with -9), but never on a FIFO that was not armed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import hefbuild.execute.lifeline as lifeline

WRAPPER = str(Path(lifeline.__file__))
HOLDER = """
import sys, time
from pathlib import Path
from hefbuild.execute.lifeline import hold
with hold(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(300)
"""
# The rule: writes its pid, says so on stdout, then sleeps, or exits with argv[2] once a
# line comes on its stdin (the test decides when it ends).
RULE = """
import os, sys, time
from pathlib import Path
Path(sys.argv[1]).write_text(str(os.getpid()))
print("rule started", flush=True)
if len(sys.argv) > 2:
    sys.stdin.readline()
    sys.exit(int(sys.argv[2]))
time.sleep(300)
"""


def start_holder(fifo: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(fifo)], stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline() == "held\n"
    return holder


def wrap(fifo: Path, pid_file: Path, *rule_args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-I", WRAPPER, str(fifo), sys.executable, "-c",
                             RULE, str(pid_file), *rule_args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_the_rule_is_killed_when_the_holder_of_the_fifo_is_killed(tmp_path):
    fifo, pid_file = tmp_path / "lifeline.fifo", tmp_path / "rule.pid"
    holder = start_holder(fifo)
    wrapper = wrap(fifo, pid_file)
    try:
        assert wrapper.stdout.readline() == "rule started\n"  # armed before the rule starts
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        out, err = wrapper.communicate(timeout=60)  # without the lifeline: 300 s, then fails
        assert wrapper.returncode == 128 + signal.SIGKILL
        assert lifeline.GONE_LINE in err
        rule_pid = int(pid_file.read_text())
        assert not Path(f"/proc/{rule_pid}").exists() or _zombie(rule_pid)
    finally:
        stop(holder, wrapper)


def test_the_rules_exit_code_is_the_wrappers(tmp_path):
    fifo, pid_file = tmp_path / "lifeline.fifo", tmp_path / "rule.pid"
    holder = start_holder(fifo)
    try:
        wrapper = wrap(fifo, pid_file, "3")
        out, err = wrapper.communicate("end\n", timeout=60)
        assert (wrapper.returncode, out, err) == (3, "rule started\n", "")
    finally:
        stop(holder)


def test_a_fifo_that_was_never_armed_kills_nothing(tmp_path):
    """A daemon in a VM: the FIFO it binds has no writer here. The rule runs to its end."""
    fifo, pid_file = tmp_path / "lifeline.fifo", tmp_path / "rule.pid"
    os.mkfifo(fifo)
    wrapper = wrap(fifo, pid_file, "0")
    try:
        assert wrapper.stdout.readline() == "rule started\n"
        out, err = wrapper.communicate("end\n", timeout=60)  # the rule ends when told to
    finally:
        stop(wrapper)
    assert (wrapper.returncode, out, err) == (0, "", "")


def test_a_file_system_without_fifos_disarms_the_lifeline(tmp_path, monkeypatch):
    def refuse(path, mode=0o666):
        raise PermissionError(1, "Operation not permitted", str(path))

    fifo, pid_file = tmp_path / "lifeline.fifo", tmp_path / "rule.pid"
    monkeypatch.setattr(os, "mkfifo", refuse)
    with lifeline.hold(fifo):
        assert fifo.is_file() and fifo.read_bytes() == b""
        wrapper = wrap(fifo, pid_file, "0")
        try:
            assert wrapper.stdout.readline() == "rule started\n"
            out, err = wrapper.communicate("end\n", timeout=60)
        finally:
            stop(wrapper)
    assert (wrapper.returncode, out, err) == (0, "", "")


def test_no_child_of_doit_inherits_the_fifo(tmp_path):
    fifo = tmp_path / "lifeline.fifo"
    with lifeline.hold(fifo):
        listed = subprocess.run(["ls", "-l", "/proc/self/fd/"], capture_output=True,
                                text=True, close_fds=False)
    assert "/dev/null" in listed.stdout or "pipe:" in listed.stdout  # the listing shows links
    assert str(fifo) not in listed.stdout


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True
