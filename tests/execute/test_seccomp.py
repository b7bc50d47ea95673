"""The host stages' seccomp filter: its numbers agree with the system's headers, and the
program decides as the sandbox needs, read by a small classic-BPF interpreter of our own
(the kernel's verdict on it is test_sandbox's hostile rule)."""

from __future__ import annotations

import errno
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from hefbuild.execute import sandbox, seccomp
from hefbuild.execute.seccomp import ALWAYS, TABLES, compiled, program

# The interpreter's own opcodes, from the instruction classes (linux/bpf_common.h), not the
# module's constants: a wrong constant there cannot agree with itself here.
BPF_LD, BPF_ALU, BPF_JMP, BPF_RET = 0x00, 0x04, 0x05, 0x06
BPF_W, BPF_ABS, BPF_K = 0x00, 0x20, 0x00
BPF_AND, BPF_JEQ, BPF_JGE, BPF_JSET = 0x50, 0x10, 0x30, 0x40
KILL, ALLOW = 0x80000000, 0x7FFF0000
EPERM, ENOSYS = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
I386 = 0x40000003
S_IFCHR, S_IFBLK, S_IFIFO, S_IFSOCK, S_IFREG = 0o020000, 0o060000, 0o010000, 0o140000, 0o100000
CLONE_NEWUSER, CLONE_NEWNS, SIGCHLD = 0x10000000, 0x00020000, 17
PTHREAD_CLONE = 0x003D0F00  # what glibc's pthread_create passes


def run(machine: str, nr: int, args: tuple[int, ...] = (), arch: int | None = None) -> int:
    """What the filter returns for one system call (struct seccomp_data, little-endian)."""
    arch = TABLES[machine].arch if arch is None else arch
    regs = [a & (1 << 64) - 1 for a in (args + (0,) * 6)[:6]]  # as the registers hold them
    data = struct.pack("<iIQ6Q", nr, arch, 0, *regs)
    code = decoded(machine)
    pc, acc = 0, 0
    while True:
        assert 0 <= pc < len(code), "a jump left the program"
        op, jt, jf, k = code[pc]
        if op == BPF_LD | BPF_W | BPF_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
        elif op == BPF_ALU | BPF_AND | BPF_K:
            acc &= k
        elif op in (BPF_JMP | BPF_JEQ | BPF_K, BPF_JMP | BPF_JGE | BPF_K,
                    BPF_JMP | BPF_JSET | BPF_K):
            taken = {BPF_JEQ: acc == k, BPF_JGE: acc >= k, BPF_JSET: bool(acc & k)}[op & 0xF0]
            pc += jt if taken else jf
        elif op == BPF_RET | BPF_K:
            return k
        else:
            raise AssertionError(f"opcode {op:#x} at {pc}")
        pc += 1


def decoded(machine: str) -> list[tuple[int, int, int, int]]:
    """The bytes bwrap reads, back into instructions: what we test is what it loads."""
    raw = compiled(machine)
    assert raw is not None and len(raw) % 8 == 0
    return [struct.unpack_from("=HBBI", raw, i) for i in range(0, len(raw), 8)]


@pytest.mark.parametrize("machine", sorted(TABLES))
def test_each_listed_call_is_refused_and_every_other_allowed(machine):
    numbers = TABLES[machine].numbers
    assert {name: run(machine, numbers[name]) for name in ALWAYS} == dict.fromkeys(ALWAYS, EPERM)
    assert run(machine, numbers["clone3"]) == ENOSYS
    others = set(range(512)) - set(numbers.values())
    assert {nr for nr in others if run(machine, nr) != ALLOW} == set()


