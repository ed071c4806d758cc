"""Settings of the reaper (env prefix `TASKPLAT_REAPER_`, plus the shared names).

Invariants: every default is production-sensible. With the default 1 s interval a task whose worker
died runs again within about lease TTL + 1 s + retry delay; batch sizes bound the rows one statement
locks (pruning uses moderate batches because a task's attempts, outputs and events go with it).
Pruning keeps up with completions: a batch of 500 finished tasks (with their attempts) takes about
0.1 s on 2 busy cores, so a full batch loop prunes about 4,000 tasks/s, well above a sustained
1,500 completions/s; 100 per batch managed only 1,000-2,000/s there (the fixed cost of each
`run_once` dominates).
`/metrics` and `/healthz` are served only when `TASKPLAT_REAPER_OPS_PORT` is set; traces are
exported only with `OTEL_EXPORTER_OTLP_ENDPOINT`.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from taskplat.common.ops_server import OpsSettings
from taskplat.common.settings import DatabaseSettings, ServiceSettings
from taskplat.common.telemetry import TelemetrySettings

DAY = 24 * 3600


class ReaperSettings(ServiceSettings, DatabaseSettings, TelemetrySettings, OpsSettings):
    model_config = SettingsConfigDict(
        env_prefix="TASKPLAT_REAPER_",
        extra="ignore",
        frozen=True,
        case_sensitive=False,
        populate_by_name=True,
    )

    interval_seconds: float = Field(
        1.0,
        gt=0,
        le=3600,
        description="Pause between batches when the previous one was not full.",
    )
    reap_batch_size: int = Field(
        200,
        ge=1,
        le=10_000,
        description="Running tasks timed out per batch (expired leases, then overrun deadlines).",
    )
    expire_batch_size: int = Field(
        200, ge=1, le=10_000, description="Queued/Scheduled tasks expired per batch."
    )
    prune_batch_size: int = Field(
        500, ge=1, le=10_000, description="Finished tasks deleted per batch (with their rows)."
    )
    outbox_prune_batch_size: int = Field(
        1000, ge=1, le=100_000, description="Sent outbox rows deleted per batch."
    )
    deadline_grace_seconds: float = Field(
        30.0,
        ge=0,
        description=(
            "A Running task is timed out this long after its hard deadline, even while it "
            "heartbeats (the wrapper kills it at the deadline and reports first)."
        ),
    )
    retention_seconds: float = Field(
        7 * DAY,
        gt=0,
        description="Completed, Dead and Canceled tasks are deleted this long after finishing.",
    )
    outbox_retention_seconds: float = Field(
        1 * DAY, gt=0, description="Sent outbox rows are deleted this long after sending."
    )
