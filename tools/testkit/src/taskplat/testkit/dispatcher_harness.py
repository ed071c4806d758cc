"""A real dispatcher served by uvicorn on a free port, for the dispatcher's tests.

Invariants: each test gets its own database and its own server; the server's clock is a FakeClock
the test moves; requests go over real HTTP, so concurrency tests hit real concurrent transactions.
The server has its own `Telemetry` (or the test's, e.g. one with an in-memory span exporter) and
reads its Postgres gauges afresh on every scrape (`metrics_cache_seconds=0` unless overridden).
The server thread runs in a copy of the caller's context, so log context the test bound (e.g. by
`configure_logging`) is on the server's log lines too.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn
from starlette.applications import Starlette

from taskplat.common.clock import FakeClock
from taskplat.common.telemetry import Telemetry
from taskplat.devstack.ports import free_port
from taskplat.devstack.waiting import wait_for
from taskplat.dispatcher.app import create_app
from taskplat.dispatcher.settings import DispatcherSettings

API_KEY = "test-api-key-0123456789"
# The queues the dispatcher tests name (POST /tasks refuses a queue missing from the registry).
TEST_QUEUES = "default,a,b,c,alpha,beta,gamma,fast-lane,ingest,mine,other,poison,q,q1,q2,q3"
WORKER_TOKEN = "test-worker-token-0123456789"


@dataclass
class Dispatcher:
    base_url: str
    clock: FakeClock
    settings: DispatcherSettings
    api: httpx.Client
    worker: httpx.Client
    anonymous: httpx.Client
    # The served Starlette app (its routes are compared with the OpenAPI document).
    app: Starlette | None = None
    telemetry: Telemetry | None = None


def make_settings(db_url: str, **overrides: object) -> DispatcherSettings:
    values: dict[str, object] = {
        "database_url": db_url,
        "api_keys": API_KEY,
        "worker_token": WORKER_TOKEN,
        "db_pool_max_size": 20,
        "metrics_cache_seconds": 0,
        "queues": TEST_QUEUES,
    }
    values.update(overrides)
    return DispatcherSettings(**values)  # type: ignore[arg-type]


@contextmanager
def serve_dispatcher(
    db_url: str, *, telemetry: Telemetry | None = None, **overrides: object
) -> Iterator[Dispatcher]:
    clock = FakeClock()
    settings = make_settings(db_url, **overrides)
    port = free_port()
    telemetry = telemetry or Telemetry("dispatcher")
    app = create_app(settings, clock=clock, telemetry=telemetry)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_config=None,
        access_log=False,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    context = contextvars.copy_context()
    thread = threading.Thread(
        target=context.run, args=(server.run,), name="dispatcher", daemon=True
    )
    thread.start()
    base_url = f"http://127.0.0.1:{port}"
    wait_for(lambda: server.started, timeout=15, what="the dispatcher to start")
    clients = [
        httpx.Client(base_url=base_url, headers=headers, timeout=30)
        for headers in (
            {"Authorization": f"Bearer {API_KEY}"},
            {"Authorization": f"Bearer {WORKER_TOKEN}"},
            {},
        )
    ]
    try:
        api, worker, anonymous = clients
        yield Dispatcher(
            base_url, clock, settings, api, worker, anonymous, app=app, telemetry=telemetry
        )
    finally:
        for client in clients:
            client.close()
        server.should_exit = True
        thread.join(timeout=15)