@pytest.mark.parametrize("machine", sorted(TABLES))
def test_device_nodes_are_refused_but_fifos_and_sockets_are_not(machine):
    numbers = TABLES[machine].numbers
    calls = {"mknodat": lambda mode: (-100, 0, mode, 0)}
    if "mknod" in numbers:
        calls["mknod"] = lambda mode: (0, mode, 0)
    for name, args in calls.items():
        nr = numbers[name]
        assert run(machine, nr, args(S_IFBLK | 0o600)) == EPERM
        assert run(machine, nr, args(S_IFCHR | 0o666)) == EPERM
        for mode in (S_IFIFO | 0o600, S_IFSOCK | 0o600, S_IFREG | 0o644, 0):
            assert run(machine, nr, args(mode)) == ALLOW
        # The kernel reads the mode as 32 bits (a umode_t), so do we: bits above are noise.
        assert run(machine, nr, args((1 << 40) | S_IFIFO)) == ALLOW
        assert run(machine, nr, args((1 << 40) | S_IFBLK)) == EPERM
    assert run(machine, numbers["mknodat"], (S_IFBLK, S_IFBLK, 0, S_IFBLK)) == ALLOW


@pytest.mark.parametrize("machine", sorted(TABLES))
def test_only_a_new_user_namespace_is_refused_to_clone_and_unshare(machine):
    numbers = TABLES[machine].numbers
    assert run(machine, numbers["unshare"], (CLONE_NEWNS,)) == ALLOW
    assert run(machine, numbers["unshare"], (CLONE_NEWUSER | CLONE_NEWNS,)) == EPERM
    assert run(machine, numbers["clone"], (SIGCHLD,)) == ALLOW  # fork
    assert run(machine, numbers["clone"], (PTHREAD_CLONE,)) == ALLOW  # a thread
    assert run(machine, numbers["clone"], (CLONE_NEWUSER | SIGCHLD,)) == EPERM
    assert run(machine, numbers["clone"], (0, CLONE_NEWUSER)) == ALLOW  # flags are arg 0


@pytest.mark.parametrize("machine", sorted(TABLES))
def test_a_call_through_another_abi_kills_the_process(machine):
    assert run(machine, 21, arch=I386) == KILL  # i386's mount, by int 0x80
    other = next(m for m in TABLES if m != machine)
    assert run(machine, 0, arch=TABLES[other].arch) == KILL


def test_x32_numbers_on_x86_64_kill_but_minus_one_does_not():
    mount = TABLES["x86_64"].numbers["mount"]
    assert run("x86_64", 0x40000000 | mount) == KILL
    assert run("x86_64", 0x40000000 | 39) == KILL  # even an x32 getpid
    assert run("x86_64", -1) == ALLOW  # no call at all: the kernel says ENOSYS itself


def test_without_a_table_the_stage_runs_unfiltered_and_says_so_once(monkeypatch, capsys):
    assert program("riscv64") is None and compiled("riscv64") is None
    monkeypatch.setattr(sandbox.platform, "machine", lambda: "riscv64")
    sandbox._say_unfiltered.cache_clear()
    for _ in range(2):
        with sandbox.seccomp_fd() as fd:
            assert fd is None
    said = capsys.readouterr().err.splitlines()
    assert said == ["hefbuild: WARNING: no system-call table for riscv64: host stages run in "
                    "bubblewrap without a seccomp filter (still without capabilities)"]
    sandbox._say_unfiltered.cache_clear()


def test_the_fd_holds_exactly_the_compiled_filter():
    import platform

    if platform.machine() not in TABLES:
        pytest.skip("no table for this machine")
    with sandbox.seccomp_fd() as fd:
        assert fd is not None
        with open(f"/proc/self/fd/{fd}", "rb") as f:
            assert f.read() == compiled(platform.machine())


# -- against the system's headers -------------------------------------------------------

