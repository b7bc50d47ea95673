"""Host stages in bubblewrap: a hostile rule's every attempt to reach outside fails, nothing
it starts outlives it, and an honest rule builds as before.

These run real rules through the real host executor (no fake): the rule programs below
replace the dummy rules of the tiny project.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import psutil
import pytest
from engine.helpers import MODEL, make_tiny_project

from hefbuild.declare.project import load_project
from hefbuild.engine.engine import Engine
from hefbuild.errors import StageError
from hefbuild.execute.sandbox import bwrap_path, probe_bwrap
from hefbuild.execute.seccomp import TABLES

pytestmark = pytest.mark.skipif(
    bwrap_path() is None and os.environ.get("CI") != "true",
    reason="bubblewrap missing (.ci/run installs it)")

FETCH_RULE = """
import json, os, sys
action = json.load(open(sys.argv[1]))
os.makedirs(os.path.join(action["out"], "checkpoint"))
seen = {"token": os.environ.get("HF_TOKEN")}
open(os.path.join(action["out"], "checkpoint", "seen.json"), "w").write(json.dumps(seen))
"""

HOSTILE_RULE = """
import json, os, socket, sys, time
action = json.load(open(sys.argv[1]))
targets = json.loads(os.environ["HOSTILE_TARGETS"]) if "HOSTILE_TARGETS" in os.environ else {}
probe = json.load(open(os.path.join(action["inputs"]["fetch"], "checkpoint", "probe.json")))
tried = {}
for name, path in probe["write"].items():
    try:
        open(path, "w").write("pwned")
        tried[name] = "WROTE"
    except OSError as exc:
        tried[name] = type(exc).__name__
for name, path in probe["read"].items():
    try:
        open(path).read()
        tried[name] = "READ"
    except OSError as exc:
        tried[name] = type(exc).__name__
try:
    socket.create_connection(("127.0.0.1", probe["port"]), timeout=2).close()
    tried["socket"] = "CONNECTED"
except OSError as exc:
    tried["socket"] = type(exc).__name__
tried["token"] = os.environ.get("HF_TOKEN")
if os.fork() == 0:  # a daemon: double fork, new session, ignores SIGTERM
    os.setsid()
    if os.fork() == 0:
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)",
                                  probe["marker"]])
    os._exit(0)
time.sleep(0.3)
out = action["out"]
open(os.path.join(out, "model.onnx"), "w").write("onnx")
open(os.path.join(out, "export_report.json"), "w").write(json.dumps(tried, sort_keys=True))
"""


# The escape of the issue (a tmpfs, a block device for the host's disk in it, that disk
# mounted read-write, writes through it), then every other call the filter refuses, each by
# its raw number. Every result is recorded (an errno name, "ok", or how a child died) and the
# rule carries on: the test sees them all, whichever fail.
ESCAPE_RULE = r"""
import ctypes, errno, json, os, signal, stat, subprocess, sys, threading
action = json.load(open(sys.argv[1]))
probe = json.load(open(os.path.join(action["inputs"]["fetch"], "checkpoint", "probe.json")))
nr = probe["syscalls"]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
AT_FDCWD, CLONE_NEWUSER = -100, 0x10000000
tried = {}

def call(name, *args):
    args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr[name]), *args)
    if ret == 0 and name == "clone":  # the child of an unfiltered clone: it must not go on
        os._exit(0)
    if ret > 0 and name == "clone":
        os.waitpid(ret, 0)
    return "ok" if ret >= 0 else errno.errorcode[ctypes.get_errno()]

def attempt(key, name, *args):
    try:
        tried[key] = call(name, *args)
    except Exception as exc:  # a call we could not even make (say, no such ns file)
        tried[key] = type(exc).__name__

def in_child(fn):
    pid = os.fork()
    if pid == 0:
        os._exit(fn())
    status = os.waitpid(pid, 0)[1]
    if os.WIFSIGNALED(status):
        return signal.Signals(os.WTERMSIG(status)).name
    code = os.WEXITSTATUS(status)
    return "ok" if code == 0 else errno.errorcode.get(code, str(code))

def errno_of(result):
    return 0 if result == "ok" else getattr(errno, result)

