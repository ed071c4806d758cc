"""Settings of the dispatcher (env prefix `TASKPLAT_DISPATCHER_`, plus the shared names).

Invariants: API keys and the worker token are secrets (never printed or logged); every default is a
production-sensible value; per-operator defaults override the global task defaults.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from taskplat.common.contracts import OnExhausted
from taskplat.common.settings import (
    AttemptTokenSettings,
    CapabilityTokenSettings,
    DatabaseSettings,
    DocumentLimitSettings,
    ServiceSettings,
    WakeupHoldSettings,
    WorkerTokenSettings,
)
from taskplat.common.telemetry import TelemetrySettings
from taskplat.common.tokens.keys import TokenKeySettings, derived_key_settings, key_settings

QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class OperatorDefaults(BaseModel):
    """Task defaults of one operator; unset fields fall back to the global defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: Annotated[int, Field(ge=1, le=100)] | None = None
    max_processing_attempts: Annotated[int, Field(ge=1, le=100)] | None = None
    on_exhausted: OnExhausted | None = None
    backoff_base_seconds: Annotated[float, Field(ge=0)] | None = None
    backoff_max_seconds: Annotated[float, Field(ge=0)] | None = None
    timeout_seconds: Annotated[int, Field(ge=1)] | None = None


class DispatcherSettings(
    ServiceSettings,
    DatabaseSettings,
    WorkerTokenSettings,
    TelemetrySettings,
    AttemptTokenSettings,
    CapabilityTokenSettings,
    DocumentLimitSettings,
    WakeupHoldSettings,
):
    model_config = SettingsConfigDict(
        env_prefix="TASKPLAT_DISPATCHER_",
        extra="ignore",
        frozen=True,
        case_sensitive=False,
        populate_by_name=True,
    )

    host: str = Field("127.0.0.1", description="Address to listen on (0.0.0.0 in a container).")
    port: int = Field(8080, ge=1, le=65535, description="Port to listen on.")
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(
        validation_alias="TASKPLAT_API_KEYS",
        min_length=1,
        description="Comma-separated API keys accepted on the public routes.",
    )
    max_body_bytes: int = Field(1024 * 1024, ge=1024, description="Request body size cap (413).")
    result_max_bytes: int = Field(
        256 * 1024, ge=1, description="Size cap of a completion's `result` object (JSON bytes)."
    )
    lease_ttl_seconds: float = Field(
        30.0, gt=0, le=3600, description="Lease granted by a claim and extended by a heartbeat."
    )
    claim_max_wait_seconds: float = Field(
        20.0,
        ge=0,
        le=60,
        description="Longest a `task-claim-next` may wait for a task (`wait_seconds` above it is "
        "cut to it; 0: claim-next never waits).",
    )
    default_timeout_seconds: int = Field(
        3600, ge=1, description="Hard deadline of an attempt when the task sets no timeout."
    )
    default_max_attempts: int = Field(3, ge=1, le=100, description="Default `max_attempts`.")
    default_max_processing_attempts: int = Field(
        10,
        ge=1,
        le=100,
        description="Default `max_processing_attempts`: attempts that may end by infrastructure "
        "(a lost or drained worker) before a task is Dead.",
    )
    default_backoff_base_seconds: float = Field(1.0, ge=0, description="Default backoff base.")
    default_backoff_max_seconds: float = Field(300.0, ge=0, description="Default backoff cap.")
    operator_defaults: dict[str, OperatorDefaults] = Field(
        default_factory=dict,
        description='JSON object of per-operator defaults, e.g. {"sleep": {"max_attempts": 5}}.',
    )
    queues: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["default"],
        description="Comma-separated task queues registered at start-up (`POST /tasks` naming "
        "a queue missing from the registry answers 422).",
    )
    list_max_limit: int = Field(500, ge=1, description="Largest page of `GET /tasks`.")
    db_prepare_threshold: int = Field(
        2,
        ge=-1,
        description="Executions of a statement on a pooled connection before psycopg prepares it "
        "server-side (0: at once; -1: never, for a transaction-mode pooler such as pgbouncer "
        "that cannot keep prepared statements).",
    )
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        "auto",
        description="uvicorn's event loop: `auto` takes uvloop when it is installed, else asyncio.",
    )
    http_parser: Literal["auto", "httptools", "h11"] = Field(
        "auto",
        description="uvicorn's HTTP parser: `auto` takes httptools when it is installed, else h11.",
    )
    metrics_cache_seconds: float = Field(
        5.0,
        ge=0,
        description="How long `/metrics` reuses its Postgres-derived gauges before querying again.",
    )

    audit_refusals_per_minute: int = Field(
        60,
        ge=1,
        le=100_000,
        description="Refused calls (401/403) of audited routes written to the audit log per "
        "minute for one key name, route and status, per replica; the rest are counted and named "
        "on the next row written (`detail.suppressed`), so a flood of refused calls cannot flood "
        "the table.",
    )
    key_cache_seconds: float = Field(
        5.0,
        ge=0,
        le=300,
        description="How long a replica reuses a stored API key's lookup (its scopes, or that it "
        "is unknown): a revoked key or changed scopes take effect within this time (0: every "
        "call reads Postgres).",
    )
    worker_report_seconds: float = Field(
        10.0,
        ge=0,
        le=600,
        description="Reports of one worker written at most this often per replica (a wrapper "
        "sends its own at most every `report_interval_seconds`).",
    )
    worker_lost_seconds: float = Field(
        60.0,
        gt=0,
        le=86_400,
        description="A worker that has not reported for this long shows as `lost` in "
        "`GET /workers`.",
    )
    worker_listed_seconds: float = Field(
        900.0,
        gt=0,
        le=7 * 86_400,
        description="`GET /workers` lists the workers seen within this time; older rows are "
        "pruned.",
    )

    untrusted_operators: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated operators whose tasks run as untrusted (their claims carry "
        "a capability token) until their job says `trust` itself.",
    )

    def attempt_token_key_settings(self) -> TokenKeySettings:
        """The attempt-token keys; unset, one key derived from the worker token."""
        configured = key_settings(
            self.attempt_token_keys, self.attempt_token_active_kid, what="attempt token keys"
        )
        return configured or derived_key_settings(
            self.worker_token, kid="worker-token", purpose="taskplat-attempt-token"
        )

    def capability_token_key_settings(self) -> TokenKeySettings | None:
        """The capability-token keys; None when unset (untrusted claims then carry none)."""
        return key_settings(
            self.capability_token_keys,
            self.capability_token_active_kid,
            what="capability token keys",
        )

    def telemetry_settings(self) -> TelemetrySettings:
        """The trace export fragment of these settings (for `Telemetry("dispatcher", ...)`)."""
        return TelemetrySettings(
            otlp_endpoint=self.otlp_endpoint, trace_sample_ratio=self.trace_sample_ratio
        )

    @field_validator("queues", "untrusted_operators", mode="before")
    @classmethod
    def _split_names(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("queues")
    @classmethod
    def _queue_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not QUEUE_NAME.match(name):
                raise ValueError(f"queue name {name!r} must match {QUEUE_NAME.pattern}")
        return value

    @model_validator(mode="after")
    def _token_keys_valid(self) -> DispatcherSettings:
        self.attempt_token_key_settings()
        self.capability_token_key_settings()
        return self

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("api_keys")
    @classmethod
    def _keys_long_enough(cls, value: list[SecretStr]) -> list[SecretStr]:
        for key in value:
            if len(key.get_secret_value()) < 16:
                raise ValueError("each API key must be at least 16 characters")
        return value