def c_values(tmp_path: Path, includes: list[str], exprs: dict[str, str],
             defines: tuple[str, ...] = ()) -> dict[str, int]:
    """What the C compiler makes of each expression (ours -> C); -1 where the expression's
    first word is a macro the headers do not define."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    lines = [*(f"#define {d}" for d in defines), *(f"#include <{h}>" for h in includes),
             "#include <stdio.h>", "int main(void) {"]
    for ours, expr in exprs.items():
        guard = expr.split()[0]
        value = f'  printf("{ours} %lld\\n", (long long)({expr}));'
        if guard.isidentifier():
            lines += [f"#ifdef {guard}", value, "#else", f'  printf("{ours} -1\\n");', "#endif"]
        else:
            lines.append(value)
    (tmp_path / "values.c").write_text("\n".join([*lines, "  return 0;", "}", ""]))
    built = subprocess.run(["gcc", "-o", str(tmp_path / "values"), str(tmp_path / "values.c")],
                           capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"the headers are not there: {built.stderr.strip().splitlines()[-1:]}")
    out = subprocess.run([str(tmp_path / "values")], capture_output=True, text=True, check=True)
    return {name: int(value) for name, value in (ln.split() for ln in out.stdout.splitlines())}


def known(values: dict[str, int], table: dict[str, int]) -> None:
    """Every number the headers define is ours; only the newest may be missing (old headers)."""
    defined = {name: v for name, v in values.items() if v != -1}
    assert defined == {name: table[name] for name in defined}
    assert set(table) - set(defined) <= {*seccomp._NEW_MOUNT_API}


def test_the_native_table_matches_sys_syscall_h(tmp_path):
    import platform

    table = TABLES.get(platform.machine())
    if table is None:
        pytest.skip(f"no table for {platform.machine()}")
    values = c_values(tmp_path, ["sys/syscall.h"], {n: f"SYS_{n}" for n in table.numbers})
    known(values, table.numbers)


def test_the_aarch64_table_matches_asm_generic_unistd_h(tmp_path):
    table = TABLES["aarch64"].numbers
    values = c_values(tmp_path, ["asm-generic/unistd.h"], {n: f"__NR_{n}" for n in table},
                      defines=("__ARCH_WANT_SYS_CLONE3",))  # arm64 wants it
    known(values, table)


def test_the_constants_match_the_kernel_headers(tmp_path):
    ours = {
        "BPF_LD | BPF_W | BPF_ABS": seccomp.LD_ABS_W,
        "BPF_ALU | BPF_AND | BPF_K": seccomp.AND_K,
        "BPF_JMP | BPF_JEQ | BPF_K": seccomp.JEQ_K,
        "BPF_JMP | BPF_JGE | BPF_K": seccomp.JGE_K,
        "BPF_JMP | BPF_JSET | BPF_K": seccomp.JSET_K,
        "BPF_RET | BPF_K": seccomp.RET_K,
        "SECCOMP_RET_KILL_PROCESS": seccomp.RET_KILL_PROCESS,
        "SECCOMP_RET_ERRNO": seccomp.RET_ERRNO,
        "SECCOMP_RET_ALLOW": seccomp.RET_ALLOW,
        "AUDIT_ARCH_X86_64": TABLES["x86_64"].arch,
        "AUDIT_ARCH_AARCH64": TABLES["aarch64"].arch,
        "CLONE_NEWUSER": seccomp.CLONE_NEWUSER,
        "S_IFMT": seccomp.S_IFMT, "S_IFCHR": seccomp.S_IFCHR, "S_IFBLK": seccomp.S_IFBLK,
        "(offsetof(struct seccomp_data, nr))": seccomp.NR_OFFSET,
        "(offsetof(struct seccomp_data, arch))": seccomp.ARCH_OFFSET,
        "(offsetof(struct seccomp_data, args))": seccomp.ARGS_OFFSET,
        "(sizeof(struct sock_filter))": 8,
    }
    headers = ["stddef.h", "sys/stat.h", "linux/filter.h", "linux/seccomp.h", "linux/audit.h",
               "linux/sched.h"]
    names = {f"c{i}": expr for i, expr in enumerate(ours)}
    values = c_values(tmp_path, headers, names)
    assert {names[k]: v for k, v in values.items()} == ours
