"""Settings of the sink (env prefix `TASKPLAT_SINK_`, plus the shared names).

Invariants: read once in `__main__` (or a test) and passed down; every default is a
production-sensible value. One write transaction holds one dataset's lock for at most
`messages_per_write` messages (received 10 at a time).
`/metrics` and `/healthz` are served only when `TASKPLAT_SINK_OPS_PORT` is set.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from taskplat.common.ops_server import OpsSettings
from taskplat.common.settings import DatabaseSettings, ServiceSettings, SqsSettings
from taskplat.common.telemetry import TelemetrySettings


class SinkSettings(ServiceSettings, DatabaseSettings, SqsSettings, TelemetrySettings, OpsSettings):
    model_config = SettingsConfigDict(
        env_prefix="TASKPLAT_SINK_",
        extra="ignore",
        frozen=True,
        case_sensitive=False,
        populate_by_name=True,
    )

    wait_time_seconds: int = Field(
        2, ge=0, le=20, description="Long-poll wait of each buffer queue's ReceiveMessage."
    )
    receive_max_messages: int = Field(
        10, ge=1, le=10, description="Messages received (and written together) per buffer queue."
    )
    messages_per_write: int = Field(
        50,
        ge=1,
        le=500,
        description="Most messages of one buffer written in one transaction: the sink keeps "
        "receiving (without waiting) while full receives come back, up to this many.",
    )
    visibility_timeout_seconds: int = Field(
        60,
        ge=5,
        le=43_200,
        description="Visibility timeout of the buffer queues: a message a sink took and did not "
        "delete (it died) is received again after this long.",
    )
    max_receive_count: int = Field(
        10,
        ge=1,
        le=1000,
        description="Receives after which SQS itself moves a message to the buffer's DLQ (a "
        "message that keeps failing without a reason the sink could name).",
    )
    discovery_interval_seconds: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="How often the sink looks for new buffered datasets (creating their queues) "
        "and reads the buffers' depth.",
    )
    concurrency: int = Field(
        8, ge=1, le=64, description="Buffer queues polled and written in parallel."
    )
    interval_seconds: float = Field(
        1.0, gt=0, le=3600, description="Wait between rounds while no buffered dataset exists."
    )