usr = [ln.split() for ln in open("/proc/self/mounts") if ln.split()[1] == "/usr"][0]
disk = os.stat("/usr").st_dev
os.makedirs("/tmp/m"); os.makedirs("/tmp/disk")
attempt("mount", "mount", b"none", b"/tmp/m", b"tmpfs", 0, None)
attempt("mknodat_block", "mknodat", AT_FDCWD, b"/tmp/m/disk", stat.S_IFBLK | 0o600, disk)
attempt("mknodat_char", "mknodat", AT_FDCWD, b"/tmp/m/mem", stat.S_IFCHR | 0o600,
        os.makedev(1, 1))
if "mknod" in nr:
    attempt("mknod_block", "mknod", b"/tmp/m/disk2", stat.S_IFBLK | 0o600, disk)
attempt("mount_disk", "mount", b"/tmp/m/disk", b"/tmp/disk", usr[2].encode(), 0, None)
for name, path in probe["write"].items():
    for where in (path, "/tmp/disk" + path):  # as it is, and through the mounted disk
        try:
            with open(where, "w") as f:
                f.write("pwned")
            tried[f"write_{name}"] = "WROTE " + where
        except OSError:
            pass
# Targets that leave the rule able to go on even where the call works (the old sandbox).
attempt("umount2", "umount2", b"/tmp/m", 0)
attempt("pivot_root", "pivot_root", b"/tmp/none", b"/tmp/none")
own_userns = os.open("/proc/self/ns/user", os.O_RDONLY) if os.path.exists(
    "/proc/self/ns/user") else -1
attempt("setns", "setns", own_userns, 0)
attempt("unshare_newuser", "unshare", CLONE_NEWUSER)
attempt("clone_newuser", "clone", CLONE_NEWUSER | signal.SIGCHLD, 0, 0, 0, 0)
attempt("clone3", "clone3", None, 0)
tried["ptrace"] = in_child(lambda: errno_of(call("ptrace", 0, 0, 0, 0)))  # PTRACE_TRACEME

