"""A seccomp filter that takes the network away from a sandbox: only Unix sockets.

Invariants:
  * `deny_network()` sets `no_new_privs` and installs a filter, inherited by every child and
    thread and never removable, under which `socket()` of any family but `AF_UNIX` fails with
    `EACCES`, `io_uring_setup` fails (io_uring could open sockets without the `socket` call), and
    on x86-64 every x32 or 32-bit system call fails. Everything else is allowed.
  * Code that gains execution in a sandbox can then reach no host: not Postgres, not the
    instance metadata or ECS credential endpoints, not the internet.
  * Only Linux on x86-64 and arm64 is known here; elsewhere nothing is installed and the answer
    is False (the service logs it).
"""

from __future__ import annotations

import ctypes
import platform
import sys

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_EACCES = 0x00050000 | 13
_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_AF_UNIX = 1
_IO_URING_SETUP = 425
_X32_BIT = 0x40000000
# machine -> (AUDIT_ARCH_*, socket's system call number)
_ARCHES = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198), "arm64": (0xC00000B7, 198)}


class _Filter(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint32),
    )


class _Program(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter)))


def _program(arch: int, socket_nr: int) -> list[tuple[int, int, int, int]]:
    return [
        (_LD_ABS, 0, 0, 4),  # 0: seccomp_data.arch
        (_JEQ, 1, 0, arch),  # 1: our architecture: go on at 3
        (_RET, 0, 0, _RET_EACCES),  # 2: another ABI (32-bit calls on x86-64)
        (_LD_ABS, 0, 0, 0),  # 3: seccomp_data.nr
        (_JGE, 5, 0, _X32_BIT),  # 4: x32 system calls: deny (10)
        (_JEQ, 4, 0, _IO_URING_SETUP),  # 5: io_uring: deny (10)
        (_JEQ, 0, 2, socket_nr),  # 6: socket(): look at its family (7); else allow (9)
        (_LD_ABS, 0, 0, 16),  # 7: args[0], the family (low 32 bits)
        (_JEQ, 0, 1, _AF_UNIX),  # 8: AF_UNIX: allow (9); else deny (10)
        (_RET, 0, 0, _RET_ALLOW),  # 9
        (_RET, 0, 0, _RET_EACCES),  # 10
    ]


def deny_network() -> bool:
    """Install the filter in this process (and its future children); whether it is installed."""
    known = _ARCHES.get(platform.machine())
    if not sys.platform.startswith("linux") or known is None:
        return False
    instructions = _program(*known)
    table = (_Filter * len(instructions))(*(_Filter(*i) for i in instructions))
    program = _Program(len(instructions), table)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    prctl = libc.prctl
    prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong)
    return bool(prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) == 0)
