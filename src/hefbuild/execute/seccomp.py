"""The system-call filter of a host stage: classic BPF for bubblewrap's `--seccomp FD`.

bwrap loads it just before it execs the rule, so it binds the rule and everything the rule
starts, never bwrap's own setup. Refused with EPERM: the calls that rearrange mounts (old and
new mount API), make device nodes, reach into other processes (ptrace, process_vm_*), load
kernel code (kexec, modules, bpf), touch the kernel keyrings, pivot the root, join or create
a user namespace. clone3 gets ENOSYS: its flags sit behind a pointer a filter cannot read, and
ENOSYS makes glibc fall back to clone, whose flags it can. Everything else is allowed.

A syscall made through another ABI than the table's (i386 via int 0x80 on x86_64, x32, a
big-endian arm64) would bypass the numbers below, so it kills the process instead.
See https://docs.kernel.org/userspace-api/seccomp_filter.html.
"""

from __future__ import annotations

import errno
import struct
from dataclasses import dataclass

# Classic BPF opcodes (linux/bpf_common.h) and seccomp return values (linux/seccomp.h).
LD_ABS_W = 0x20  # BPF_LD | BPF_W | BPF_ABS: A = 32-bit word of seccomp_data at k
AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
RET_K = 0x06  # BPF_RET | BPF_K
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6].
NR_OFFSET, ARCH_OFFSET, ARGS_OFFSET = 0, 4, 16
S_IFMT, S_IFCHR, S_IFBLK = 0o170000, 0o020000, 0o060000
CLONE_NEWUSER = 0x10000000
X32_SYSCALL_BIT = 0x40000000

# Refused whatever their arguments.
ALWAYS = (
    "mount", "umount2", "pivot_root", "setns", "ptrace", "process_vm_readv",
    "process_vm_writev", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "bpf", "keyctl", "add_key", "request_key", "open_tree", "move_mount",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
)
DEVICE_NODES = {"mknod": 1, "mknodat": 2}  # syscall -> index of its mode argument
NEW_USERNS = {"unshare": 0, "clone": 0}  # syscall -> index of its flags argument

Instruction = tuple[int, int, int, int]  # code, jt, jf, k


@dataclass(frozen=True)
class Table:
    """The syscall numbers of one ABI, and its AUDIT_ARCH_* value."""

    arch: int
    numbers: dict[str, int]
    x32_bit: bool = False  # x86_64: numbers with this bit are the x32 ABI


_NEW_MOUNT_API = {"open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
                  "fsmount": 432, "fspick": 433, "clone3": 435, "mount_setattr": 442}
TABLES = {
    "x86_64": Table(0xC000003E, {
        "clone": 56, "ptrace": 101, "mknod": 133, "pivot_root": 155, "mount": 165,
        "umount2": 166, "init_module": 175, "delete_module": 176, "kexec_load": 246,
        "add_key": 248, "request_key": 249, "keyctl": 250, "mknodat": 259, "unshare": 272,
        "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "finit_module": 313,
        "kexec_file_load": 320, "bpf": 321, **_NEW_MOUNT_API}, x32_bit=True),
    # asm-generic numbers: arm64 has no mknod, only mknodat.
    "aarch64": Table(0xC00000B7, {
        "mknodat": 33, "umount2": 39, "mount": 40, "pivot_root": 41, "unshare": 97,
        "kexec_load": 104, "init_module": 105, "delete_module": 106, "ptrace": 117,
        "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220, "setns": 268,
        "process_vm_readv": 270, "process_vm_writev": 271, "finit_module": 273, "bpf": 280,
        "kexec_file_load": 294, **_NEW_MOUNT_API}),
}


def program(machine: str) -> list[Instruction] | None:
    """The filter for `machine` (platform.machine()), or None when we have no table for it."""
    table = TABLES.get(machine)
    if table is None:
        return None
    eperm, enosys = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS
    code: list[Instruction] = [
        (LD_ABS_W, 0, 0, ARCH_OFFSET),
        (JEQ_K, 1, 0, table.arch),
        (RET_K, 0, 0, RET_KILL_PROCESS),
        (LD_ABS_W, 0, 0, NR_OFFSET),
    ]
    if table.x32_bit:
        # nr -1 is no x32 call: the kernel answers it with ENOSYS (tracers use it to skip one).
        code += [(JGE_K, 0, 2, X32_SYSCALL_BIT), (JEQ_K, 1, 0, 0xFFFFFFFF),
                 (RET_K, 0, 0, RET_KILL_PROCESS)]
    for name in ALWAYS:
        code += _returns(table.numbers[name], eperm)
    code += _returns(table.numbers["clone3"], enosys)
    for name, arg in DEVICE_NODES.items():
        if name in table.numbers:
            code += _device_node(table.numbers[name], arg)
    for name, arg in NEW_USERNS.items():
        code += _new_userns(table.numbers[name], arg)
    return [*code, (RET_K, 0, 0, RET_ALLOW)]


def compiled(machine: str) -> bytes | None:
    """The filter as the kernel (and bwrap) read it: packed struct sock_filter, native order."""
    code = program(machine)
    return None if code is None else b"".join(struct.pack("=HBBI", *i) for i in code)


def _returns(nr: int, action: int) -> list[Instruction]:
    return [(JEQ_K, 0, 1, nr), (RET_K, 0, 0, action)]


def _arg_low(index: int) -> int:
    # The low 32 bits of a 64-bit argument: both ABIs we know are little-endian.
    return ARGS_OFFSET + 8 * index


def _device_node(nr: int, mode_arg: int) -> list[Instruction]:
    """mknod of a FIFO or a socket is fine (a rule may want one); of a device, refused."""
    return [
        (JEQ_K, 0, 6, nr),
        (LD_ABS_W, 0, 0, _arg_low(mode_arg)),
        (AND_K, 0, 0, S_IFMT),
        (JEQ_K, 2, 0, S_IFCHR),
        (JEQ_K, 1, 0, S_IFBLK),
        (RET_K, 0, 0, RET_ALLOW),
        (RET_K, 0, 0, RET_ERRNO | errno.EPERM),
    ]


def _new_userns(nr: int, flags_arg: int) -> list[Instruction]:
    """fork and threads use clone; only a new user namespace is refused."""
    return [
        (JEQ_K, 0, 4, nr),
        (LD_ABS_W, 0, 0, _arg_low(flags_arg)),
        (JSET_K, 1, 0, CLONE_NEWUSER),
        (RET_K, 0, 0, RET_ALLOW),
        (RET_K, 0, 0, RET_ERRNO | errno.EPERM),
    ]
