"""Podman calls on the containers of an image stack once they run: their state, their health
check, and the removal of everything a stack made.

Invariants:
- Every call goes through `PODMAN` (the runc runtime); a failing call raises `DevstackError`
  naming it, unless the caller says a failure is expected (`check=False`).
- A stack's containers carry the label `STACK_LABEL=<stack id>`, and its volumes and secrets
  the name prefix `taskplat-<stack id>-`: `remove_stack` removes exactly those.
"""

from __future__ import annotations

import subprocess

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.images.podman import PODMAN, STACK_LABEL


def podman(*args: str, check: bool = True) -> int:
    """Run `podman <args>`; its exit code (DevstackError on a failure when `check`)."""
    out = subprocess.run([*PODMAN, *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise DevstackError(f"podman {' '.join(args[:2])} failed: {out.stderr.strip()}")
    return out.returncode


def state(container: str) -> str:
    """`running`, `exited`, ... as podman says, or `missing`."""
    out = subprocess.run(
        [*PODMAN, "inspect", "--format", "{{.State.Status}}", container],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or "missing"


def passes_health_check(container: str) -> bool:
    """Run the container's own health check once, as ECS runs it."""
    return podman("healthcheck", "run", container, check=False) == 0


def remove_stack(stack_id: str) -> None:
    """Every container, volume and secret of the stack `stack_id` (an earlier run killed before
    it could clean up included)."""
    label = f"label={STACK_LABEL}={stack_id}"
    ids = subprocess.run(
        [*PODMAN, "ps", "--all", "--quiet", "--filter", label], capture_output=True, text=True
    ).stdout.split()
    if ids:
        podman("rm", "--force", "--time", "0", *ids, check=False)
    prefix = f"taskplat-{stack_id}-"
    for kind in ("volume", "secret"):
        listed = subprocess.run(
            [*PODMAN, kind, "ls", "--format", "{{.Name}}"], capture_output=True, text=True
        ).stdout.split()
        mine = [name for name in listed if name.startswith(prefix)]
        if mine:
            podman(kind, "rm", *mine, check=False)
