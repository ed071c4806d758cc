"""The dispatcher's Starlette application factory.

Invariants: `create_app(settings, *, pool, clock, telemetry)` builds everything from its arguments
(no module globals); the pool is opened in the lifespan and closed on shutdown, and a pool the app
makes itself prepares statements as `db_prepare_threshold` says; every route comes from
`ALL_ROUTES`, the open operational routes or the dashboard's static files under `/ui/` (which call
the public API with the key the person enters; the files themselves are open); the queues of the
`queues` setting are registered at start-up (or on first use if Postgres was down); every HTTP
request is timed (and traced when tracing is on) by `HttpTelemetryMiddleware`. The caller owns
`telemetry` (it shuts it down); without one the app makes its own from the settings. Buffered spans
are exported when the app shuts down. The LISTEN of waiting claims (`claim_waits`) runs from
start-up to shutdown.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from taskplat.common.clock import Clock, SystemClock
from taskplat.common.db.pools import make_async_pool
from taskplat.common.http_telemetry import HttpTelemetryMiddleware
from taskplat.common.telemetry import Telemetry
from taskplat.dispatcher import audit, operational
from taskplat.dispatcher.access import KeyStore
from taskplat.dispatcher.access_service import AccessService
from taskplat.dispatcher.claim_waits import QueuedListener
from taskplat.dispatcher.dags import DagService
from taskplat.dispatcher.datasets import DatasetService
from taskplat.dispatcher.errors import EXCEPTION_HANDLERS
from taskplat.dispatcher.metric_specs import CLAIMS_WAITING
from taskplat.dispatcher.openapi import build_openapi
from taskplat.dispatcher.operations import Operations, QueueRegistry
from taskplat.dispatcher.recorder import Recorder
from taskplat.dispatcher.route_guard import guarded
from taskplat.dispatcher.route_table import ALL_ROUTES, scope_of
from taskplat.dispatcher.security_headers import SecurityHeadersMiddleware
from taskplat.dispatcher.service import TaskService
from taskplat.dispatcher.settings import DispatcherSettings
from taskplat.dispatcher.state_gauges import StateGauges

Pool = AsyncConnectionPool[AsyncConnection[DictRow]]


def create_app(
    settings: DispatcherSettings,
    *,
    pool: Pool | None = None,
    clock: Clock | None = None,
    telemetry: Telemetry | None = None,
) -> Starlette:
    if pool is None:
        pool = make_async_pool(settings, application_name="taskplat-dispatcher")
        assert isinstance(pool.kwargs, dict)
        pool.kwargs["prepare_threshold"] = (
            None if settings.db_prepare_threshold < 0 else settings.db_prepare_threshold
        )
    clock = clock or SystemClock()
    telemetry = telemetry or Telemetry("dispatcher", settings.telemetry_settings())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await pool.open(wait=False)
        await registry.try_register()
        listener.start()
        try:
            yield
        finally:
            await listener.close()
            await pool.close()
            # uvicorn re-raises SIGTERM once it stopped, so code after `uvicorn.run` may never run:
            # export the spans still buffered now.
            await asyncio.to_thread(telemetry.force_flush)

    routes: list[BaseRoute] = [
        Route(spec.path, guarded(spec, scope_of(spec)), methods=[spec.method], name=spec.name)
        for spec in ALL_ROUTES
    ]
    routes += [
        Mount(
            "/ui", app=StaticFiles(packages=[("taskplat.dispatcher", "ui")], html=True), name="ui"
        ),
        Route("/healthz", operational.healthz, methods=["GET"]),
        Route("/readyz", operational.readyz, methods=["GET"]),
        Route("/metrics", operational.metrics, methods=["GET"]),
        Route("/openapi.json", operational.openapi, methods=["GET"]),
    ]
    middleware = [
        Middleware(SecurityHeadersMiddleware),
        Middleware(HttpTelemetryMiddleware, telemetry=telemetry, routes=routes),
    ]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
    recorder = Recorder(telemetry)
    registry = QueueRegistry(pool, clock, settings.queues)
    listener = QueuedListener(settings.database_url.get_secret_value())
    telemetry.observable_gauge(CLAIMS_WAITING, [listener.observe])
    app.state.settings = settings
    app.state.pool = pool
    app.state.clock = clock
    app.state.telemetry = telemetry
    app.state.recorder = recorder
    app.state.service = TaskService(
        pool, clock, settings, recorder, registry=registry, listener=listener
    )
    app.state.operations = operations = Operations(pool, clock, recorder, registry)
    app.state.refusal_throttle = audit.RefusalThrottle(settings.audit_refusals_per_minute)
    app.state.keys = keys = KeyStore(pool, settings.api_keys, settings.key_cache_seconds)
    app.state.access = AccessService(pool, clock, settings, keys, registry, operations)
    app.state.dags = DagService(pool, clock, settings, recorder, registry)
    app.state.datasets = DatasetService(pool, clock, recorder)
    app.state.gauges = StateGauges(
        telemetry,
        pool,
        clock,
        cache_seconds=settings.metrics_cache_seconds,
        worker_lost_seconds=settings.worker_lost_seconds,
    )
    app.state.openapi = build_openapi()
    return app
