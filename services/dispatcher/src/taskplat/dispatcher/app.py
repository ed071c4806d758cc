"""The dispatcher's Starlette application factory.

Invariants: `create_app(settings, *, pool, clock)` builds everything from its arguments (no module
globals); the pool is opened in the lifespan and closed on shutdown; every route comes from
`ROUTES` or the open operational routes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.routing import Route

from taskplat.common.clock import Clock, SystemClock
from taskplat.common.db.pools import make_async_pool
from taskplat.dispatcher import operational
from taskplat.dispatcher.errors import EXCEPTION_HANDLERS
from taskplat.dispatcher.openapi import build_openapi
from taskplat.dispatcher.routes import ROUTES, guarded
from taskplat.dispatcher.service import TaskService
from taskplat.dispatcher.settings import DispatcherSettings

Pool = AsyncConnectionPool[AsyncConnection[DictRow]]


def create_app(
    settings: DispatcherSettings,
    *,
    pool: Pool | None = None,
    clock: Clock | None = None,
) -> Starlette:
    pool = pool or make_async_pool(settings, application_name="taskplat-dispatcher")
    clock = clock or SystemClock()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await pool.open(wait=False)
        try:
            yield
        finally:
            await pool.close()

    routes = [
        Route(spec.path, guarded(spec), methods=[spec.method], name=spec.name) for spec in ROUTES
    ]
    routes += [
        Route("/healthz", operational.healthz, methods=["GET"]),
        Route("/readyz", operational.readyz, methods=["GET"]),
        Route("/metrics", operational.metrics, methods=["GET"]),
        Route("/openapi.json", operational.openapi, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers=EXCEPTION_HANDLERS, lifespan=lifespan)
    app.state.settings = settings
    app.state.pool = pool
    app.state.service = TaskService(pool, clock, settings)
    app.state.openapi = build_openapi()
    return app
