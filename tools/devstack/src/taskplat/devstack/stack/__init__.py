"""The local Taskplat stack: every service as a supervised process over Postgres and SQS.

`Stack(StackConfig(...))` is what `make up`, `make demo` and the end-to-end tests run.

Invariants: importing this package starts nothing; see `stack.py` for the lifecycle guarantees and
`supervisor.py` for the restart policy.
"""

from __future__ import annotations

from taskplat.devstack.stack.config import StackConfig, from_environment
from taskplat.devstack.stack.stack import Stack, StackInfo
from taskplat.devstack.stack.supervisor import ServiceSpec, Supervisor, describe_exit

__all__ = [
    "ServiceSpec",
    "Stack",
    "StackConfig",
    "StackInfo",
    "Supervisor",
    "describe_exit",
    "from_environment",
]
