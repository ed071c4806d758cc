"""Open operational routes: liveness, readiness, metrics and the OpenAPI document.

Invariants: `/healthz` answers while the process serves; `/readyz` answers 200 only when Postgres
answers a query within a short timeout; `/metrics` is Prometheus text.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

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
    return JSONResponse({"status": "ready"})


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


async def metrics(request: Request) -> Response:
    async with request.app.state.pool.connection() as conn:
        rows = await repo.task_counts(conn)
    lines = [
        "# HELP taskplat_tasks Tasks by queue and status.",
        "# TYPE taskplat_tasks gauge",
    ]
    for row in rows:
        lines.append(
            f'taskplat_tasks{{queue="{_label(row["queue"])}",status="{row["status"]}"}} '
            f"{row['tasks']}"
        )
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


async def openapi(request: Request) -> Response:
    return JSONResponse(request.app.state.openapi)
