"""What keeps operator code away from the wrapper's secrets.

Invariants:
  * `make_non_dumpable()` runs first thing in `__main__`: with `PR_SET_DUMPABLE` 0, a process of
    the same user cannot read the wrapper's `/proc/<pid>/environ`, `mem`, `fd/` or attach to it
    (only CAP_SYS_PTRACE can).
  * `take_secrets()` runs right after the settings are read: it returns the secret variables
    (`SECRET_ENV_VARS`: the worker token, AWS keys and session token, the container credential
    URI and authorization token) and removes them from the process environment, after
    overwriting their values in place, so neither `os.environ`, the C `environ` nor the initial
    environment block that `/proc/<pid>/environ` shows still holds them. The wrapper's AWS
    clients use the returned values (`aws_session`), never the environment.
  * `OperatorIdentity.detect()` answers an identity only when the wrapper can really run a
    process as another user and still control it: root, or CAP_SETUID, CAP_SETGID, CAP_KILL,
    CAP_CHOWN and CAP_DAC_OVERRIDE (to remove what the operator wrote); that user must exist and
    be neither root nor the wrapper's own user.
  * A scratch directory (`scratch_dir`) is created per untrusted task, mode 0700, owned by the
    operator user, and removed with everything in it when the task ends.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import sys
import tempfile
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3
# Capability bits (linux/capability.h).
_CAP_CHOWN, _CAP_DAC_OVERRIDE, _CAP_KILL, _CAP_SETGID, _CAP_SETUID = 0, 1, 5, 6, 7

SECRET_ENV_VARS = frozenset(
    {
        "TASKPLAT_WORKER_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    }
)


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def make_non_dumpable() -> bool:
    """Set `PR_SET_DUMPABLE` 0 (Linux); whether the process is now non-dumpable."""
    if not sys.platform.startswith("linux"):
        return False
    prctl = _libc().prctl
    prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    return bool(prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)


def _wipe_c_environ(names: frozenset[str]) -> None:
    """Overwrite the values of `names` in the C `environ` strings (which, for variables the process
    started with, are the initial environment block `/proc/<pid>/environ` reads)."""
    if not sys.platform.startswith("linux"):
        return
    environ = ctypes.POINTER(ctypes.c_void_p).in_dll(_libc(), "environ")
    index = 0
    while environ[index]:
        address = environ[index]
        entry = ctypes.string_at(address)
        name, sep, value = entry.partition(b"=")
        if sep and name.decode(errors="replace") in names:
            ctypes.memset(address + len(name) + 1, 0, len(value))
        index += 1


def take_secrets(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Remove the secret variables from the environment (wiping them in place first) and return
    them. `environ` other than `os.environ` (tests) is only popped."""
    target = os.environ if environ is None else environ
    held = {name: target[name] for name in SECRET_ENV_VARS if name in target}
    if target is os.environ:
        _wipe_c_environ(SECRET_ENV_VARS)
    for name in held:
        target.pop(name, None)
    return held


def aws_session(held: Mapping[str, str], region: str) -> Any:
    """A boto3 session whose credentials come from `held` (the variables `take_secrets` took:
    keys, or the ECS/EKS container credential URI, or web identity), then the usual shared files
    and instance metadata; never from the (scrubbed) environment."""
    import boto3
    import botocore.credentials
    import botocore.session

    core = botocore.session.Session()
    resolver = botocore.credentials.create_credential_resolver(core)
    for method in ("env", "container-role"):
        resolver.remove(method)
    resolver.providers.insert(0, botocore.credentials.ContainerProvider(environ=dict(held)))
    resolver.providers.insert(0, botocore.credentials.EnvProvider(environ=dict(held)))
    core.register_component("credential_provider", resolver)
    return boto3.session.Session(botocore_session=core, region_name=region)


def _effective_capabilities() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def can_switch_user() -> bool:
    if os.geteuid() == 0:
        return True
    caps = _effective_capabilities()
    needed = (_CAP_CHOWN, _CAP_DAC_OVERRIDE, _CAP_KILL, _CAP_SETGID, _CAP_SETUID)
    return all(caps & (1 << bit) for bit in needed)


@dataclass(frozen=True)
class OperatorIdentity:
    """The unprivileged user untrusted operators run as."""

    name: str
    uid: int
    gid: int

    @classmethod
    def detect(cls, name: str | None) -> OperatorIdentity | None:
        """The identity of user `name`, or None when there is none or the wrapper cannot use it."""
        if not name or not sys.platform.startswith("linux") or not can_switch_user():
            return None
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return None
        if entry.pw_uid in (0, os.geteuid()):
            return None
        return cls(name, entry.pw_uid, entry.pw_gid)

    def popen_kwargs(self) -> dict[str, Any]:
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


@dataclass(frozen=True)
class Isolation:
    """How untrusted operators are separated: the user they run as (None: the wrapper cannot
    switch, they run as its own user, still behind non-dumpable and the scrubbed environment) and
    where their scratch directories go."""

    identity: OperatorIdentity | None = None
    scratch_base: Path = Path("/tmp/taskplat-scratch")


def make_scratch_dir(base: Path, identity: OperatorIdentity | None) -> Path:
    """A fresh directory for one task, private to the operator user (`remove_scratch_dir` it)."""
    base.mkdir(mode=0o711, parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="task-", dir=base))
    try:
        # Mode first: once the operator user owns it, a wrapper that is not root may no longer
        # change its mode (that needs CAP_FOWNER, which user switching does not ask for).
        os.chmod(path, 0o700)
        if identity is not None:
            os.chown(path, identity.uid, identity.gid)
    except OSError:
        remove_scratch_dir(path)
        raise
    return path


def remove_scratch_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
