"""Which OS identity runs a server that refuses to run as root.

Invariants:
- When the current effective uid is not 0, servers run as the current user: ``server_identity()``
  returns ``None`` and nothing changes identity.
- When it is 0, servers run as an existing unprivileged user (``postgres`` unless
  ``TASKPLAT_DEVSTACK_USER`` names another), with its primary group and no supplementary groups.
  Its data must then sit in directories that user can traverse; ``traversable_by`` checks that
  from the permission bits, since ``os.access`` only answers for the current user.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from taskplat.devstack.errors import DevstackError

DEFAULT_SERVER_USER = "postgres"


@dataclass(frozen=True)
class RunAs:
    """An unprivileged identity to switch to before exec."""

    name: str
    uid: int
    gid: int


def server_identity() -> RunAs | None:
    """Return the identity to drop to, or ``None`` when no switch is needed (not root)."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("TASKPLAT_DEVSTACK_USER") or DEFAULT_SERVER_USER
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise DevstackError(
            f"running as root, and the unprivileged user {name!r} does not exist: "
            "create it, set TASKPLAT_DEVSTACK_USER to another one, or run as a non-root user"
        ) from None
    if entry.pw_uid == 0:
        raise DevstackError(f"TASKPLAT_DEVSTACK_USER={name!r} is root; name an unprivileged user")
    return RunAs(name=name, uid=entry.pw_uid, gid=entry.pw_gid)


def traversable_by(path: Path, who: RunAs) -> bool:
    """Whether ``who`` can reach ``path``: every existing ancestor grants it search (x)."""
    for directory in [path, *path.parents]:
        try:
            st = directory.stat()
        except FileNotFoundError:
            continue
        if st.st_uid == who.uid:
            bit = stat.S_IXUSR
        elif st.st_gid == who.gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


def give_to(path: Path, who: RunAs | None) -> None:
    """Make ``path`` owned by ``who`` (no-op when ``who`` is None)."""
    if who is not None:
        os.chown(path, who.uid, who.gid)