class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
src, dst = ctypes.create_string_buffer(b"secret"), ctypes.create_string_buffer(6)
local, remote = Iovec(ctypes.addressof(dst), 6), Iovec(ctypes.addressof(src), 6)
for name in ("process_vm_readv", "process_vm_writev"):
    attempt(name, name, os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
attempt("kexec_load", "kexec_load", 0, 0, None, 0)
attempt("kexec_file_load", "kexec_file_load", -1, -1, 0, b"", 0)
attempt("init_module", "init_module", None, 0, b"")
attempt("finit_module", "finit_module", -1, b"", 0)
attempt("delete_module", "delete_module", b"hefbuild_none", 0)
attempt("bpf", "bpf", 0, None, 0)
attempt("keyctl", "keyctl", 0, -3, 1)  # KEYCTL_GET_KEYRING_ID of the session's
attempt("add_key", "add_key", b"user", b"hefbuild", b"x", 1, -2)
attempt("request_key", "request_key", b"user", b"hefbuild-none", None, 0)
attempt("open_tree", "open_tree", AT_FDCWD, b"/tmp", 0)
attempt("move_mount", "move_mount", -1, b"", AT_FDCWD, b"/tmp/m", 0)
attempt("fsopen", "fsopen", b"tmpfs", 0)
attempt("fsconfig", "fsconfig", -1, 0, None, None, 0)
attempt("fsmount", "fsmount", -1, 0, 0)
attempt("fspick", "fspick", AT_FDCWD, b"/tmp", 0)
attempt("mount_setattr", "mount_setattr", -1, b"", 0, None, 0)
if probe["x32"]:  # x86_64's x32 ABI: getpid with the x32 bit, in a child it may kill
    tried["x32_getpid"] = in_child(lambda: errno_of(call("x32_getpid")))
try:
    open("/proc/sys/kernel/hostname", "w").write("pwned")  # the stage's own UTS namespace
    tried["sysctl"] = "ok"
except OSError as exc:
    tried["sysctl"] = errno.errorcode[exc.errno]
tried["core_pattern_writable"] = os.access("/proc/sys/kernel/core_pattern", os.W_OK)
for path in probe["secrets"]:  # what only root may read on the host
    try:
        tried["secret " + path] = "READ" if open(path, "rb").read() else "empty"
    except OSError as exc:
        tried["secret " + path] = errno.errorcode[exc.errno]
# What an honest rule does still works.
attempt("mknodat_fifo", "mknodat", AT_FDCWD, b"/tmp/fifo", stat.S_IFIFO | 0o600, 0)
tried["fork"] = in_child(lambda: 0)
worker = threading.Thread(target=lambda: tried.__setitem__("thread", "ok"))
worker.start(); worker.join()
tried["subprocess"] = "ok" if subprocess.run([sys.executable, "-c", "pass"]).returncode == 0 \
    else "failed"
tried["status"] = dict(ln.split(":\t", 1) for ln in open("/proc/self/status").read().splitlines()
                       if ln.startswith(("Cap", "NoNewPrivs", "Seccomp:")))
tried["status"] = {k: v.strip() for k, v in tried["status"].items()}
out = action["out"]
open(os.path.join(out, "model.onnx"), "w").write("onnx")
open(os.path.join(out, "export_report.json"), "w").write(json.dumps(tried, sort_keys=True))
"""
REFUSED = ("mount", "mknodat_block", "mknodat_char", "mount_disk", "umount2", "pivot_root",
           "setns", "unshare_newuser", "clone_newuser", "ptrace", "process_vm_readv",
           "process_vm_writev", "kexec_load", "kexec_file_load", "init_module", "finit_module",
           "delete_module", "bpf", "keyctl", "add_key", "request_key", "open_tree",
           "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr")
EXPECTED_TOO = {
    "clone3": "ENOSYS",  # glibc then falls back to clone, whose flags the filter reads
    "sysctl": "EROFS", "core_pattern_writable": False,  # /proc is read-only
    "status.NoNewPrivs": "1", "status.Seccomp": "2",
    # What an honest rule does still works.
    "mknodat_fifo": "ok", "fork": "ok", "thread": "ok", "subprocess": "ok",
}

# Outputs (and a work folder) only their owner's root could read: mode 0000 files and folders.
LOCKED_RULE = """
import json, os, sys
action = json.load(open(sys.argv[1]))
ckpt = os.path.join(action["out"], "checkpoint")
os.makedirs(os.path.join(ckpt, "sub"))
for rel, text in (("config.json", "{}"), ("sub/weights.bin", "weights")):
    with open(os.path.join(ckpt, rel), "w") as f:
        f.write(text)
    os.chmod(os.path.join(ckpt, rel), 0)
os.makedirs("cache/locked/deeper")
for folder in ("cache/locked/deeper", "cache/locked", os.path.join(ckpt, "sub"), ckpt):
    os.chmod(folder, 0)
"""
NOBODY = 65534
BUILD_AS_IS = """
import json, sys
from pathlib import Path
from hefbuild.engine.engine import Engine
from hefbuild.declare.project import load_project
engine = Engine(load_project(Path(sys.argv[1]), store=Path(sys.argv[2])))
print(json.dumps(engine.run(sys.argv[3])["outcome"]))
"""


class Listener:
    """A server on the host's loopback that the sandboxed rule must not reach."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()
        self._thread.join(5)


def hostile_project(root: Path, store: Path, tmp_path: Path, port: int, marker: str) -> dict:
    (root / "rules" / "fetch.py").write_text(FETCH_RULE)
    (root / "rules" / "cpu_ort" / "export.py").write_text(HOSTILE_RULE)
    other = tmp_path / "other-project" / "build" / "m" / "export"
    other.mkdir(parents=True)
    (other / "model.onnx").write_text("someone else's")
    home = Path(os.environ.get("HOME", "/root"))
    probe = {
        "write": {"project": str(root / "models" / "pwned.toml"),
                  "home": str(home / f".hefbuild-pwned-{marker}"),
                  "store": str(store / "v1" / "results" / "pwned.json"),
                  "other_build": str(other / f"pwned-{marker}"),
                  "input": str(root / "build" / MODEL / "fetch" / "checkpoint" / "seen.json")},
        "read": {"other_project": str(other / "model.onnx"),
                 "project_toml": str(root / "models" / f"{MODEL}.toml")},
        "port": port, "marker": marker,
    }
    return probe


def run_pipeline(root: Path, store: Path, probe: dict, monkeypatch) -> dict:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_for_fetch_only")
    engine = Engine(load_project(root, store=store))
    engine.run(f"fetch:{MODEL}")
    probe_file = root / "build" / MODEL / "fetch" / "checkpoint" / "probe.json"
    # The probe rides along in fetch's output folder (read-only input of export).
    os.chmod(probe_file.parent, 0o755)
    probe_file.write_text(json.dumps(probe))
    return engine


def daemons(marker: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if marker in (p.info["cmdline"] or [])]


def test_a_hostile_rule_reaches_nothing_outside_its_stage(root, store, tmp_path, monkeypatch):
    listener = Listener()
    marker = f"hefbuild-daemon-{uuid.uuid4().hex}"
    try:
        probe = hostile_project(root, store, tmp_path, listener.port, marker)
        engine = run_pipeline(root, store, probe, monkeypatch)
        # export's inputs changed by the probe file: rebuild export with a fresh engine
        engine = Engine(load_project(root, store=store))
        assert engine.run(f"export:{MODEL}")["outcome"] == "built"
        tried = json.loads((root / "build" / MODEL / "export" / "export_report.json").read_text())
        assert listener.accepted == 0
    finally:
        listener.close()
        for pid in daemons(marker):
            psutil.Process(pid).kill()
    for name in probe["write"]:
        assert tried[name] != "WROTE", f"the rule wrote {name}: {tried}"
    for name in probe["read"]:
        assert tried[name] != "READ", f"the rule read {name}: {tried}"
    assert tried["socket"] != "CONNECTED"
    assert tried["token"] is None  # HF_TOKEN reaches fetch alone
    seen = json.loads((root / "build" / MODEL / "fetch" / "checkpoint" / "seen.json").read_text())
    assert seen["token"] == "hf_secret_for_fetch_only"
    assert_nothing_landed(root, store, probe)
    assert daemons(marker) == []  # the double-forked daemon ended with its stage
    manifest = json.loads((root / "build" / MODEL / "export" / "manifest.json").read_text())
    assert manifest["sandbox"] == "bwrap"


def assert_nothing_landed(root: Path, store: Path, probe: dict) -> None:
    for name, path in probe["write"].items():
        if name != "input":  # the rule's own input exists: it must only stay unchanged
            assert not Path(path).exists(), f"the rule wrote {name}: {path}"
    assert not list((store / "v1" / "results").glob("pwned*"))
    assert not list(root.rglob("pwned*"))
    seen = root / "build" / MODEL / "fetch" / "checkpoint" / "seen.json"
    assert "pwned" not in seen.read_text()


def test_unsandboxed_by_choice_warns_once_and_still_ends_every_process(
        root, store, tmp_path, monkeypatch):
    monkeypatch.setenv("HEFBUILD_SANDBOX", "0")
    marker = f"hefbuild-daemon-{uuid.uuid4().hex}"
    listener = Listener()
    try:
        probe = hostile_project(root, store, tmp_path, listener.port, marker)
        probe["write"] = {}  # unsandboxed it could: do not let it try
        run_pipeline(root, store, probe, monkeypatch)
        engine = Engine(load_project(root, store=store))
        assert engine.run(f"export:{MODEL}")["outcome"] == "built"
    finally:
        listener.close()
        alive = daemons(marker)
        for pid in alive:
            psutil.Process(pid).kill()
    assert alive == []  # the reaper killed the setsid double-forked daemon
    assert sum("without a sandbox" in w for w in engine.warnings) == 1
    manifest = json.loads((root / "build" / MODEL / "export" / "manifest.json").read_text())
    assert manifest["sandbox"] == "none"


@pytest.mark.skipif(platform.machine() not in TABLES, reason="no system-call table here")
def test_a_hostile_rule_holds_no_capability_and_each_escape_call_fails(
        root, store, tmp_path, monkeypatch):
    """Run as root, as CI does: bwrap started by root used to keep every capability, and a
    rule mounted the host's disk through a device node it made and wrote where it liked."""
    table = TABLES[platform.machine()]
    marker = f"hefbuild-daemon-{uuid.uuid4().hex}"
    probe = hostile_project(root, store, tmp_path, 0, marker)
    probe["syscalls"] = {**table.numbers, "x32_getpid": 0x40000000 | 39}
    probe["x32"] = table.x32_bit
    probe["secrets"] = root_only_secrets()
    (root / "rules" / "cpu_ort" / "export.py").write_text(ESCAPE_RULE)
    run_pipeline(root, store, probe, monkeypatch)
    engine = Engine(load_project(root, store=store))
    assert engine.run(f"export:{MODEL}")["outcome"] == "built"
    tried = json.loads((root / "build" / MODEL / "export" / "export_report.json").read_text())
    # One comparison, so that a failure shows every call that got through at once.
    expected = {"wrote": [], **{k: "EPERM" for k in REFUSED}, **EXPECTED_TOO, **{
        f"status.{cap}": "0000000000000000" for cap in ("CapInh", "CapPrm", "CapEff",
                                                        "CapBnd", "CapAmb")}}
    if "mknod" in table.numbers:  # x86_64 has the old call too
        expected["mknod_block"] = "EPERM"
    if table.x32_bit:  # another ABI's numbers would bypass the table: killed
        expected["x32_getpid"] = signal.SIGSYS.name
    got = {**{f"status.{k}": v for k, v in tried.pop("status").items()}, **tried,
           "wrote": sorted(v for k, v in tried.items() if k.startswith("write_"))}
    assert {k: got.get(k) for k in expected} == expected
    # Run by root, the rule's uid is root's outside: what only root may read is covered.
    secrets = {k: v for k, v in got.items() if k.startswith("secret ")}
    assert len(secrets) == len(probe["secrets"])
    assert "READ" not in secrets.values(), secrets
    assert_nothing_landed(root, store, probe)


def root_only_secrets() -> list[str]:
    """Files under /etc with content that others may not read (as root: /etc/shadow, ssh
    host keys); none when not root, where the kernel already refuses them."""
    if os.geteuid() != 0:
        return []
    found = []
    for folder, _, files in os.walk("/etc"):
        for name in files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and not st.st_mode & stat.S_IROTH and st.st_size:
                found.append(path)
    return sorted(found)[:20]


@pytest.fixture
def fresh_probe():
    """The probe of bubblewrap is cached: each test here sees its own, and leaves none."""
    probe_bwrap.cache_clear()
    yield
    probe_bwrap.cache_clear()


def fake_bwrap(folder: Path, stderr: str) -> Path:
    """A bwrap earlier on PATH that fails like the real one on a restricted machine."""
    folder.mkdir()
    script = folder / "bwrap"
    script.write_text(f"#!/bin/sh\necho '{stderr}' >&2\nexit 1\n")
    script.chmod(0o755)
    return folder


@pytest.mark.parametrize("said", [
    "bwrap: setting up uid map: Permission denied",
    "bwrap: No permissions to create new namespace, likely because the kernel does not "
    "allow non-privileged user namespaces. See <https://deb.li/bubblewrap> or "
    "<file:///usr/share/doc/bubblewrap/README.Debian.gz>.",
])
def test_where_apparmor_forbids_user_namespaces_the_error_says_so_and_names_both_fixes(
        root, store, tmp_path, monkeypatch, fresh_probe, said):
    (root / "rules" / "fetch.py").write_text(FETCH_RULE)
    fake = fake_bwrap(tmp_path / "bin", said)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(StageError) as failed:
        Engine(load_project(root, store=store)).run(f"fetch:{MODEL}")
    line = str(failed.value)
    assert "\n" not in line
    assert f"`{said}`" in line and str(fake / "bwrap") in line
    assert "AppArmor restricts unprivileged user namespaces" in line
    assert "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in line
    assert f"an AppArmor profile for {fake / 'bwrap'} that allows `userns`" in line
    assert "apt-get" not in line
    assert not (root / "build" / MODEL / "fetch").exists()


def test_without_bubblewrap_a_host_stage_refuses_to_run_unless_opted_out(
        root, store, tmp_path, monkeypatch, fresh_probe):
    (root / "rules" / "fetch.py").write_text(FETCH_RULE)
    empty = tmp_path / "no-bwrap"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(StageError, match="is not installed: apt-get install bubblewrap"):
        Engine(load_project(root, store=store)).run(f"fetch:{MODEL}")
    monkeypatch.setenv("HEFBUILD_SANDBOX", "false")
    assert Engine(load_project(root, store=store)).run(f"fetch:{MODEL}")["outcome"] == "built"


def as_nobody(argv: list[str], home: Path, pythonpath: str = "") -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "HF_HOME": str(home / "hf")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                           "--clear-groups", *argv], env=env, capture_output=True, text=True,
                          timeout=300)


