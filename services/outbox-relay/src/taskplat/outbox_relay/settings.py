"""Settings of the outbox relay (env prefix `TASKPLAT_RELAY_`, plus the shared names).

Invariants: read once in `__main__` (or a test) and passed down; every default is a
production-sensible value; a batch is bounded (`batch_size`), so one transaction never holds more
than `batch_size` outbox row locks. `/metrics` and `/healthz` are served only when
`TASKPLAT_RELAY_OPS_PORT` is set; traces are exported only with `OTEL_EXPORTER_OTLP_ENDPOINT`.
"""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from taskplat.common.ops_server import OpsSettings
from taskplat.common.settings import DatabaseSettings, ServiceSettings, SqsSettings
from taskplat.common.telemetry import TelemetrySettings


class RelaySettings(ServiceSettings, DatabaseSettings, SqsSettings, TelemetrySettings, OpsSettings):
    model_config = SettingsConfigDict(
        env_prefix="TASKPLAT_RELAY_",
        extra="ignore",
        frozen=True,
        case_sensitive=False,
        populate_by_name=True,
    )

    batch_size: int = Field(
        100, ge=1, le=1000, description="Outbox rows claimed (and locked) per batch."
    )
    interval_seconds: float = Field(
        1.0,
        gt=0,
        le=3600,
        description="Longest wait between batches when no NOTIFY arrives (the fallback poll).",
    )
    loops: int = Field(
        2,
        ge=1,
        le=16,
        description="Relay loops in this process, each its own batch transaction (SKIP LOCKED "
        "keeps them apart, as replicas): a new row need not wait for the batch in flight.",
    )
    send_concurrency: int = Field(
        4, ge=1, le=32, description="SendMessageBatch calls of one batch run in parallel."
    )
    skip_not_queued: bool = Field(
        True,
        description=(
            "Mark a wake-up sent without sending it when its task is no longer Queued (claimed, "
            "canceled or gone) at send time; a task still Queued always gets its message."
        ),
    )
    retry_base_seconds: float = Field(
        1.0, ge=0, description="Base of the full-jitter backoff before re-sending a failed row."
    )
    retry_max_seconds: float = Field(
        300.0, ge=0, description="Cap of the backoff before re-sending a failed row."
    )

    @model_validator(mode="after")
    def _cap_not_below_base(self) -> RelaySettings:
        if self.retry_max_seconds < self.retry_base_seconds:
            raise ValueError("retry_max_seconds must be >= retry_base_seconds")
        return self
