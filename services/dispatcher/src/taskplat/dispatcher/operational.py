"""Open operational routes: liveness, readiness, metrics and the OpenAPI document.

Invariants: `/healthz` answers while the process serves; `/readyz` answers 200 only when Postgres
answers a query within a short timeout, and says in `untrusted` whether this dispatcher can hand
out untrusted work (it cannot without capability keys; it stays in service for trusted work, so
that alone does not fail readiness); `/metrics` is the Prometheus text of the process's
telemetry, with the Postgres-derived gauges of `state_gauges` (a scrape still answers 200 when
Postgres is down, without those gauges).
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from taskplat.common.telemetry import PROMETHEUS_CONTENT_TYPE, Telemetry
from taskplat.dispatcher import untrusted
from taskplat.dispatcher.repository import tasks as repo

READINESS_TIMEOUT_SECONDS = 2.0


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    pool = request.app.state.pool
    try:
        async with asyncio.timeout(READINESS_TIMEOUT_SECONDS):
            async with pool.connection(timeout=READINESS_TIMEOUT_SECONDS) as conn:
                await repo.ping(conn)
    except Exception as exc:  # any failure to reach Postgres means not ready
        return JSONResponse(
            {"status": "unavailable", "reason": f"database: {type(exc).__name__}"},
            status_code=503,
        )
    return JSONResponse({"status": "ready", "untrusted": untrusted_readiness(request)})


def untrusted_readiness(request: Request) -> dict[str, object]:
    """Whether claims hand out untrusted tasks (each with its capability token)."""
    if untrusted.capability_keys_configured(request.app.state.settings):
        return {"ready": True}
    return {
        "ready": False,
        "reason": f"{untrusted.MISSING_SETTING} is not set: untrusted tasks stay Queued "
        "(claims of them answer NotClaimed MissingCapabilityKeys)",
        "setting": untrusted.MISSING_SETTING,
    }


async def metrics(request: Request) -> Response:
    """The process's metrics plus the Postgres-derived gauges (refreshed when stale)."""
    await request.app.state.gauges.refresh()
    telemetry: Telemetry = request.app.state.telemetry
    return Response(telemetry.prometheus_text(), media_type=PROMETHEUS_CONTENT_TYPE)


async def openapi(request: Request) -> Response:
    return JSONResponse(request.app.state.openapi)