def nobody_python(home: Path) -> tuple[str, str]:
    """An interpreter the unprivileged user can run hefbuild with, and its PYTHONPATH: ours,
    or, when ours links into root's home (a pyenv build), the system's of the same version
    on our packages. Skips when there is none, or bubblewrap is not theirs to use."""
    import hefbuild

    ours = [p for p in sys.path if p.endswith("site-packages")]
    ours.append(str(Path(hefbuild.__file__).parents[1]))
    # The engine starts its interpreter again (the toolchain probe): that must work too.
    check = ("import subprocess, sys; from hefbuild.execute.sandbox import bwrap_path; "
             f"assert sys.version_info[:2] == {tuple(sys.version_info[:2])}; "
             "subprocess.run([sys.executable, '-c', ''], check=True); "
             "assert bwrap_path(), 'bwrap'")
    said = ""
    for python, path in ((sys.executable, ""), ("/usr/bin/python3", os.pathsep.join(ours))):
        done = as_nobody([python, "-c", check], home, path)
        if done.returncode == 0:
            return python, path
        said = done.stderr.strip().splitlines()[-1:] or said
    pytest.skip(f"uid {NOBODY} cannot run hefbuild with bubblewrap here: {said}")


@pytest.fixture
def nobody_dir():
    """A folder the unprivileged user owns (and can reach: a tmpfs, not root's 0700 tmp)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv, to build as an unprivileged user")
    base = Path("/dev/shm")
    if not base.is_dir():
        pytest.skip("no /dev/shm")
    folder = base / f"hefbuild-nobody-{uuid.uuid4().hex}"
    folder.mkdir(mode=0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_outputs_the_rule_locked_are_still_stored_when_doit_is_not_root(nobody_dir):
    """A rule's files are its invoker's: a mode 0000 output must not stop a normal user's
    build (as root nothing shows it), nor leave a scratch folder it cannot remove."""
    root, store, home = nobody_dir / "proj", nobody_dir / "store", nobody_dir / "home"
    make_tiny_project(root)
    (root / "rules" / "fetch.py").write_text(LOCKED_RULE)
    home.mkdir()
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(nobody_dir)], check=True)
    python, pythonpath = nobody_python(home)
    done = as_nobody([python, "-c", BUILD_AS_IS, str(root), str(store), f"fetch:{MODEL}"],
                     home, pythonpath)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == "built"
    ckpt = root / "build" / MODEL / "fetch" / "checkpoint"
    assert (ckpt / "config.json").read_text() == "{}"
    assert (ckpt / "sub" / "weights.bin").read_text() == "weights"
    assert not list((store / "v1" / "tmp").glob("scratch-*"))  # work/ went with the stage


def test_every_folder_of_an_interpreters_symlink_chain_is_readable(tmp_path):
    """A venv's python -> setup-python's or a shim folder's python -> the real one: exec
    follows every hop, so each hop's folder must exist in the sandbox."""
    from hefbuild.execute.sandbox import interpreter_paths

    (tmp_path / "shim").mkdir()
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "shim" / "python").symlink_to(os.path.realpath(sys.executable))
    (tmp_path / "venv" / "bin" / "python").symlink_to(tmp_path / "shim" / "python")
    found = interpreter_paths(str(tmp_path / "venv" / "bin" / "python"))
    assert str(tmp_path / "shim") in found and str(tmp_path / "venv" / "bin") in found
