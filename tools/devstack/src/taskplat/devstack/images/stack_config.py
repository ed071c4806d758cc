"""What an image stack runs: `ImageStackConfig`, and the further worker pools (`WorkerPool`) a
product team's image serves (`taskplat.devstack.images.stack` runs them).

Invariant: a config is immutable; the stack derives every container from it and the templates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# What the worker wrapper needs to run untrusted operators as another user (docs/security.md).
USER_SWITCHING_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "KILL", "SETGID", "SETUID")
EXAMPLE_WORKER_IMAGE = "localhost/taskplat-worker-example"


@dataclass(frozen=True)
class WorkerPool:
    """A further worker pool: containers `<name>-1` .. `<name>-<count>` of `image` serving the
    task queue `queue`, with `capabilities` added (e.g. USER_SWITCHING_CAPABILITIES)."""

    name: str
    image: str
    queue: str
    count: int = 1
    capabilities: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageStackConfig:
    run_dir: Path
    tag: str = "dev"
    workers: int = 2
    worker_image: str = ""  # default: localhost/taskplat-worker-base:<tag>
    worker_capabilities: tuple[str, ...] = ()  # e.g. USER_SWITCHING_CAPABILITIES
    queue: str = "default"
    pools: tuple[WorkerPool, ...] = ()
    worker_parameters: dict[str, str] = field(default_factory=dict)
    platform_parameters: dict[str, str] = field(default_factory=dict)
    healthy_timeout_seconds: float = 180.0
