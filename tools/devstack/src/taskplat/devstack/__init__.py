"""Taskplat local stack: a private Postgres cluster and a local SQS endpoint.

Invariants:
- Everything this package starts listens on 127.0.0.1 only and sends no traffic elsewhere.
- Everything it starts runs in its own process group, and ``stop()`` ends that whole group.
- Importing the package starts nothing and needs neither pytest nor testcontainers.
"""

from __future__ import annotations

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.ports import free_port
from taskplat.devstack.postgres import PrivatePostgres, postgres_bin_dir
from taskplat.devstack.sqs import LocalSqs, ensure_localstack_venv, sqs_client

__all__ = [
    "DevstackError",
    "LocalSqs",
    "PrivatePostgres",
    "ensure_localstack_venv",
    "free_port",
    "postgres_bin_dir",
    "sqs_client",
]
