"""Taskplat's Python client and the `taskplat` command.

Invariants: no server code is imported (the package depends on httpx, pydantic, click and rich
only), so a worker image or a product team's service installs it alone; `Client` and
`AsyncClient` offer the same methods; every error is a `TaskplatError`.

    from taskplat.client import Client
    with Client("http://127.0.0.1:8080", api_key="...") as taskplat:
        task = taskplat.submit("echo", config={"n": 1})
        print(taskplat.wait(task.task_id, timeout=60).status)
"""

from taskplat.client.aio import AsyncClient
from taskplat.client.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    HTTPError,
    NotFound,
    PayloadTooLarge,
    ServerError,
    TaskplatError,
    Unauthorized,
    Unreachable,
    ValidationError,
)
from taskplat.client.models import (
    BulkRetryResponse,
    QueueList,
    QueueView,
    Stats,
    TaskList,
    TaskView,
)
from taskplat.client.sync import Client

__all__ = [
    "AsyncClient",
    "BadRequest",
    "BulkRetryResponse",
    "Client",
    "Conflict",
    "Forbidden",
    "HTTPError",
    "NotFound",
    "PayloadTooLarge",
    "QueueList",
    "QueueView",
    "ServerError",
    "Stats",
    "TaskList",
    "TaskView",
    "TaskplatError",
    "Unauthorized",
    "Unreachable",
    "ValidationError",
]
