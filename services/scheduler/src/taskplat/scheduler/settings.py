"""Settings of the scheduler (env prefix `TASKPLAT_SCHEDULER_`, plus the shared names).

Invariants: every default is production-sensible; batch sizes bound the rows one statement locks,
so a batch stays short even with a large backlog. `/metrics` and `/healthz` are served only when
`TASKPLAT_SCHEDULER_OPS_PORT` is set; traces are exported only with `OTEL_EXPORTER_OTLP_ENDPOINT`.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from taskplat.common.ops_server import OpsSettings
from taskplat.common.settings import DatabaseSettings, ServiceSettings, WakeupHoldSettings
from taskplat.common.telemetry import TelemetrySettings


class SchedulerSettings(
    ServiceSettings, DatabaseSettings, TelemetrySettings, OpsSettings, WakeupHoldSettings
):
    model_config = SettingsConfigDict(
        env_prefix="TASKPLAT_SCHEDULER_",
        extra="ignore",
        frozen=True,
        case_sensitive=False,
        populate_by_name=True,
    )

    interval_seconds: float = Field(
        0.5,
        gt=0,
        le=3600,
        description="Pause between batches when the previous one was not full.",
    )
    promote_batch_size: int = Field(
        500, ge=1, le=10_000, description="Due Scheduled tasks promoted per batch."
    )
    retry_batch_size: int = Field(
        500, ge=1, le=10_000, description="Due Failed tasks re-queued per batch."
    )
    republish_batch_size: int = Field(
        200, ge=1, le=10_000, description="Unclaimed Queued tasks re-announced per batch."
    )
    schedule_batch_size: int = Field(
        100, ge=1, le=10_000, description="Jobs whose cron tick has come started per batch."
    )
    republish_busy_limit: int = Field(
        1,
        ge=0,
        le=10_000,
        description="Re-publications per requeue period for a queue with a Running task (its "
        "workers are taking its wake-ups: under a backlog a stale task is mostly still waiting "
        "its turn). An idle queue's stale tasks are all re-announced.",
    )
    requeue_after_seconds: float = Field(
        60.0,
        gt=0,
        description=(
            "A Queued task unclaimed this long gets a fresh wake-up (at most once per period)."
        ),
    )
